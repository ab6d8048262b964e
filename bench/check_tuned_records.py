"""Check that tuned schedules compute what their kernel computes (MetaSchedule does not check).

    .venv/bin/python bench/check_tuned_records.py LOG_ROOT [--target llvm] [--min-records 4] \
        [--out FILE]

For every kernel of the log with tuning records (at least `--min-records`), its best record's
schedule and its CPU default schedule are built and run on the same seeded inputs, each output
starting as NaN so that an element a schedule never writes shows; the best record is reported
when the two differ by more than 1e-3 of the output's scale. MetaSchedule's runner only times
a candidate, so a schedule transformation that drops part of a kernel's work goes unnoticed
until the whole model is verified.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

TOLERANCE = 1e-3


def outputs(library, kernel_mod, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The kernel's written buffers after one call; each output starts as NaN."""
    import tvm

    func = kernel_mod["main"]
    arrays = [tvm.runtime.tensor(array) for array in inputs]
    for param in func.params[len(inputs):]:
        shape = [int(dim) for dim in param.ty.shape]
        arrays.append(tvm.runtime.tensor(np.full(shape, np.nan, "float32")))
    library["main"](*arrays)
    return [array.numpy() for array in arrays[len(inputs):]]


def check_kernel(kernel_mod, record, target, seed: int = 0) -> float | None:
    """Largest difference of the record's outputs from the default schedule's, relative to the
    output's scale (inf where the record leaves an element unwritten); None if either does not
    build."""
    import tvm

    from korch_tvm.cpu_schedule import default_schedule
    from korch_tvm.kernels import written_params

    schedule = tvm.s_tir.Schedule(kernel_mod)
    record.trace.apply_to_schedule(schedule, remove_postproc=False)
    reference = default_schedule(kernel_mod, target)
    try:
        tuned = tvm.compile(schedule.mod, target=target)
        default = tvm.compile(reference.mod if reference else kernel_mod, target=target)
    except Exception:  # noqa: BLE001 - a record that does not build is not ours to judge here
        return None
    func = kernel_mod["main"]
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal([int(dim) for dim in param.ty.shape]).astype("float32")
              for param in func.params[:written_params(kernel_mod).count(False)]]
    worst = 0.0
    for got, want in zip(outputs(tuned, kernel_mod, inputs), outputs(default, kernel_mod, inputs)):
        if np.isnan(got).any() and not np.isnan(want).any():
            return math.inf
        scale = float(np.nanmax(np.abs(want))) or 1.0
        worst = max(worst, float(np.nanmax(np.abs(got - want))) / scale)
    return worst


def main(argv=None) -> int:
    from default_schedule import write_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_root")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--min-records", type=int, default=4)
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args(argv)

    from korch_tvm.kernels import structural_key
    from korch_tvm.target import parse_target
    from korch_tvm.tuning_log import TuningLog

    target = parse_target(args.target)
    log = TuningLog(args.log_root, target)
    lines, checked, wrong = [], 0, 0
    for logged in log.kernels():
        record = log.best_record(logged.kernel)
        if logged.records < args.min_records or record is None:
            continue
        checked += 1
        error = check_kernel(logged.kernel, record, target)
        if error is not None and error > TOLERANCE:
            wrong += 1
            lines.append(f"kernel {structural_key(logged.kernel)}: best record "
                         f"({logged.best_seconds * 1e3:.3f} ms) differs from the default "
                         f"schedule by {error:.3g} of the output's scale")
            print(lines[-1], flush=True)
    lines.append(f"{checked} tuned kernels checked, {wrong} wrong")
    print(lines[-1])
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
