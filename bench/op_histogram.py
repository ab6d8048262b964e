#!/usr/bin/env python3
"""Print the ONNX operator histogram (node counts by op_type) of each model.

    python bench/op_histogram.py                  # every .onnx in bench/models/ and models/
    python bench/op_histogram.py a.onnx b.onnx    # these files
    python bench/op_histogram.py --table          # also one markdown table, ops x models

Needs only the `onnx` package (the project's own venv has it). Nodes inside subgraphs (If/Loop
bodies) are counted too. Weights are not loaded (external data is never needed).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
DEFAULT_DIRS = [HERE / "models", HERE.parent / "models"]


def count_ops(graph: onnx.GraphProto, counter: Counter | None = None) -> Counter:
    counter = Counter() if counter is None else counter
    for node in graph.node:
        counter[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count_ops(attr.g, counter)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    count_ops(g, counter)
    return counter


def label(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path, help="ONNX files (default: bench/models/*.onnx "
                    "and models/*.onnx)")
    ap.add_argument("--table", action="store_true", help="also print a markdown table")
    args = ap.parse_args(argv)

    paths = args.paths or [p for d in DEFAULT_DIRS if d.is_dir() for p in sorted(d.glob("*.onnx"))]
    if not paths:
        print("no ONNX files found (run `make -C bench models` first)", file=sys.stderr)
        return 1

    hists = {}
    for p in paths:
        model = onnx.load(str(p), load_external_data=False)
        ops = count_ops(model.graph)
        hists[label(p)] = ops
        print(f"{label(p)}: {sum(ops.values())} nodes, {len(ops)} op types "
              f"(opset {max((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), default='?')})")
        print("    " + ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))))

    if args.table:
        names = list(hists)
        total = Counter()
        for h in hists.values():
            total.update(h)
        short = [Path(n).stem + (" (demo)" if n.startswith("models/") else "") for n in names]
        print()
        print("| op | " + " | ".join(short) + " |")
        print("|---|" + "---:|" * len(names))
        for op, _ in sorted(total.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"| {op} | " + " | ".join(str(hists[n].get(op, "")) for n in names) + " |")
        print("| **nodes** | " + " | ".join(str(sum(hists[n].values())) for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
