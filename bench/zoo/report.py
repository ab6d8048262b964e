"""The zoo's aggregate: geomeans over the rows that ran, a markdown table and a ratio plot.

Runs in the project's venv (bench/run_zoo.py); the only third-party import is matplotlib, for
the plot, and only inside `plot`.
"""

from __future__ import annotations

import math
import os
import time

# A 1-minute load average above this (on the zoo's 2 cores) means other jobs shared the machine.
LOADED = 2.5
_RATIO_NOISE = ("each ratio is followed by the p10-p90 of its paired per-round ratios, and a "
                "ratio whose p10-p90 spans 1 is marked '≈'.")


def loaded(rows: list[dict]) -> bool:
    """Whether any model's recorded load (before or after) says the machine was shared."""
    return any(value is not None and value > LOADED
               for row in rows for value in (row.get("load") or []))


def noise_note(rows: list[dict]) -> str:
    """What the load column says about the timings, and how noise is shown."""
    loads = [value for row in rows for value in (row.get("load") or []) if value is not None]
    span = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "not recorded"
    if loaded(rows):
        return ("Timings come from a shared 2-core machine (other jobs ran beside these runs; "
                f"1-minute load average {span}, per model in the load column), so every number "
                "is noisy: " + _RATIO_NOISE)
    return ("The machine was otherwise near idle (1-minute load average "
            f"{span}, per model in the load column); timings still vary from round to round: "
            + _RATIO_NOISE)


def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], budget: int, code: dict, note: str = "") -> dict:
    """The aggregate JSON: rows in zoo order, geomeans over the rows that ran."""
    ran = [row for row in rows if row["status"] == "ok"]
    first = ran[0] if ran else {}
    return {
        "budget_trials_per_compile": budget,
        "aggregated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "code": code,
        "note": note,
        "noise": noise_note(rows),
        "dates": sorted({row["date"] for row in ran}),
        "code_benched": sorted({(row.get("code") or {}).get("source", "unknown")
                                for row in rows if row["status"] in ("ok", "failed")}),
        "machine": first.get("machine"), "target_tag": first.get("target_tag"),
        "threads": first.get("threads"), "versions": first.get("versions"),
        "counts": {status: sum(row["status"] == status for row in rows)
                   for status in sorted({row["status"] for row in rows})},
        "geomean": {key: geomean(row.get(key) for row in ran)
                    for key in ("korch_vs_stock", "korch_vs_ort", "korch_vs_openvino")},
        # the target: modelled within 20 % of measured (a placeholder cost never is)
        "modelled_within_20_percent": sum(
            abs((row.get("modelled_over_measured") or math.inf) - 1.0) <= 0.2 for row in ran),
        "lowest_korch_vs_ort": min((row["korch_vs_ort"] for row in ran
                                    if row.get("korch_vs_ort")), default=None),
        "lowest": {key: lowest(ran, key) for key in ("korch_vs_ort", "korch_vs_openvino")},
        "timed_libraries": sorted({row.get("timed_libraries") or "warm" for row in ran}),
        "targets": targets(ran, budget),
        "models": rows,
    }


def lowest(ran: list[dict], key: str, count: int = 3) -> list[list]:
    """The `count` models with the lowest `key` ratio, [[model, ratio], ...]."""
    rated = sorted((row[key], row["model"]) for row in ran if row.get(key))
    return [[model, round(ratio, 3)] for ratio, model in rated[:count]]


def targets(ran: list[dict], budget: int) -> list[dict]:
    """Issue #30's targets for this budget: each with the measured value and met or not."""
    if not ran:
        return []
    if budget != 0:
        return tuned_targets(ran)
    off = [row for row in ran
           if abs((row.get("modelled_over_measured") or math.inf) - 1.0) > 0.2]
    compiles = [row["compile_cold_s"]["korch"] for row in ran
                if (row.get("compile_cold_s") or {}).get("korch") is not None]
    slow = [row["model"] for row in ran
            if ((row.get("compile_cold_s") or {}).get("korch") or 0) > 120]
    return [
        _geomean_target(ran, "korch_vs_ort", 1.0, "ONNX Runtime", "not measured"),
        _floor_target(ran, "korch_vs_ort", 0.8, "ONNX Runtime"),
        _geomean_target(ran, "korch_vs_openvino", 0.9, "OpenVINO", "not timed"),
        {"target": "modelled latency within 20 % of measured on every model",
         "value": len(ran) - len(off), "met": not off,
         "gap": f"{len(ran) - len(off)} of {len(ran)} within; off: " + ", ".join(
             f"{row['model']} {_num(row.get('modelled_over_measured'), 2, 'x')}" for row in off)
         if off else f"all {len(ran)} within"},
        {"target": "Korch compile at 0 trials <= 120 s per model (cold, fresh log)",
         "value": max(compiles, default=None), "met": not slow,
         "gap": f"{len(slow)} of {len(ran)} over (max {_num(max(compiles, default=None), 0)} s, "
                f"median {_num(sorted(compiles)[len(compiles) // 2] if compiles else None, 0)} "
                f"s{'; on a shared, loaded machine' if loaded(ran) else ''})" if slow
                else "all within"},
    ]


def tuned_targets(ran: list[dict]) -> list[dict]:
    """Issue #30's targets with at most 20 minutes of tuning per model."""
    return [_geomean_target(ran, "korch_vs_openvino", 1.15, "OpenVINO", "not timed"),
            _floor_target(ran, "korch_vs_openvino", 0.9, "OpenVINO")]


def _geomean_target(ran: list[dict], key: str, bar: float, engine: str, missing: str) -> dict:
    """"Korch >= `bar`x `engine`, geomean" over the rows' `key` ratios."""
    value = geomean(row.get(key) for row in ran)
    return {"target": f"Korch >= {bar}x {engine}, geomean", "value": value,
            "met": value is not None and value >= bar,
            "gap": missing if value is None else f"{value:.2f}x, "
            f"{(bar - value) / bar * 100:.0f} % short" if value < bar else f"{value:.2f}x"}


def _floor_target(ran: list[dict], key: str, floor: float, engine: str) -> dict:
    """"no model below `floor`x `engine`" over the rows' `key` ratios."""
    below = sorted(row["model"] for row in ran if (row.get(key) or 0) < floor)
    worst = min((row[key] for row in ran if row.get(key)), default=None)
    return {"target": f"no model below {floor}x {engine}", "value": worst, "met": not below,
            "gap": f"{len(below)} of {len(ran)} below (lowest {_num(worst, 2, 'x')}): "
                   f"{', '.join(below)}" if below else "none below"}


def _num(value, digits=2, suffix="") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _modelled(row: dict) -> str:
    """Korch's modelled ms and its ratio to the measured; 'inf' shows a plan whose objective
    kept a failed measurement's placeholder cost."""
    value = row["korch_modelled_ms"]
    if isinstance(value, float) and math.isinf(value):
        return "inf (a cost was never measured)"
    return f"{_num(value, 2)} ({_num(row['modelled_over_measured'], 2)}×)"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (a '|' would end the cell)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _sci(value) -> str:
    return "–" if value is None else f"{value:.1e}"


def _ratio(row: dict, key: str, verdict: str) -> str:
    value = row.get(key)
    if value is None:
        return "–"
    text = ("≈" if row["verdicts"].get(verdict) == "within noise" else "") + f"{value:.2f}×"
    spread = (row.get("paired_p10_p90") or {}).get(verdict)
    if spread and None not in spread:
        text += f" ({spread[0]:.2f}–{spread[1]:.2f})"
    return text


def _library(row: dict) -> str:
    use = row.get("library") or {}
    if use.get("library_kernels") is None:
        return "–"
    missing = " (extension unavailable)" if use.get("unavailable") else ""
    return f"{use['library_kernels']} of {use.get('kernels')}{missing}"


def _load_cell(row: dict) -> str:
    load = row.get("load") or [None, None]
    return f"{_num(load[0], 1)} / {_num(load[1], 1)}"


def _line(row: dict) -> str:
    head = f"| {row['model']} | {row['category']} | {row['status']} "
    if row["status"] != "ok":
        return (head + "| " + " | ".join(["–"] * 11) + f" | {_load_cell(row)} "
                f"| {_cell(row.get('reason') or '')} |")
    cold, warm = row["compile_cold_s"], row["compile_warm_s"]
    rewarm = "" if warm.get("korch") is None else \
        f" (warm {_num(warm['stock'], 0)} / {_num(warm['korch'], 0)})"
    return head + (
        f"| {_num(cold['stock'], 0)} / {_num(cold['korch'], 0)}{rewarm} "
        f"| {_num(row['stock_ms'], 2)} | {_num(row['korch_ms'], 2)} "
        f"| {_num(row['ort_ms'], 2)} | {_num(row['openvino_ms'], 2)} "
        f"| {_ratio(row, 'korch_vs_stock', 'stock')} | {_ratio(row, 'korch_vs_ort', 'ort')} "
        f"| {_ratio(row, 'korch_vs_openvino', 'openvino')} "
        f"| {_modelled(row)} "
        f"| {_sci(row['verification_rel_error'])} | {_library(row)} "
        f"| {_load_cell(row)} | |")


def markdown(summary: dict) -> str:
    machine = summary.get("machine") or {}
    versions = summary.get("versions") or {}
    code = summary.get("code") or {}
    geo = summary["geomean"]
    ran = [row for row in summary["models"] if row["status"] == "ok"]
    out = [f"# Model zoo, {summary['budget_trials_per_compile']} trials per compile",
           "",
           f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; target "
           f"`{summary.get('target_tag')}`, {summary.get('threads')} threads; TVM "
           f"{versions.get('tvm')}, ONNX Runtime {versions.get('onnxruntime')}, OpenVINO "
           f"{versions.get('openvino') or 'not timed by this korch-tvm bench'}. Code benched: "
           f"{'; '.join(summary['code_benched']) or '–'} (HEAD when aggregated: "
           f"{code.get('head_when_aggregated')}). Runs: "
           f"{', '.join(summary['dates']) or 'none'}; aggregated {summary['aggregated']}. "
           "Each model: its own fresh tuning log, " + _protocol(summary) + ", timed "
           "interleaved in one process with ONNX Runtime and OpenVINO (bench/run_zoo.py).",
           "", summary["noise"], ""]
    if summary.get("note"):
        out += [summary["note"], ""]
    out += ["| model | category | status | compile s cold, stock / Korch | stock ms | Korch ms "
            "| ORT ms | OpenVINO ms | Korch/stock | Korch/ORT | Korch/OpenVINO "
            "| Korch modelled ms (/ measured) | verify rel err | Korch library kernels "
            "| load before / after | reason |", "|" + "---|" * 16]
    out += [_line(row) for row in summary["models"]]
    counts = ", ".join(f"{n} {status}" for status, n in summary["counts"].items())
    out += ["", f"Rows: {counts}. Geomean over the rows that ran: Korch/stock "
            f"**{_num(geo['korch_vs_stock'], 2, '×')}**, Korch/ORT "
            f"**{_num(geo['korch_vs_ort'], 2, '×')}** (lowest "
            f"{_num(summary['lowest_korch_vs_ort'], 2, '×')}), Korch/OpenVINO "
            f"**{_num(geo['korch_vs_openvino'], 2, '×')}**; Korch's modelled latency within 20 % "
            f"of its measured on {summary['modelled_within_20_percent']} of {len(ran)}. Ratios are speed-ups (> 1: "
            "Korch faster), from medians of paired per-round ratios. Lowest Korch/ORT: "
            f"{_lowest(summary, 'korch_vs_ort')}; lowest Korch/OpenVINO: "
            f"{_lowest(summary, 'korch_vs_openvino')}.", ""]
    if summary.get("targets"):
        out += [f"Issue #30's {summary['budget_trials_per_compile']}-trial targets, over the "
                f"{len(ran)} rows that ran:", ""]
        out += [f"- {entry['target']}: **{'met' if entry['met'] else 'missed'}** "
                f"({entry['gap']})" for entry in summary["targets"]]
        if summary["budget_trials_per_compile"] == 0:
            out += ["- the tuned targets (<= 20 min per model: >= 1.15x OpenVINO geomean, "
                    "none below 0.9x) are not measured by a 0-trial pass.", ""]
        else:
            out += ["- Korch's cold compile, seconds of measurement and tuning (of its whole "
                    "compile), against the budget of each compile's costing: " + "; ".join(
                        f"{row['model']} {_num(row.get('costing_s_cold'), 0)} "
                        f"({_num((row.get('compile_cold_s') or {}).get('korch'), 0)}) of "
                        f"{_num(row.get('time_budget_s'), 0)}" for row in ran)
                    + "; the stock compile before it, into the same log, had the same budget", ""]
    return "\n".join(out) + "\n"


def _lowest(summary: dict, key: str) -> str:
    pairs = (summary.get("lowest") or {}).get(key) or []
    return ", ".join(f"{model} {ratio:.2f}×" for model, ratio in pairs) or "–"


def _protocol(summary: dict) -> str:
    """How the timed libraries were compiled and verified, from the rows' own records."""
    timed = summary.get("timed_libraries") or ["warm"]
    parts = []
    if "warm" in timed:
        parts.append("stock and Korch compiled cold then warm (the warm libraries timed, the "
                     "warm compile verified against ONNX Runtime)")
    if "cold" in timed:
        parts.append("stock and Korch compiled once, cold (no warm re-compile; the cold "
                     "libraries timed, and each verified against ONNX Runtime in a fresh "
                     "process by bench/zoo/verify_kept.py)")
    return "; or ".join(parts)


def plot(summary: dict, path: str) -> bool:
    """Korch's speed-up over stock, ORT and OpenVINO per model that ran (log scale); False
    when matplotlib is missing or nothing ran."""
    ran = [row for row in summary["models"] if row["status"] == "ok"]
    try:
        import matplotlib
    except ImportError:
        return False
    if not ran:
        if os.path.exists(path):
            os.remove(path)  # a plot of an earlier pass would no longer match the table
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    series = [("korch_vs_stock", "vs stock TVM"), ("korch_vs_ort", "vs ONNX Runtime"),
              ("korch_vs_openvino", "vs OpenVINO")]
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(6.0, 0.55 * len(ran) + 2), 4.5))
    for index, (key, label) in enumerate(series):
        xs = [i + (index - 1) * width for i, row in enumerate(ran) if row.get(key)]
        ys = [row[key] for row in ran if row.get(key)]
        if ys:
            axes.bar(xs, ys, width, label=label)
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%.2g×"))
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%.2g×"))
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(ran)))
    axes.set_xticklabels([row["model"] for row in ran], rotation=60, ha="right", fontsize=8)
    axes.set_ylabel("Korch speed-up (> 1: Korch faster)")
    axes.set_title(f"Model zoo, {summary['budget_trials_per_compile']} trials per compile "
                   f"({summary.get('threads')} threads"
                   f"{', shared machine: noisy' if loaded(summary['models']) else ''})",
                   fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
