"""Run `korch-tvm ARGS...` with cProfile around the layout-per-region planning alone; writes
region.prof in the working directory and prints the section's seconds."""
import cProfile
import sys
import time

import korch_tvm.pipeline.korch as korch

original = korch._plan_region_layouts


def profiled(*args, **kwargs):
    profile, started = cProfile.Profile(), time.perf_counter()
    profile.enable()
    try:
        return original(*args, **kwargs)
    finally:
        profile.disable()
        print("REGION SECONDS", time.perf_counter() - started, file=sys.stderr)
        profile.dump_stats("region.prof")


korch._plan_region_layouts = profiled
from korch_tvm.tools.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
