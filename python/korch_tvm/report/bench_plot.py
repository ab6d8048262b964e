"""The latency picture of a benchmark: per model, each engine's median with its p10-p90 range.

One drawing for both producers: `korch-tvm bench` (one model, the result dict it writes as JSON)
and the suite's `bench/plot.py` (every model of `bench/results/<target>.json`). matplotlib is an
optional dependency (`pip install 'korch_tvm[plot]'`, which `make install` does): without it
`write_bench_plot` says so in one line and writes nothing, so a benchmark never fails for want
of a picture.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

# Engines in drawing order; any other engine a result holds follows, named as it is there.
ENGINES = (("stock", "stock TVM", "#7f7f7f"), ("korch", "Korch", "#1f77b4"),
           ("onnxruntime", "ONNX Runtime", "#ff7f0e"), ("openvino", "OpenVINO", "#2ca02c"))
OTHER_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf")
SUITE_KEYS = {"stock_ms": "stock", "korch_ms": "korch", "ort_ms": "onnxruntime",
              "openvino_ms": "openvino"}
MISSING_MATPLOTLIB = ("plot skipped: matplotlib is not installed "
                      "(`make install`, or pip install 'korch_tvm[plot]', provides it)")


def bench_latencies(result: Mapping) -> list[tuple[str, dict]]:
    """[(model, {engine: latency stats})] of one `korch-tvm bench` result."""
    return [(str(result["model"]), dict(result["latency_ms"]))]


def suite_latencies(summary: Mapping) -> list[tuple[str, dict]]:
    """[(model, {engine: latency stats})] of a suite summary's rows (`stock_ms`, `ort_ms`, ...)."""
    models = []
    for row in summary["models"]:
        engines = {}
        for key, value in row.items():
            if key.endswith("_ms") and isinstance(value, Mapping) and "median" in value:
                engines[SUITE_KEYS.get(key, key[:-3])] = value
        models.append((str(row["model"]), engines))
    return models


def plot_title(result: Mapping) -> str:
    """Budget and threads (and the machine) of a bench result or a suite summary."""
    per_kernel = result.get("trials_per_kernel")
    budget = f"{per_kernel} trials per kernel" if per_kernel else (
        f"{result.get('trials_budget', '?')} trials")
    if "trials_budget" not in result and "models" in result:  # a suite: budgets per model
        budgets = sorted({str(row.get("trials_budget")) for row in result["models"]})
        budget = f"{'/'.join(budgets)} trials"
    cpu = (result.get("machine") or {}).get("cpu", "unknown CPU")
    return (f"Latency per engine, median and p10-p90 ({budget} per compile, "
            f"{result.get('threads', '?')} threads, {cpu})")


def engine_order(models: Sequence[tuple[str, dict]]) -> list[tuple[str, str, str]]:
    """(key, label, colour) of every engine some model has, known engines first."""
    present = {engine for _, engines in models for engine in engines}
    order = [entry for entry in ENGINES if entry[0] in present]
    others = sorted(present - {key for key, _, _ in ENGINES})
    order += [(key, key, OTHER_COLOURS[i % len(OTHER_COLOURS)]) for i, key in enumerate(others)]
    return order


def draw_latency_panel(axis, models: Sequence[tuple[str, dict]]) -> None:
    """Grouped bars on `axis`: per model, one bar per engine (median ms), p10-p90 error bars,
    the median written above each bar; log scale when the models' latencies differ widely."""
    engines = engine_order(models)
    width = 0.8 / max(1, len(engines))
    medians_all = []
    for index, (key, label, colour) in enumerate(engines):
        offset = (index - (len(engines) - 1) / 2) * width
        positions, medians, low, high = [], [], [], []
        for position, (_, latencies) in enumerate(models):
            stats = latencies.get(key)
            if not stats or not _finite(stats.get("median")):
                continue
            median = float(stats["median"])
            positions.append(position + offset)
            medians.append(median)
            low.append(max(0.0, median - float(stats.get("p10", median))))
            high.append(max(0.0, float(stats.get("p90", median)) - median))
        medians_all += medians
        bars = axis.bar(positions, medians, width, yerr=[low, high], capsize=3, label=label,
                        color=colour)
        for bar, median, above in zip(bars, medians, high):  # written above the range
            axis.annotate(f"{median:.3g}", (bar.get_x() + bar.get_width() / 2, median + above),
                          ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                          textcoords="offset points")
    if medians_all and max(medians_all) > 20 * min(medians_all):
        from matplotlib.ticker import FuncFormatter, NullFormatter

        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # not 10^-1
        axis.yaxis.set_minor_formatter(NullFormatter())
    axis.set_xticks(range(len(models)), [name for name, _ in models], rotation=20, ha="right")
    axis.set_ylabel("latency (ms, lower is better)")
    axis.legend(fontsize=8)


def write_bench_plot(result: Mapping, path: str, *, say=print) -> str | None:
    """Draw one bench result's latencies into the PNG `path`; the path, or None (and one line
    through `say`) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(MISSING_MATPLOTLIB)
        return None
    models = bench_latencies(result)
    figure, axis = plt.subplots(figsize=(3.2 + 1.6 * len(models), 4.2))
    try:
        draw_latency_panel(axis, models)
        axis.set_title(plot_title(result), fontsize=8, wrap=True)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return os.path.abspath(path)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
