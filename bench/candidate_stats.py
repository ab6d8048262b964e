"""Candidate-kernel statistics per model: primitives, candidates, distinct kernels, subproblems.

    .venv/bin/python bench/candidate_stats.py [MODEL.onnx ...] [--markdown OUT.md]

Without arguments it takes every model in bench/models/ (see `make bench-models`) and models/.
Seconds are wall time on this machine for partitioning + enumeration, and for building every
distinct kernel (FuseTIR once per structure), with the default KorchConfig settings.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def candidate_stats(path: pathlib.Path, config) -> dict:
    from korch_tvm.backend.target import parse_target
    from korch_tvm.candidates.enumerate import enumerate_candidates
    from korch_tvm.candidates.gpu_rules import rules_for_target
    from korch_tvm.candidates.partition import partition_graph
    from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
    from korch_tvm.graph.primitive_graph import PrimitiveGraph
    from korch_tvm.kernels.fused import distinct_kernels
    from korch_tvm.lowering.fission import lower_to_primitives

    graph = PrimitiveGraph.from_module(lower_to_primitives(import_onnx(load_onnx(path))))
    rules = rules_for_target(parse_target(config.target), config.max_kernel_size)
    started = time.perf_counter()
    pieces = partition_graph(graph, config.max_subproblem_nodes)
    candidates = [c for piece in pieces for c in enumerate_candidates(graph, rules, node_subset=piece)]
    enumeration_seconds = time.perf_counter() - started
    started = time.perf_counter()
    kernels = distinct_kernels(graph, candidates)
    extraction_seconds = time.perf_counter() - started
    return {
        "model": _display_name(path),
        "primitives": len(graph.nodes),
        "candidates": len(candidates),
        "distinct_kernels": len(kernels.modules),
        "stock_groups": len(graph.stock_fusion_groups()),
        "subproblems": len(pieces),
        "largest_subproblem": max(len(piece) for piece in pieces),
        "enumeration_seconds": round(enumeration_seconds, 2),
        "extraction_seconds": round(extraction_seconds, 2),
    }


def _display_name(path: pathlib.Path) -> str:
    """bench/models/x and models/x are different models of the same name: show where from."""
    try:
        return str(path.resolve().relative_to(REPO).with_suffix(""))
    except ValueError:
        return path.stem


COLUMNS = ["model", "primitives", "candidates", "distinct_kernels", "stock_groups", "subproblems",
           "largest_subproblem", "enumeration_seconds", "extraction_seconds"]


def markdown(rows: list[dict], config) -> str:
    lines = [f"max_kernel_size {config.max_kernel_size}, max_subproblem_nodes "
             f"{config.max_subproblem_nodes}, {os.cpu_count()} cores", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=pathlib.Path)
    parser.add_argument("--markdown", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    from korch_tvm.config import KorchConfig

    config = KorchConfig()
    models = args.models or sorted((REPO / "bench" / "models").glob("*.onnx")) + \
        sorted((REPO / "models").glob("*.onnx"))
    rows = []
    for path in models:
        row = candidate_stats(path, config)
        print(" ".join(f"{k}={row[k]}" for k in COLUMNS), flush=True)
        rows.append(row)
    table = markdown(rows, config)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
