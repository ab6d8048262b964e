"""Run the benchmark suite: `korch-tvm bench` on every model, then one JSON and one table.

    .venv/bin/python bench/run_suite.py                 # the suite but YOLOv4 (or: make bench)
    .venv/bin/python bench/run_suite.py --models bert_layer,candy --trials 64
    .venv/bin/python bench/run_suite.py --aggregate-only  # rebuild llvm.json / llvm.md
    .venv/bin/python bench/run_suite.py --retime          # time the kept libraries again
    .venv/bin/python bench/run_suite.py --prune-study bert_layer,candy \
        --cost-model tuning_logs/llvm-znver4-2c

Each model runs in its own `korch-tvm bench` process (stock and Korch compiled cold then warm
with the same trial budget into the same tuning-log directory, then timed interleaved with ONNX
Runtime and OpenVINO); its full result goes to `bench/results/<target>/<model>.json` and its log beside it;
the full compile reports and libraries are kept in `<tuning-logs>/reports/`. After the last
model, every model that ran is timed again, together, from those libraries (the machine's speed
drifts over the run; `--no-final-retime` skips it); each first timing stays in its JSON.
The aggregate is `bench/results/<target>.json` and `bench/results/<target>.md`.

The machine's bandwidth and matmul peak come from `bench/floor.py` (run first when
`bench/results/machine.json` is missing).

The prune study plans a model with Korch at zero trials: with every candidate costed
(prune_margin = inf) on a fresh log, with the default settings (pruning and lazy costing) on
another fresh log, which compares costing time; and with the default settings once more, every
measurement answered from the first run's log, so both plans are costed from the very same
numbers and their ratio is plan quality alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

# TVM is imported only inside these modules' functions
from korch_tvm.tools import bench_floor, bench_stats, bench_summary, bench_workers  # noqa: E402

# name, file, trials per compile (stock and Korch each), time budget of the costing stage (s)
SUITE = [
    ("bert_layer", "bench/models/bert_layer.onnx", 128, None),
    ("yolox_nano", "bench/models/yolox_nano.onnx", 128, None),
    ("efficientvit_b0", "bench/models/efficientvit_b0.onnx", 128, None),
    ("candy", "bench/models/candy.onnx", 128, None),
    ("segformer_b0", "bench/models/segformer_b0.onnx", 128, 900),
    ("yolov4", "bench/models/yolov4.onnx", 128, 900),
]
# Run only when named in --models: over an hour on a 2-core machine.
OPT_IN = {"yolov4"}
DISPLAY = {"bert_layer": "BERT layer", "yolox_nano": "YOLOX-nano",
           "efficientvit_b0": "EfficientViT-b0", "candy": "Candy", "segformer_b0": "SegFormer-b0",
           "yolov4": "YOLOv4", "bert_layer_demo": "BERT layer (demo)"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated subset of: " + ", ".join(m[0] for m in SUITE))
    parser.add_argument("--skip", default="", help="comma-separated models to leave out")
    parser.add_argument("--trials", type=int, default=None, help="override every model's budget")
    parser.add_argument("--trials-per-kernel", type=int, default=None, metavar="N",
                        help="instead of a total: N trials per kernel each compile tunes")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--tuning-logs", default=os.path.join(HERE, ".suite-logs"),
                        help="log directory of the suite (default bench/.suite-logs, not "
                             "committed: the suite's logs are ~130 MB; tuning_logs/ holds the "
                             "shipped ones)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument("--retime", action="store_true",
                        help="time every model of an earlier run again, from the libraries it "
                             "kept (no compiles; earlier timings stay in each JSON)")
    parser.add_argument("--no-final-retime", dest="final_retime", action="store_false",
                        help="do not time every model again, together, after the last compile")
    parser.add_argument("--prune-study", default=None, metavar="MODELS",
                        help="only run the pruned-vs-unpruned study on these models")
    parser.add_argument("--cost-model", metavar="DIR", default=None,
                        help="prune study: copy the trained cost model of this log directory "
                             "(e.g. tuning_logs/llvm-znver4-2c) into each fresh log, so pruning "
                             "uses it instead of the analytic estimate")
    parser.add_argument("--skipped-reason", action="append", default=[], metavar="MODEL=WHY",
                        help="record why a model is not in this run (shown in the table)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    machine_path = os.path.join(args.out, "machine.json")
    if args.prune_study:
        return prune_study(args.prune_study.split(","), args)
    per_model_dir = os.path.join(args.out, args.target)
    os.makedirs(per_model_dir, exist_ok=True)
    if args.retime:
        wanted = args.models.split(",") if args.models else [m[0] for m in SUITE]
        for name, path, _, _ in SUITE:
            if name in wanted and os.path.exists(os.path.join(per_model_dir, f"{name}.json")):
                retime_model(name, path, args, per_model_dir, machine_path)
    elif not args.aggregate_only:
        if not os.path.exists(machine_path):
            subprocess.run([sys.executable, os.path.join(HERE, "floor.py"), "--out",
                            machine_path], check=True)
        wanted = (set(args.models.split(",")) if args.models
                  else {m[0] for m in SUITE} - OPT_IN)
        wanted -= set(filter(None, args.skip.split(",")))
        ran = [(name, path) for name, path, trials, budget in SUITE if name in wanted
               and run_model(name, path, args.trials or trials, budget, args, per_model_dir,
                             machine_path)]
        if args.final_retime and len(ran) > 1:
            # Each model is timed right after its own compiles, so the rows' timings spread over
            # the whole run while the machine's speed drifts (bench/results/HISTORY.md). Timing
            # them all again together puts every row in one period; the first timing stays
            # listed.
            print(f"[suite] timing the {len(ran)} models again, together", flush=True)
            for name, path in ran:
                try:
                    retime_model(name, path, args, per_model_dir, machine_path)
                except subprocess.CalledProcessError:
                    print(f"[suite] retime {name} FAILED; its first timing stands (see "
                          f"{os.path.join(per_model_dir, name + '.retime.log')})", flush=True)
    skipped = dict(item.split("=", 1) for item in args.skipped_reason)
    aggregate(per_model_dir, os.path.join(args.out, args.target), skipped,
              bench_summary.load_json(machine_path) if os.path.exists(machine_path) else None)
    return 0


def run_model(name, path, trials, budget, args, per_model_dir, machine_path) -> bool:
    """Bench one model into `per_model_dir`; whether it succeeded."""
    out_json = os.path.join(per_model_dir, f"{name}.json")
    log_path = os.path.join(per_model_dir, f"{name}.log")
    command = [os.path.join(os.path.dirname(sys.executable), "korch-tvm"), "bench",
               os.path.join(ROOT, path), "--target", args.target, "--tuning-logs",
               args.tuning_logs, *(["--trials", str(trials)] if args.trials_per_kernel is None
                                   else ["--trials-per-kernel", str(args.trials_per_kernel)]),
               "--json", out_json, "--machine",
               machine_path, "--repeat", str(args.repeat), "--reports-dir",
               os.path.join(args.tuning_logs, "reports")]
    if budget:
        command += ["--time-budget", str(budget)]
    print(f"[suite] {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        print(f"[suite] {name} FAILED (exit {process.returncode}); see {log_path}", flush=True)
        with open(out_json + ".failed", "w", encoding="utf-8") as handle:
            json.dump({"model": name, "exit": process.returncode, "seconds": seconds}, handle)
        return False
    if os.path.exists(out_json + ".failed"):
        os.remove(out_json + ".failed")  # an earlier failure of this model, now superseded
    with open(out_json, encoding="utf-8") as handle:
        result = json.load(handle)
    result["suite_seconds"] = round(seconds, 1)
    result["command"] = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                 for c in command)
    bench_summary.write_json(out_json, result)
    print(f"[suite] {name} done in {seconds:.0f} s", flush=True)
    return True


def retime_model(name, path, args, per_model_dir, machine_path) -> None:
    out_json = os.path.join(per_model_dir, f"{name}.json")
    command = [os.path.join(os.path.dirname(sys.executable), "korch-tvm"), "bench",
               os.path.join(ROOT, path), "--retime", out_json, "--reports-dir",
               os.path.join(args.tuning_logs, "reports"), "--json", out_json, "--machine",
               machine_path, "--repeat", str(args.repeat)]
    print(f"[suite] retime {name}", flush=True)
    with open(os.path.join(per_model_dir, f"{name}.retime.log"), "w", encoding="utf-8") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)


# ----------------------------------------------------------------------------- aggregation
def _fmt(value, digits=2, suffix=""):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def aggregate(per_model_dir: str, stem: str, skipped: dict, machine: dict | None = None) -> dict:
    """Per-model results -> `<stem>.json` and `<stem>.md`; floors recomputed from `machine`."""
    rows = []
    order = [m[0] for m in SUITE]
    files = sorted((f for f in os.listdir(per_model_dir) if f.endswith(".json")),
                   key=lambda f: (order.index(f[:-5]) if f[:-5] in order else 99, f))
    failed = [f[:-12] for f in os.listdir(per_model_dir) if f.endswith(".json.failed")]
    for file in files:
        with open(os.path.join(per_model_dir, file), encoding="utf-8") as handle:
            result = json.load(handle)
        if machine:  # one machine measurement for every model, whenever each ran
            result["floor"] = bench_floor.floor_report(
                result["work"], machine,
                {name: stats["median"] for name, stats in result["latency_ms"].items()})
        rows.append(model_row(file[:-5], result))
    ratios = [r["korch_vs_stock"] for r in rows]
    ort = [r["korch_vs_ort"] for r in rows if r["korch_vs_ort"] is not None]
    openvino = [r["korch_vs_openvino"] for r in rows if r["korch_vs_openvino"] is not None]
    ceilings = [r["orchestration_ceiling"] for r in rows if r["orchestration_ceiling"]]
    summary = {
        "models": rows,
        "geomean_korch_vs_stock": bench_stats.geomean(ratios),
        "geomean_korch_vs_ort": bench_stats.geomean(ort) if ort else None,
        "geomean_korch_vs_openvino": bench_stats.geomean(openvino) if openvino else None,
        "min_korch_vs_stock": min(ratios) if ratios else None,
        "geomean_orchestration_ceiling": bench_stats.geomean(ceilings) if ceilings else None,
        "failed": failed,
        "skipped": skipped,
    }
    if rows:
        first = rows[0]["raw"]
        summary.update({"machine": first["machine"], "tvm_version": first["tvm_version"],
                        "onnxruntime_version": first["onnxruntime_version"],
                        "openvino_version": first.get("openvino_version"),
                        "openvino_settings": (first.get("openvino") or {}).get("settings"),
                        "target": first["target"], "target_tag": first["target_tag"],
                        "threads": first["threads"], "dates": sorted({r["raw"]["date"][:10]
                                                                      for r in rows}),
                        "suite_seconds": round(sum(r["raw"].get("suite_seconds", 0)
                                                   for r in rows), 1)})
    summary["code"] = code_version()
    if machine:
        summary["machine_peaks"] = {
            "peak_gflops": round((machine.get("peak_flops") or machine["matmul_peak_flops"])
                                 / 1e9, 1),
            "numpy_sgemm_gflops": round(machine["matmul_peak_flops"] / 1e9, 1),
            "bandwidth_gb_per_s": round(machine["bandwidth_bytes_per_s"] / 1e9, 1),
            "measured": machine.get("date")}
    for row in rows:
        del row["raw"]
    bench_summary.write_json(stem + ".json", summary)
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(summary))
    print(markdown(summary))
    return summary


def code_version() -> dict:
    """Which korch_tvm the runs used: the repository's HEAD, or a snapshot on PYTHONPATH."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    return {"repository_head_when_aggregated": head,
            "pythonpath": os.environ.get("PYTHONPATH"),
            "note": os.environ.get("KORCH_BENCH_CODE_NOTE")}


def model_row(name: str, result: dict) -> dict:
    from korch_tvm.tools.kind_profile import orchestration_ceiling  # imports TVM

    lat = result["latency_ms"]
    ratios = result["ratios"]
    korch = result["compile"]["korch"]
    stock = result["compile"]["stock"]
    plan = result.get("korch_plan") or {}
    warm_k, warm_s = korch.get("warm", {}), stock.get("warm", {})
    floor = result.get("floor") or {}
    kvo = ratios.get("korch_vs_onnxruntime")
    kvov = ratios.get("korch_vs_openvino")
    verification = (warm_k or korch["cold"]).get("verification") or {}
    return {
        "model": name,
        "stock_ms": lat["stock"], "korch_ms": lat["korch"],
        "ort_ms": lat.get("onnxruntime"),
        "openvino_ms": lat.get("openvino"),
        "korch_vs_stock": ratios["korch_vs_stock"]["ratio"],
        "korch_vs_stock_p10_p90": [ratios["korch_vs_stock"]["p10"],
                                   ratios["korch_vs_stock"]["p90"]],
        "korch_vs_stock_verdict": ratios["korch_vs_stock"]["verdict"],
        "korch_vs_ort": kvo["ratio"] if kvo else None,
        "korch_vs_ort_p10_p90": [kvo["p10"], kvo["p90"]] if kvo else None,
        "korch_vs_ort_verdict": kvo["verdict"] if kvo else None,
        "korch_vs_openvino": kvov["ratio"] if kvov else None,
        "korch_vs_openvino_p10_p90": [kvov["p10"], kvov["p90"]] if kvov else None,
        "korch_vs_openvino_verdict": kvov["verdict"] if kvov else None,
        "openvino_verification": (result.get("openvino") or {}).get("verification"),
        "compile_cold_s": {"stock": stock["cold"]["compile_seconds"],
                           "korch": korch["cold"]["compile_seconds"]},
        "compile_warm_s": {"stock": warm_s.get("compile_seconds"),
                           "korch": warm_k.get("compile_seconds")},
        "compile_peak_mb": {"stock": max(p["peak_rss_mb"] for p in stock.values()),
                            "korch": max(p["peak_rss_mb"] for p in korch.values())},
        "inference_peak_mb": result.get("inference_memory_mb"),
        "trials_budget": (result["trials_budget"] if result.get("trials_per_kernel") is None
                          else f"{result['trials_per_kernel']}/kernel"),
        "kind_profile_ms": result.get("kind_profile_ms"),
        "orchestration_ceiling": (orchestration_ceiling(result["kind_profile_ms"]["stock"])
                                  if "stock" in (result.get("kind_profile_ms") or {}) else None),
        "fast_math": bool(result.get("fast_math")),  # runs before fast math have no key
        "layout": {"stock": (warm_s or stock["cold"]).get("layout", "NCHW"),
                   "korch": (warm_k or korch["cold"]).get("layout", "NCHW")},
        "trials_run_cold": {"stock": stock["cold"]["trials_run"],
                            "korch": korch["cold"]["trials_run"]},
        "trials_run_warm": {"stock": warm_s.get("trials_run"), "korch": warm_k.get("trials_run")},
        "from_log_cold": {"stock": stock["cold"]["tuning"].get("from_log"),
                          "korch": korch["cold"]["tuning"].get("from_log")},
        "candidates": plan.get("candidates"), "distinct_kernels": plan.get("distinct_kernels"),
        "pruned": plan.get("pruned"), "kernels_chosen": plan.get("kernels_chosen"),
        "stock_kernel_calls": (warm_s or stock["cold"]).get("kernel_calls"),
        "solver_status": plan.get("solver_status"), "solver_gap": plan.get("max_gap"),
        "korch_modelled_ms": plan.get("modelled_ms"),
        "stock_modelled_ms": (warm_s or stock["cold"]).get("modelled_ms"),
        "verification_rel_error": verification.get("max_rel_error"),
        "floor_ms": floor.get("ms"), "floor_bound": floor.get("bound"),
        "latency_over_floor": floor.get("latency_over_floor"),
        "linear_gflops": result["work"]["linear_flops"] / 1e9,
        "min_mb": result["work"]["min_bytes"] / 2 ** 20,
        "suite_seconds": result.get("suite_seconds"),
        "earlier_timings": [
            {"date": t.get("date"),
             "korch_vs_stock": t["ratios"]["korch_vs_stock"]["ratio"],
             "korch_vs_ort": (t["ratios"].get("korch_vs_onnxruntime") or {}).get("ratio")}
            for t in result.get("earlier_timings", [])],
        "raw": result,
    }


def markdown(summary: dict) -> str:
    rows = summary["models"]
    machine = summary.get("machine", {})
    out = []
    if rows:
        out.append(f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, "
                   f"{machine.get('memory_gb')} GB, {machine.get('os')}; TVM "
                   f"{summary.get('tvm_version')}, ONNX Runtime "
                   f"{summary.get('onnxruntime_version')}, OpenVINO "
                   f"{summary.get('openvino_version') or 'not run'}"
                   f"{_settings_text(summary.get('openvino_settings'))}; "
                   f"target `{summary.get('target_tag')}`, {summary.get('threads')} threads; "
                   f"date {', '.join(summary.get('dates', []))}; suite wall time "
                   f"{summary.get('suite_seconds', 0) / 60:.0f} min.")
        peaks = summary.get("machine_peaks")
        if peaks:
            out.append(f"Floor inputs (bench/floor.py): float32 FMA peak {peaks['peak_gflops']} "
                       f"GFLOP/s (numpy sgemm {peaks['numpy_sgemm_gflops']}), memory bandwidth "
                       f"{peaks['bandwidth_gb_per_s']} GB/s.")
        out.append("")
    out.append("| model | math | layout (stock / Korch) | stock ms | Korch ms | ORT ms | "
               "OpenVINO ms | Korch/stock | Korch/ORT | Korch/OpenVINO | floor ms | "
               "Korch/floor | compile cold s (stock / Korch) | warm s (stock / Korch) | "
               "peak compile MB (stock / Korch) | inference MB (stock / Korch / ORT / OpenVINO) | "
               "trials | candidates (distinct, pruned) | kernels (Korch / stock) | "
               "solver gap | verify err |")
    out.append("|" + "---|" * 21)
    for r in rows:
        mem = r.get("inference_peak_mb") or {}
        lof = (r.get("latency_over_floor") or {}).get("korch")
        out.append(
            f"| {DISPLAY.get(r['model'], r['model'])} | {'fast' if r['fast_math'] else 'exact'} "
            f"| {r['layout']['stock']} / {r['layout']['korch']} "
            f"| {_fmt(r['stock_ms']['median'], 3)} ±{_spread(r['stock_ms'])} "
            f"| {_fmt(r['korch_ms']['median'], 3)} ±{_spread(r['korch_ms'])} "
            f"| {_fmt(r['ort_ms']['median'], 3) if r['ort_ms'] else '–'} "
            f"| {_fmt(r['openvino_ms']['median'], 3) if r.get('openvino_ms') else '–'} "
            "| " + _ratio(r['korch_vs_stock'], r['korch_vs_stock_p10_p90'],
                          r['korch_vs_stock_verdict']) + " "
            f"| {_ratio(r['korch_vs_ort'], r['korch_vs_ort_p10_p90'], r['korch_vs_ort_verdict'])} "
            "| " + _ratio(r.get('korch_vs_openvino'), r.get('korch_vs_openvino_p10_p90'),
                          r.get('korch_vs_openvino_verdict')) + " "
            f"| {_fmt(r['floor_ms'], 3)} ({r['floor_bound'] or '–'}) | {_fmt(lof, 1, '×')} "
            f"| {_fmt(r['compile_cold_s']['stock'], 0)} / {_fmt(r['compile_cold_s']['korch'], 0)} "
            f"| {_fmt(r['compile_warm_s']['stock'], 1)} / {_fmt(r['compile_warm_s']['korch'], 1)} "
            f"| {_fmt(r['compile_peak_mb']['stock'], 0)} / "
            f"{_fmt(r['compile_peak_mb']['korch'], 0)} "
            f"| {_fmt(mem.get('stock'), 0)} / {_fmt(mem.get('korch'), 0)} / "
            f"{_fmt(mem.get('onnxruntime'), 0)} / {_fmt(mem.get('openvino'), 0)} "
            f"| {r['trials_budget']} ({r['trials_run_cold']['stock']} / "
            f"{r['trials_run_cold']['korch']} run) "
            f"| {r['candidates']} ({r['distinct_kernels']}, {r['pruned']}) "
            f"| {r['kernels_chosen']} / {r['stock_kernel_calls']} "
            f"| {_fmt(r['solver_gap'], 4)} ({r['solver_status']}) "
            f"| {_fmt_sci(r['verification_rel_error'])} |")
    out.append("")
    out.append(f"Geomean Korch/stock: **{_fmt(summary['geomean_korch_vs_stock'], 2, '×')}** "
               f"(lowest {_fmt(summary['min_korch_vs_stock'], 2, '×')}); geomean Korch/ORT: "
               f"**{_fmt(summary['geomean_korch_vs_ort'], 2, '×')}**; geomean Korch/OpenVINO: "
               f"**{_fmt(summary.get('geomean_korch_vs_openvino'), 2, '×')}**. Ratios are "
               "speed-ups "
               "(> 1: Korch faster); in brackets the p10–p90 of the per-round paired ratio; "
               "'≈' marks a difference inside that spread. ± is (p90 − p10) / 2 of the "
               "samples. Math: how exp/sigmoid/tanh/erf were legalized (lowering/fast_math.py; 'exact' "
               "rows ran before fast math existed, and a model without those functions builds "
               "the same kernels either way). Layout: the activation layout each path chose "
               "(layout/activations.py; rows from before the choice existed are NCHW).\n")
    ceilings = [r for r in rows if r.get("orchestration_ceiling")]
    if ceilings:
        out.append("Orchestration ceiling (stock's in-model total over its time in convolutions "
                   "and matmuls: the Korch/stock speed-up if every memory-bound kernel and VM "
                   "builtin cost nothing): " + ", ".join(
                       f"{DISPLAY.get(r['model'], r['model'])} "
                       f"{_fmt(r['orchestration_ceiling'], 2, '×')}" for r in ceilings)
                   + f"; geomean **{_fmt(summary['geomean_orchestration_ceiling'], 2, '×')}**.\n")
    out += kind_profile_table(rows)
    earlier = [r for r in rows if r.get("earlier_timings")]
    if earlier:
        out.append("Earlier timings of the same libraries (first right after the compiles, then "
                   "one re-time), whose samples averaged more back-to-back calls for the faster "
                   "runtime; the table above gives every runtime the same calls per sample:\n")
        out.append("| model | Korch/stock, earlier → final | Korch/ORT, earlier → final |")
        out.append("|---|---|---|")
        for r in earlier:
            stock = ", ".join(_fmt(t["korch_vs_stock"], 2) for t in r["earlier_timings"])
            ort = ", ".join(_fmt(t["korch_vs_ort"], 2) for t in r["earlier_timings"])
            out.append(f"| {DISPLAY.get(r['model'], r['model'])} | {stock} → "
                       f"{_fmt(r['korch_vs_stock'], 2)} | {ort} → {_fmt(r['korch_vs_ort'], 2)} |")
        out.append("")
    for name in summary.get("failed", []):
        if name not in summary.get("skipped", {}):  # else the reason given says more
            out.append(f"- {DISPLAY.get(name, name)}: the run failed (see its .log).")
    for name, why in summary.get("skipped", {}).items():
        out.append(f"- {DISPLAY.get(name, name)}: {why}")
    return "\n".join(out) + "\n"


def kind_profile_table(rows) -> list[str]:
    """Markdown: in-model ms per kernel kind, per model and runtime (from `korch-tvm bench`)."""
    profiled = [r for r in rows if r.get("kind_profile_ms")]
    if not profiled:
        return []
    kinds = ["conv1x1", "conv_depthwise", "conv3x3", "conv_other", "matmul", "memory", "runtime"]
    out = ["In-model time by kernel kind (ms per run; every kernel call timed by the Relax VM's "
           "instrument hook, ORT by its profiler, so totals run a little above the latency):\n",
           "| model | library | " + " | ".join(kinds) + " | total |",
           "|" + "---|" * (len(kinds) + 3)]
    for r in profiled:
        for runtime, times in r["kind_profile_ms"].items():
            out.append(f"| {DISPLAY.get(r['model'], r['model'])} | {runtime} | "
                       + " | ".join(_fmt(times.get(kind, 0.0), 2) for kind in kinds)
                       + f" | {_fmt(sum(times.values()), 2)} |")
    out.append("")
    return out


def _spread(stats: dict) -> str:
    return _fmt((stats["p90"] - stats["p10"]) / 2, 3)


def _ratio(value, p10_p90, verdict) -> str:
    if value is None:
        return "–"
    mark = "≈" if verdict == "within noise" else ""
    return f"{mark}{value:.2f}× [{p10_p90[0]:.2f}–{p10_p90[1]:.2f}]"


def _settings_text(settings) -> str:
    """' (CPU, INFERENCE_NUM_THREADS 2, ...)' for a runtime's settings, '' when unknown."""
    if not settings:
        return ""
    ordered = sorted(settings.items(), key=lambda item: item[0] != "device")  # JSON sorts keys
    return " (" + ", ".join(f"{key} {value}" for key, value in ordered) + ")"


def _fmt_sci(value) -> str:
    return "–" if value is None else f"{value:.1e}"


# ----------------------------------------------------------------------------- prune study
def prune_study(models, args) -> int:
    results = {}
    paths = {m[0]: m[1] for m in SUITE}
    paths["bert_layer_demo"] = "models/bert_layer.onnx"
    for name in models:
        model = os.path.join(ROOT, paths[name])
        scratch = tempfile.mkdtemp(prefix=f"korch-prune-{name}-")
        if args.cost_model:
            for log in ("full", "default", "replay"):
                directory = os.path.join(scratch, log, os.path.basename(
                    os.path.normpath(args.cost_model)))
                os.makedirs(directory, exist_ok=True)
                for file in os.listdir(args.cost_model):
                    if file.startswith("cost_model"):
                        shutil.copy(os.path.join(args.cost_model, file), directory)
        runs = {}
        for label, margin in (("full", float("inf")), ("default", None)):
            config = {"target": args.target, "tuning_logs": os.path.join(scratch, label),
                      "trials": 0, **({} if margin is None else {"prune_margin": margin})}
            task = {"kind": "compile", "model": model, "korch": True, "config": config,
                    "verify": False, "input_shapes": None, "library": None}
            print(f"[prune] {name}: {label} ...", flush=True)
            report = bench_workers.run_child(task)["report"]
            stages = report["stage_seconds"]
            runs[label] = {
                "costing_seconds": round(stages.get("prediction", 0) + stages.get("measurement", 0)
                                         + stages.get("tuning", 0), 3),
                "compile_seconds": report["compile_seconds"],
                "modelled_ms": report["modelled_ms"],
                "candidates": report["plan"]["candidates"],
                "pruned": report["plan"]["pruned"],
                "distinct_kernels": report["tuning"]["kernels"],
                "measured": report["tuning"]["measured"],
                "solver_status": report["plan"]["solver_status"],
            }
            print(f"[prune]   {runs[label]}", flush=True)
        print(f"[prune] {name}: default settings replayed on the full run's measurements ...",
              flush=True)
        runs["replay"] = replay(model, os.path.join(scratch, "full"),
                                os.path.join(scratch, "replay"), args.target)
        print(f"[prune]   {runs['replay']}", flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
        full, default, same = runs["full"], runs["default"], runs["replay"]
        results[name] = {
            **runs,
            "plan_cost_ratio": same["modelled_ms"] / full["modelled_ms"],
            "costing_time_ratio": default["costing_seconds"] / full["costing_seconds"],
            "kernels_measured_ratio": default["measured"] / full["measured"],
        }
    out = os.path.join(args.out, f"{args.target}-prune-study.json")
    results = {"predictor": ("cost model copied from " + os.path.relpath(args.cost_model, ROOT))
               if args.cost_model else "analytic estimate (fresh logs hold no cost model)",
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "code": code_version(),
               "models": results}
    bench_summary.write_json(out, results)
    print(json.dumps(results, indent=2))
    return 0


def replay(model: str, full_logs: str, fresh_logs: str, target: str) -> dict:
    """Plan with default settings on a fresh log, every measurement answered from `full_logs`.

    Both plans are then costed from the very same numbers, so their ratio is plan quality
    alone (two separate runs would also differ by the machine's timing noise).
    """
    from korch_tvm.config import KorchConfig
    from korch_tvm.costing.measure import KernelCost
    from korch_tvm.costing.tuning_log import TuningLog
    from korch_tvm.pipeline.compile import _load_source
    from korch_tvm.pipeline.korch import plan_korch

    full_log = TuningLog(full_logs, target)
    asked = []

    def from_full_log(modules):
        asked.extend(modules)
        return {key: KernelCost(full_log.best_seconds(module), "measured", 1)
                for key, module in modules.items()}

    source = _load_source(model, None)
    plan = plan_korch(source.relax_module, KorchConfig(target=target, tuning_logs=fresh_logs,
                                                       progress=False),
                      measure_with=from_full_log)
    report = plan.report()
    return {"modelled_ms": report["plan"]["modelled_ms"], "measured": len(set(asked)),
            "pruned": report["plan"]["pruned"], "solver_status": report["plan"]["solver_status"]}


if __name__ == "__main__":
    sys.exit(main())
