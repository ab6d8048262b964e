"""Does a kernel's headroom above the floor, known before tuning, say what tuning will gain?

    .venv/bin/python bench/headroom_gain.py LOG_ROOT [LOG_ROOT ...] [--min-records 8] \
        [--out bench/results/headroom-allocation/gain.txt]

For each tuning-log root (a `--tuning-logs` directory after a tuned compile or suite run): the
empirical roofline of `korch_tvm.costing.headroom` over every default-schedule record of the log,
each tuned kernel's headroom under it (a kernel counts as tuned with at least `--min-records`
records), and what tuning gained (its default time over its best). Kernels are grouped by headroom;
the trial allocation bets that the low bands gain little and the high bands much.
"""

from __future__ import annotations

import argparse
import math
import statistics

BANDS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01))


def gains_by_headroom(log_root: str, min_records: int) -> tuple[object, list[tuple[float, float]]]:
    """(roofline, [(headroom, default / best)] of each tuned kernel) of one log root."""
    from korch_tvm.costing.cost_model import kernel_shape
    from korch_tvm.costing.headroom import empirical_roofline, headroom
    from korch_tvm.costing.tuning_log import TuningLog

    log = TuningLog(log_root, "llvm")
    logged = log.kernels()
    defaults = {index: log.default_seconds(kernel.kernel) for index, kernel in enumerate(logged)}
    defaults = {index: seconds for index, seconds in defaults.items()
                if seconds is not None and math.isfinite(seconds) and seconds > 0}
    shapes = {index: kernel_shape(logged[index].kernel) for index in defaults}
    roofline = empirical_roofline(shapes, defaults)
    rows = [(headroom(defaults[index], roofline.floor_seconds(shapes[index])),
             defaults[index] / logged[index].best_seconds)
            for index in defaults
            if logged[index].records >= min_records and math.isfinite(logged[index].best_seconds)]
    return roofline, rows


def band_lines(rows: list[tuple[float, float]]) -> list[str]:
    lines = [f"  {'headroom':12s} {'kernels':>7s} {'gained >10%':>11s} {'median gain':>11s}"]
    for low, high in BANDS:
        gains = [gain for room, gain in rows if low <= room < high]
        if gains:
            lines.append(f"  [{low:.2f}, {min(high, 1.0):.2f})  {len(gains):7d} "
                         f"{sum(gain > 1.1 for gain in gains):11d} "
                         f"{statistics.median(gains):10.2f}x")
    return lines


def main(argv=None) -> int:
    from default_schedule import write_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_roots", nargs="+")
    parser.add_argument("--min-records", type=int, default=8)
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    lines = []
    for root in args.log_roots:
        roofline, rows = gains_by_headroom(root, args.min_records)
        block = [f"{root}: {len(rows)} tuned kernels; roofline "
                 f"{roofline.flops_per_second / 1e9:.0f} GFLOP/s (multiply-adds), "
                 f"{roofline.bytes_per_second / 1e9:.0f} GB/s, "
                 f"{roofline.least_seconds * 1e6:.1f} us per call at least",
                 *band_lines(rows)]
        print("\n".join(block), flush=True)
        lines += block
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
