"""Reports as text: the compile summary and `korch-tvm explain` (the JSON forms are the dicts)."""

from __future__ import annotations


def summary_lines(report: dict) -> list[str]:
    """A few lines a person reads after a compile: what ran, what it cost, how close it is.

    `report` is the compile report dict (`compile_model`'s); a key it lacks leaves its line out.
    """
    path = "korch" if report.get("korch") else "stock"
    lines = [f"compiled {report.get('model')} for {report.get('target_tag')} ({path} path, "
             f"{report.get('threads')} threads) in {report.get('compile_seconds', 0):.1f} s"]
    lines += _costing_lines(report)
    lines += _layout_lines(report)
    lowering = report.get("lowering")
    if lowering:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(lowering.get("primitives_by_kind", {}).items()))
        lines.append(f"  primitives: {kinds}")
        convolutions = lowering.get("convolutions") or {}
        if any(convolutions.values()):
            lines.append(f"  convolutions with fewer taps: {convolutions.get('dead_taps_cut', 0)} "
                         f"with dead taps cut, {convolutions.get('summed_over_live_taps', 0)} "
                         "summed over their live taps")
    plan = report.get("plan")
    if plan:
        lines += _plan_lines(plan)
    elif report.get("modelled_ms") is not None:
        lines.append(f"  modelled latency (kernel costs{_calls(report)}): "
                     f"{report['modelled_ms']:.3f} ms")
    kinds = report.get("kind_ms")
    if kinds:
        lines.append("  modelled time by kernel kind: " + ", ".join(
            f"{kind} {ms:.3f} ms" for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1])
            if ms > 0))
    return lines + _outcome_lines(report)


def _costing_lines(report: dict) -> list[str]:
    """Where the kernel costs came from, and which schedules the built kernels run."""
    lines = []
    tuning = report.get("tuning")
    if tuning:
        lines.append(
            f"  kernels costed: {tuning.get('kernels', 0)} distinct; cost from the log "
            f"{tuning.get('from_log', 0)}, searched now {tuning.get('tuned', 0)}, default "
            f"schedule measured now {tuning.get('measured', 0)}, predicted only "
            f"{tuning.get('predicted', 0)}, failed {tuning.get('failed', 0)}; trials run "
            f"{tuning.get('trials_run', 0)} of budget {_budget(report)}")
    schedules = _schedule_line(report)
    if schedules:
        lines.append(schedules)
    cache = report.get("cache_state")
    if cache:
        timed_from = {"l3": "operands in the L3", "cold": "operands flushed to memory"}
        lines.append(f"  kernels timed with their {timed_from.get(cache['state'], cache['state'])}"
                     + (f" ({cache['reason']})" if cache.get("reason") else ""))
    return lines


def _layout_lines(report: dict) -> list[str]:
    """The activation layout chosen, with every layout's modelled time when several were planned."""
    layouts = report.get("layouts") or {}
    if len(layouts) > 1:
        return [f"  layout: {report.get('layout')} (modelled " + ", ".join(
            f"{layout} {_ms(entry['modelled_ms'])}" for layout, entry in layouts.items())
            + "; the counts above add up every layout)"]
    if report.get("layout"):
        return [f"  layout: {report['layout']}"]
    return []


def _calls(report: dict) -> str:
    """" + N calls x T us": the VM's time per call where the modelled latency includes it."""
    overhead, calls = report.get("call_overhead_us"), report.get("kernel_calls")
    if not overhead or calls is None:
        return ""
    return f" + {calls} calls x {overhead:.2f} us"


def _plan_lines(plan: dict) -> list[str]:
    """The Korch plan: kernels chosen, modelled time against the stock plan, storage, opaque ops."""
    lines = [
        f"  plan: {plan.get('kernels_chosen')} kernels from {plan.get('candidates')} "
        f"candidates ({plan.get('pruned', 0)} pruned), {plan.get('recomputed_primitives', 0)}"
        f" primitives recomputed; modelled {plan.get('modelled_ms', 0):.3f} ms "
        f"(kernel costs{_calls(plan)}) vs "
        f"{_ms(plan.get('stock_modelled_ms'))} for FuseOps' groups on the same costs; "
        f"solver {plan.get('solver_status')}"]
    library = [k for k in plan.get("kernels", []) if k.get("implementation", "tvm") != "tvm"]
    if library:
        modelled = sum(k["ms"] for k in library if k.get("ms") is not None)
        calls = sorted({k["implementation"] for k in library})
        lines.append(f"  library kernels: {len(library)} of {plan.get('kernels_chosen')} are "
                     f"library calls, modelled {modelled:.3f} ms ({', '.join(calls)})")
    storage = plan.get("planned_storage_mb")
    if storage:
        stock = "n/a" if storage["stock"] is None else f"{storage['stock']:.1f} MB"
        stock_workspace = ("n/a" if storage.get("stock_workspace") is None
                           else f"{storage['stock_workspace']:.2f} MB")
        lines.append(f"  activation storage: {storage['korch']:.1f} MB vs {stock} for "
                     f"FuseOps' groups, largest kernel workspace "
                     f"{storage.get('korch_workspace', 0):.2f} MB vs {stock_workspace}; "
                     f"{storage['pieces_on_stock_plan']} piece(s) moved to FuseOps' groups "
                     f"to stay within them")
    if plan.get("opaque_ops"):
        lines.append(f"  opaque ops kept as in the stock path: {', '.join(plan['opaque_ops'])}")
    substitutions = plan.get("substitutions")
    if substitutions and substitutions["found"]:
        lines.append("  " + _substitutions_line(substitutions))
    return lines


def _substitutions_line(substitutions: dict) -> str:
    """Found, chosen and saved (modelled: the plan against the best plan without each)."""
    saved = [s["saved_ms"] for s in substitutions["sites"] if s.get("saved_ms") is not None]
    by_rule: dict[str, list[int]] = {}
    for site in substitutions["sites"]:
        counts = by_rule.setdefault(site["rule"], [0, 0])
        counts[0] += 1
        counts[1] += bool(site["chosen"])
    rules = ", ".join(f"{rule} {chosen}/{found}" for rule, (found, chosen) in by_rule.items())
    return (f"substitutions: {substitutions['chosen']} of {substitutions['found']} chosen "
            f"({rules}); together they save {sum(saved):.3f} ms modelled")


def _outcome_lines(report: dict) -> list[str]:
    """What the build did: measured latency, verification, a fallback, the library written."""
    lines = []
    latency = report.get("latency_ms")
    if latency:
        lines.append(f"  measured latency: median {latency['median']:.3f} ms "
                     f"(p10 {latency['p10']:.3f}, p90 {latency['p90']:.3f})")
    verification = report.get("verification")
    if verification and "skipped" in verification:
        lines.append(f"  verification skipped: {verification['skipped']}")
    elif verification:
        state = "ok" if verification["passed"] else "FAILED"
        lines.append(f"  verification vs {verification['reference']}: {state}, max relative "
                     f"error {verification['max_rel_error']:.2e}")
    fallback = report.get("fallback")
    if fallback:
        lines.append(f"  FELL BACK to the stock plan: {fallback['reason']}")
    if report.get("output"):
        lines.append(f"  library: {report['output']}")
    return lines


def explain_lines(explanation: dict) -> list[str]:
    """`korch-tvm explain` as text: kernels, recomputation, the stock diff, the solver.

    `explanation` is the dict `explain` returns (its `kernels`, `recomputed`, `stock_diff` and
    `solver` keys are required).
    """
    lines = [f"plan for {explanation.get('model')} on {explanation.get('target_tag')} "
             f"(costs {explanation.get('costing')}): {len(explanation['kernels'])} kernels from "
             f"{explanation.get('candidates')} candidates ({explanation.get('pruned', 0)} pruned)",
             f"  modelled {_ms(explanation.get('modelled_ms'))} vs stock FuseOps "
             f"{_ms(explanation.get('stock_modelled_ms'))}"]
    if explanation.get("layout"):
        lines.append(f"  layout {explanation['layout']} (modelled " + ", ".join(
            f"{layout} {_ms(ms)}" for layout, ms in explanation.get("layouts", {}).items()) + ")")
    lines += ["", "kernels (execution order):"]
    for kernel in explanation["kernels"]:
        stock = ", a stock group" if kernel["stock_group"] else ""
        lines.append(f"  {kernel['id']:>4}  {_ms(kernel['ms']):>12}  {kernel['cost_source']}"
                     f"{stock}: primitives {_ids(kernel['primitives'])} = "
                     f"{' + '.join(kernel['ops'])}")
        if kernel.get("onnx_ops"):
            lines.append(f"        from ONNX: {'; '.join(kernel['onnx_ops'])}")
        if kernel.get("error"):
            lines.append(f"        error: {kernel['error']}")
    lines.append("")
    if explanation["recomputed"]:
        lines.append("recomputed primitives:")
        lines += [f"  {item['primitive']} ({item['op']}) in {', '.join(item['kernels'])}"
                  for item in explanation["recomputed"]]
    else:
        lines.append("recomputed primitives: none")
    diff = explanation["stock_diff"]
    lines += ["", f"vs stock FuseOps ({diff['stock_kernels']} kernels): {len(diff['same'])} "
              f"kernels the same, {len(diff['merged'])} merging stock groups, "
              f"{len(diff['part_of_stock'])} part of one, {len(diff['split'])} stock groups split"]
    lines += [f"  {item['kernel']} merges {' | '.join(_ids(g) for g in item['stock_groups'])}"
              for item in diff["merged"]]
    lines += [f"  stock group {_ids(item['stock_group'])} split over {', '.join(item['kernels'])}"
              for item in diff["split"]]
    if explanation.get("opaque_ops"):
        lines.append(f"opaque ops kept as in the stock path: {', '.join(explanation['opaque_ops'])}")
    lines += _explained_substitutions(explanation.get("substitutions"))
    lines += ["", f"solver: {explanation['solver_status']}"]
    for index, piece in enumerate(explanation["solver"]):
        gap = "n/a (no bound yet)" if piece["gap"] is None else f"{piece['gap']:.2%}"
        size = (f", {piece['columns']} columns x {piece['rows']} rows" if "columns" in piece
                else "")
        lines.append(f"  subproblem {index}: {piece['primitives']} primitives, "
                     f"{piece['candidates']} candidates{size}: {piece['status']}, gap {gap}, "
                     f"{piece['seconds']:.2f} s")
    if explanation.get("onnx_trace") is None:
        lines.append("(ONNX operators not traced for this model)")
    return lines


def _explained_substitutions(substitutions: dict | None) -> list[str]:
    """Each site: its rule, what it replaces, whether the plan uses it and what it saves."""
    if not substitutions or not substitutions["found"]:
        return ["", "substitutions: none found"]
    lines = ["", _substitutions_line(substitutions)]
    for site in substitutions["sites"]:
        if site["chosen"]:
            state = f"chosen, saves {_ms(site.get('saved_ms'))}"
        else:
            state = "not chosen" if site["offered"] else "not offered (straddles a piece cut)"
        lines.append(f"  {site['rule']} for {', '.join(site['replaces'])} "
                     f"({site['primitives']} primitives): {state}")
    return lines


def _ids(ids) -> str:
    ids = sorted(ids)
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.3f} ms"


def _schedule_line(report: dict) -> str | None:
    """What the built kernels run: a logged schedule, and of those how many a search found
    (backend/schedule_counts.py); None for a report without the counts."""
    from_log = report.get("kernels_scheduled_from_log")
    searched = report.get("kernels_with_searched_schedule")
    if from_log is None or searched is None:
        return None
    return (f"  built kernels: {from_log} scheduled from log records; {searched} planned "
            "kernels with a schedule from a tuning search (the others run a default schedule)")


def _budget(report: dict) -> str:
    per_kernel = report.get("trials_per_kernel")
    return f"{per_kernel} per kernel" if per_kernel else str(report.get("trials_budget", 0))
