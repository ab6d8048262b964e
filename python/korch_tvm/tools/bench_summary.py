"""A benchmark result for people and for files: the compile summary it keeps, the text summary,
and its JSON.

Separate from the benchmark's running parts so that a recorded result can be summarised (and
tested) without TVM or any runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping


def load_json(path: str | None):
    """The JSON file at `path`, or None when `path` is None."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path: str, value) -> None:
    """`value` as indented, key-sorted JSON at `path` (its directory made if missing)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")


def compile_summary(report: Mapping) -> dict:
    """The numbers of a compile `report` (compile_model's) the benchmark keeps (the full report
    is large)."""
    tuning = report.get("tuning", {})
    plan = report.get("plan") or {}
    summary = {
        "compile_seconds": report.get("compile_seconds"),
        "compile_wall_seconds": report.get("compile_wall_seconds"),
        "trials_run": tuning.get("trials_run", 0),
        "tuning": tuning,
        "modelled_ms": report.get("modelled_ms"),
        "stage_seconds": report.get("stage_seconds"),
        "verification": report.get("verification"),
        "kernel_calls": report.get("kernel_calls"),
        "kind_ms": report.get("kind_ms"),          # modelled, per kernel kind
        "kernel_kinds": report.get("kernel_kinds"),  # PrimFunc name -> kind, for the profile
        "layout": report.get("layout", "NCHW"),  # compiles before layouts were chosen: NCHW
        "layout_modelled_ms": {layout: entry["modelled_ms"]
                               for layout, entry in report.get("layouts", {}).items()},
        "layouts_stopped": report.get("layouts_stopped", []),  # could not win: unplanned
        "cache_state": report.get("cache_state"),  # what kernels were timed from, and why
    }
    if plan:
        gaps = [entry["gap"] for entry in plan.get("solver", []) if entry.get("gap") is not None]
        summary["plan"] = {
            "primitives": plan.get("primitives"), "candidates": plan.get("candidates"),
            "pruned": plan.get("pruned"), "kernels_chosen": plan.get("kernels_chosen"),
            "distinct_kernels": tuning.get("kernels"),
            "recomputed_primitives": plan.get("recomputed_primitives"),
            "subproblems": plan.get("subproblems"), "solver_status": plan.get("solver_status"),
            "max_gap": max(gaps) if gaps else None,
            "modelled_ms": plan.get("modelled_ms"),
            "stock_modelled_ms": plan.get("stock_modelled_ms"),
            "solver_seconds": round(sum(entry.get("seconds", 0.0)
                                        for entry in plan.get("solver", [])), 3),
        }
    for key in ("kernels_scheduled_from_log", "kernels_with_searched_schedule"):
        summary[key] = report.get(key)  # see backend/schedule_counts.py for what each counts
    return summary



def _budget_text(result: Mapping) -> str:
    per_kernel = result.get("trials_per_kernel")
    return str(result["trials_budget"]) if per_kernel is None else f"{per_kernel} per kernel"


def summary_lines(result: Mapping) -> list[str]:
    """The benchmark `result` (what `bench_model` returns) as lines of text for a terminal."""
    lat = result["latency_ms"]
    lines = [f"{result['model']} on {result['machine']['cpu']} ({result['threads']} threads), "
             f"TVM {result['tvm_version']}, trials {_budget_text(result)} per compile"]
    lines += _foreign_runtime_lines(result)
    for name, stats in lat.items():
        lines.append(f"  {name:12s} median {stats['median']:9.3f} ms  (p10 {stats['p10']:.3f}, "
                     f"p90 {stats['p90']:.3f}, n={stats['n']})")
    for name, ratio in result["ratios"].items():
        lines.append(f"  {name:24s} {ratio['ratio']:.3f}x  (paired p10 {ratio['p10']:.3f}, "
                     f"p90 {ratio['p90']:.3f}: {ratio['verdict']})")
    lines += _compile_lines(result)
    if result.get("inference_memory_mb"):
        lines.append("  inference peak memory (MB): " + ", ".join(
            f"{k} {v:.0f}" for k, v in result["inference_memory_mb"].items() if v is not None))
    return lines + _profile_lines(result)


def _foreign_runtime_lines(result: Mapping) -> list[str]:
    """ONNX Runtime's and OpenVINO's version and settings, and OpenVINO's check against ORT."""
    lines = []
    for key, label in (("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO")):
        entry = result.get(key)
        if not entry:
            continue
        ordered = sorted(entry["settings"].items(), key=lambda item: item[0] not in (
            "device", "provider"))  # first, also in a result read back from (key-sorted) JSON
        settings = ", ".join(f"{name} {value}" for name, value in ordered)
        lines.append(f"  {label} {entry['version']}: {settings}")
        check = entry.get("verification")
        if check:
            lines.append(f"    outputs vs ONNX Runtime: max relative error "
                         f"{check['max_rel_error']:.2e} (tolerance {check['tolerance']:.0e}, "
                         f"{'passed' if check['passed'] else 'FAILED'})")
    return lines


def _compile_lines(result: Mapping) -> list[str]:
    lines = []
    for path, phases in result["compile"].items():
        parts = ", ".join(f"{phase} {info['compile_seconds']:.1f} s ({info['trials_run']} "
                          f"trials, peak {info['peak_rss_mb']:.0f} MB)"
                          for phase, info in phases.items())
        lines.append(f"  compile {path}: {parts}")
        last = list(phases.values())[-1]
        if len(last.get("layout_modelled_ms") or {}) > 1:
            lines.append(f"    layout {last['layout']} (modelled " + ", ".join(
                f"{layout} {ms:.3f} ms" for layout, ms in last["layout_modelled_ms"].items())
                + ")")
    plan = result.get("korch_plan")
    if plan:
        lines.append(f"  korch plan: {plan['kernels_chosen']} kernels from {plan['candidates']} "
                     f"candidates ({plan['distinct_kernels']} distinct, {plan['pruned']} pruned), "
                     f"solver {plan['solver_status']} (max gap {plan['max_gap']}), modelled "
                     f"{plan['modelled_ms']:.3f} ms")
    return lines


def _profile_lines(result: Mapping) -> list[str]:
    lines = []
    if result.get("kind_profile_ms"):
        from .kind_profile import kind_table

        lines.append("  in-model time by kernel kind (per run):")
        lines += kind_table(result["kind_profile_ms"])
    if result.get("orchestration_ceiling"):
        lines.append(f"  orchestration ceiling {result['orchestration_ceiling']:.2f}x Korch/stock "
                     "(stock's run without its memory-bound kernels and VM builtins)")
    for path, by_kind in (result.get("in_model") or {}).get("by_kind", {}).items():
        lines.append(f"  {path} kernels, isolated -> in-model ms: " + ", ".join(
            f"{kind} {entry['isolated_ms']:.2f} -> {entry['in_model_ms']:.2f}"
            for kind, entry in sorted(by_kind.items())))
    floor = result.get("floor")
    if floor:
        lines.append(f"  floor {floor['ms']:.3f} ms ({floor['bound']}-bound); latency/floor: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in floor["latency_over_floor"].items()
                                 if v is not None))
    return lines
