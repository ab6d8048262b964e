"""Where a larger settle gap would have ended the lazy rounds of logged cold compiles.

    .venv/bin/python bench/results/compile-time/settle-gap/scripts/settle_gap.py GAP [GAP ...]

Reads every compile log under bench/results/ (the `-v` output of `korch-tvm compile`, or a
zoo pass's log), takes each sequence of lazy-costing rounds (`costing/lazy.py` logs, per round,
the optimistic plan and how far above it the plan of measured kernels models), and for each
GAP finds the first round at which that plan was within GAP of the optimistic one: the
kernels the later rounds measured would not have been measured, and the plan kept would have
been that round's plan of measured kernels instead of the last one. Prints one line per
sequence the gap would have cut, then a summary per gap.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import sys

ROUND = re.compile(r"round (\d+): measuring (\d+) kernels.*?models ([\d.]+) % above the "
                   r"optimistic ([\d.]+) ms")
SETTLED = re.compile(r"round (\d+): the plan of measured kernels \(([\d.]+) ms\) is within")


def sequences(path: str) -> list[list[tuple[int, float, float]]]:
    """Per sequence of rounds: (kernels measured, plan of measured kernels ms, gap %)."""
    found, current = [], []
    with open(path, errors="replace") as lines:
        for line in lines:
            match = ROUND.search(line)
            if match:
                if match.group(1) == "1" and current:
                    found.append(current)
                    current = []
                optimistic, above = float(match.group(4)), float(match.group(3))
                current.append((int(match.group(2)), optimistic * (1 + above / 100), above))
                continue
            match = SETTLED.search(line)
            if match and match.group(1) != "1":  # round 1 settled: a check, nothing measured
                current.append((0, float(match.group(2)), 0.0))
                found.append(current)
                current = []
    return [rounds for rounds in found + [current] if len(rounds) > 1]


def main(gaps: list[float]) -> None:
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    logs = sorted(glob.glob(os.path.join(root, "**", "*.log"), recursive=True))
    runs = [(os.path.relpath(path, root), rounds) for path in logs for rounds in sequences(path)]
    print(f"{len(runs)} sequences of lazy rounds in {len(logs)} logs; "
          f"{sum(k for _, r in runs for k, _, _ in r)} kernels measured in them")
    for gap in gaps:
        saved, losses = 0, []
        for name, rounds in runs:
            final = rounds[-1][1]
            stop = next((i for i, (_, _, above) in enumerate(rounds) if above <= gap * 100),
                        len(rounds) - 1)
            losses.append(rounds[stop][1] / final - 1)
            if stop < len(rounds) - 1:
                cut = sum(kernels for kernels, _, _ in rounds[stop:])
                saved += cut
                print(f"  gap {gap:.0%}: {name}: stops at round {stop + 1} of {len(rounds)}, "
                      f"{cut} kernels fewer, plan +{losses[-1]:.2%}")
        print(f"gap {gap:.0%}: {saved} kernels fewer; plan of measured kernels above the last "
              f"round's by {statistics.mean(losses):.2%} on average, at most {max(losses):.2%}, "
              f"over 1 % in {sum(loss > 0.01 for loss in losses)} of {len(losses)}")


if __name__ == "__main__":
    main([float(arg) for arg in sys.argv[1:]] or [0.01, 0.02, 0.03, 0.05])
