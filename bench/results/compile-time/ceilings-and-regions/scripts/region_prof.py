import cProfile, pstats, sys, time
import korch_tvm.pipeline.korch as K
orig = K._plan_region_layouts
def wrapped(*a, **k):
    p = cProfile.Profile(); t = time.perf_counter()
    p.enable()
    try:
        return orig(*a, **k)
    finally:
        p.disable(); print("REGION SECONDS", time.perf_counter() - t, file=sys.stderr)
        p.dump_stats("/tmp/prof/region.prof")
K._plan_region_layouts = wrapped
from korch_tvm.tools.cli import main
sys.exit(main(sys.argv[1:]))
