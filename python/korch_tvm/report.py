"""The compile report as a short text summary (the JSON form is the report dict itself)."""

from __future__ import annotations


def summary_lines(report: dict) -> list[str]:
    """A few lines a person reads after a compile: what ran, what it cost, how close it is."""
    path = "korch" if report.get("korch") else "stock"
    lines = [f"compiled {report.get('model')} for {report.get('target_tag')} ({path} path, "
             f"{report.get('threads')} threads) in {report.get('compile_seconds', 0):.1f} s"]
    tuning = report.get("tuning")
    if tuning:
        lines.append(
            f"  kernels: {tuning.get('kernels', 0)} distinct; from log {tuning.get('from_log', 0)},"
            f" tuned {tuning.get('tuned', 0)}, measured {tuning.get('measured', 0)}, predicted "
            f"{tuning.get('predicted', 0)}, failed {tuning.get('failed', 0)}; trials run "
            f"{tuning.get('trials_run', 0)} of budget {report.get('trials_budget', 0)}")
    lowering = report.get("lowering")
    if lowering:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(lowering.get("primitives_by_kind", {}).items()))
        lines.append(f"  primitives: {kinds}")
    plan = report.get("plan")
    if plan:
        lines.append(
            f"  plan: {plan.get('kernels_chosen')} kernels from {plan.get('candidates')} "
            f"candidates ({plan.get('pruned', 0)} pruned), {plan.get('recomputed_primitives', 0)}"
            f" primitives recomputed; modelled {plan.get('modelled_ms', 0):.3f} ms vs stock "
            f"{plan.get('stock_modelled_ms', 0):.3f} ms; solver {plan.get('solver_status')}")
    elif report.get("modelled_ms") is not None:
        lines.append(f"  modelled latency (sum of kernel costs): {report['modelled_ms']:.3f} ms")
    latency = report.get("latency_ms")
    if latency:
        lines.append(f"  measured latency: median {latency['median']:.3f} ms "
                     f"(p10 {latency['p10']:.3f}, p90 {latency['p90']:.3f})")
    verification = report.get("verification")
    if verification:
        state = "ok" if verification["passed"] else "FAILED"
        lines.append(f"  verification vs {verification['reference']}: {state}, max relative "
                     f"error {verification['max_rel_error']:.2e}")
    if report.get("output"):
        lines.append(f"  library: {report['output']}")
    return lines
