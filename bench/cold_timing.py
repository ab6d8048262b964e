"""How a kernel's isolated timing depends on the runner's protocol, against a model-like run.

    .venv/bin/python bench/cold_timing.py [--threads 2] \
        [--out bench/results/cold-timing/kernels.txt]

The profiler's runner flushes the CPU caches (all arguments but the first) and TVM's time
evaluator does so once per *sample*, then times `number` calls back to back. Each kernel of
bench/default_schedule.py, in each form of `schedule_variants.default_schedules` (the rule, up to
16 tile rows, the vector's outer loop outermost), is timed four ways, median of 5 timings each:

  warm          10 calls per sample, no flush
  1 cold+2 warm the runner before 2026-12-01: 3 calls per sample, one flush per sample
  cold          the runner now: 1 call per sample, 3 samples, a flush before each
  after traffic each call after 64 MB of other memory traffic, as inside a model whose other
                kernels have evicted this one's weights (median of 9 calls)

The last column is what the solver should be told; the closer protocol wins.
"""

from __future__ import annotations

import statistics
import time

PROTOCOLS = {"1 cold+2 warm": (3, 1), "cold": (1, 3)}


def timings(library, args, traffic) -> dict[str, float]:
    """Milliseconds per call of `library` on `args` under each protocol (see the docstring)."""
    import tvm

    device = tvm.cpu()
    result = {"warm": library.time_evaluator("main", device, number=10, repeat=3)(*args).mean}
    for label, (number, repeat) in PROTOCOLS.items():
        timer = library.time_evaluator("main", device, number=number, repeat=repeat,
                                       f_preproc="cache_flush_cpu_non_first_arg")
        result[label] = statistics.median(timer(*args).mean for _ in range(5))
    function, after = library["main"], []
    for _ in range(9):
        traffic += 1.0  # reads and writes every byte of the 64 MB buffer
        start = time.perf_counter()
        function(*args)
        after.append(time.perf_counter() - start)
    result["after traffic"] = statistics.median(after)
    return {label: seconds * 1e3 for label, seconds in result.items()}


def main(argv=None) -> int:
    from default_schedule import arguments, kernels, write_table

    args = arguments(__doc__, argv)  # before TVM starts its thread pool
    import numpy as np
    import tvm

    from korch_tvm.backend.cpu_schedule import WIDE_TILE_ROWS, default_schedule
    from korch_tvm.backend.target import parse_target

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    forms = {"rule": {}, "16 rows": {"tile_rows": WIDE_TILE_ROWS},
             "vec out": {"vector_outer": True}}
    traffic = np.ones(64 * 2**20 // 4, dtype="float32")
    rng = np.random.default_rng(0)
    columns = ["warm", *PROTOCOLS, "after traffic"]
    lines = [f"{'kernel':46s} {'schedule':8s} " + " ".join(f"{c:>13s}" for c in columns)
             + "   (ms per call; target " + str(target) + ")"]
    for name, mod in kernels().items():
        inputs = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype(
            str(p.ty.dtype))) for p in mod["main"].params]
        for label, options in forms.items():
            schedule = default_schedule(mod, target, **options)
            library = tvm.compile(schedule.mod, target=target).mod
            row = timings(library, inputs, traffic)
            lines.append(f"{name:46s} {label:8s} " + " ".join(f"{row[c]:13.3f}" for c in columns))
            print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
