"""Two zoo passes side by side, model by model: what changed between two codes or two days.

    .venv/bin/python bench/compare_passes.py OLD_DIR NEW_DIR

Each directory holds a pass's per-model JSONs (`bench/run_zoo.py --out X` writes them to
X/zoo-<budget>/). For every model of NEW that OLD also has: Korch's memory-bound kernels in
the running model and its median, modelled over measured, Korch over stock, ONNX Runtime and
OpenVINO (the new ratio's p10-p90 after it), candidates and cold compile seconds, old then new;
then the geomeans of the three ratios. A model NEW timed but failed to verify is listed as
failed and left out of the geomeans.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

ENGINES = ("stock", "onnxruntime", "openvino")


def ratio(row: dict, engine: str) -> float:
    return row["ratios"][f"korch_vs_{engine}"]["ratio"]


def columns(old: dict, new: dict) -> list[str]:
    """The cells of one model: each quantity old then new."""
    def pair(read, digits=2):
        return " ".join(f"{read(row):.{digits}f}" for row in (old, new))

    cells = [pair(lambda row: row["kind_profile_ms"]["korch"]["memory"]),
             pair(lambda row: row["latency_ms"]["korch"]["median"]),
             pair(lambda row: row["korch_plan"]["modelled_ms"] / row["latency_ms"]["korch"]
                  ["median"])]
    for engine in ENGINES:
        spread = new["ratios"][f"korch_vs_{engine}"]
        cells.append(f"{pair(lambda row: ratio(row, engine))} "
                     f"({spread['p10']:.2f}-{spread['p90']:.2f})")
    cells.append(pair(lambda row: row["korch_plan"]["candidates"], 0))
    cells.append(pair(lambda row: row["compile"]["korch"]["cold"]["compile_seconds"], 0))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    args = parser.parse_args()
    print(f"{'model':24s} | memory ms   | Korch ms    | mod/meas  | k/stock (p10-p90)    "
          "| k/ort (p10-p90)      | k/ov (p10-p90)       | candidates | compile s")
    logs = {engine: [] for engine in ENGINES}
    for path in sorted(glob.glob(os.path.join(args.new, "*.json"))):
        name = os.path.basename(path)[:-5]
        if name.endswith(".failed"):
            reason = json.load(open(path))["reason"]
            print(f"{name[:-len('.failed')]:24s} | failed: {reason[:100]}")
            continue
        if (os.path.exists(os.path.join(args.new, f"{name}.failed.json"))
                or not os.path.exists(os.path.join(args.old, f"{name}.json"))):
            continue  # a row of its own above, or nothing to compare with
        new = json.load(open(path))
        old = json.load(open(os.path.join(args.old, f"{name}.json")))
        print(f"{name:24s} | " + " | ".join(columns(old, new)))
        for engine in ENGINES:
            logs[engine].append((math.log(ratio(old, engine)), math.log(ratio(new, engine))))
    for engine, pairs in logs.items():
        old, new = (math.exp(sum(pair[i] for pair in pairs) / len(pairs)) for i in (0, 1))
        print(f"geomean Korch/{engine} over {len(pairs)}: {old:.3f} -> {new:.3f}")


if __name__ == "__main__":
    main()
