"""Plot the suite's per-model results from bench/results/<target>.json into a PNG.

    .venv/bin/python bench/plot.py bench/results/llvm.json -o bench/results/llvm.png

Needs matplotlib (the project's optional `plot` extra, which `make install` installs). Three
panels: each engine's latency per model with its p10-p90 range (the same drawing `korch-tvm
bench` writes for one model, korch_tvm.report.bench_plot); Korch's speed-up over stock TVM and over
ONNX Runtime per model (log scale, 1.0 marked), with the p10-p90 range of the per-round paired
ratio as error bars and the orchestration ceiling (what removing all of stock's memory-bound
time would give) as a red mark; and latency over the physical floor per runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from korch_tvm.report.bench_plot import draw_latency_panel, plot_title, suite_latencies  # noqa: E402

DISPLAY = {"bert_layer": "BERT layer", "yolox_nano": "YOLOX-nano",
           "efficientvit_b0": "EfficientViT-b0", "candy": "Candy", "segformer_b0": "SegFormer-b0",
           "yolov4": "YOLOv4"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("summary", nargs="?", default="bench/results/llvm.json")
    parser.add_argument("-o", "--output", default=None)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    with open(args.summary, encoding="utf-8") as handle:
        summary = json.load(handle)
    rows = summary["models"]
    names = [DISPLAY.get(r["model"], r["model"]) for r in rows]
    x = list(range(len(rows)))
    fig, (latency, left, right) = plt.subplots(1, 3, figsize=(19, 4.8))
    draw_latency_panel(latency, [(DISPLAY.get(model, model), engines)
                                 for model, engines in suite_latencies(summary)])
    latency.set_title(plot_title(summary), fontsize=8)

    width = 0.38
    series = ((-width / 2, "korch_vs_stock", "Korch / stock TVM", "#1f77b4"),
              (width / 2, "korch_vs_ort", "Korch / ONNX Runtime", "#ff7f0e"))
    for offset, key, label, color in series:
        values = [r[key] if r[key] is not None else float("nan") for r in rows]
        spans = [r[key + "_p10_p90"] or [v, v] for r, v in zip(rows, values)]
        low = [max(0.0, v - s[0]) if math.isfinite(v) else 0 for v, s in zip(values, spans)]
        high = [max(0.0, s[1] - v) if math.isfinite(v) else 0 for v, s in zip(values, spans)]
        bars = left.bar([i + offset for i in x], values, width, label=label, color=color,
                        yerr=[low, high], capsize=3)
        for bar, value in zip(bars, values):
            if math.isfinite(value):
                left.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value),
                              ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                              textcoords="offset points")
    ceilings = [r.get("orchestration_ceiling") or float("nan") for r in rows]
    if any(math.isfinite(c) for c in ceilings):  # runs before the ceiling was reported have none
        left.scatter([i - width / 2 for i in x], ceilings, marker="_", s=900, color="#d62728",
                     linewidths=3, zorder=3, label="orchestration ceiling (Korch / stock)")
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    left.yaxis.set_major_formatter(plain)
    left.yaxis.set_minor_formatter(plain)
    left.set_xticks(x, names, rotation=20, ha="right")
    left.set_ylabel("speed-up of Korch (× , > 1: Korch faster)")
    geo = summary.get("geomean_korch_vs_stock")
    geo_ort = summary.get("geomean_korch_vs_ort")
    left.set_title(f"Korch speed-up (geomean: {geo:.2f}× vs stock"
                   + (f", {geo_ort:.2f}× vs ORT)" if geo_ort else ")"), fontsize=10)
    left.legend(fontsize=8)

    runtimes = (("stock", "stock TVM", "#7f7f7f"), ("korch", "Korch", "#1f77b4"),
                ("onnxruntime", "ONNX Runtime", "#ff7f0e"))
    width = 0.27
    for i, (key, label, color) in enumerate(runtimes):
        values = [((r.get("latency_over_floor") or {}).get(key) or float("nan")) for r in rows]
        right.bar([j + (i - 1) * width for j in x], values, width, label=label, color=color)
    right.set_yscale("log")
    right.yaxis.set_major_formatter(plain)
    right.yaxis.set_minor_formatter(plain)
    right.set_xticks(x, names, rotation=20, ha="right")
    right.set_ylabel("latency / physical floor")
    right.set_title("Distance from the roofline floor (1 = at the floor)", fontsize=10)
    right.legend(fontsize=8)

    machine = summary.get("machine", {})
    fig.suptitle(f"{machine.get('cpu')} · {machine.get('cores')} cores · TVM "
                 f"{summary.get('tvm_version')} · ORT {summary.get('onnxruntime_version')} · "
                 f"{', '.join(summary.get('dates', []))}", fontsize=9)
    fig.tight_layout()
    output = args.output or os.path.splitext(args.summary)[0] + ".png"
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
