"""The one prepared CUDA check: stock TVM vs Korch on a GPU, same trial budget, side by side.

    python bench/cuda_device_check.py --out "$OUT"            # on a machine with a GPU
    python bench/cuda_device_check.py --dry-run --out /tmp/x  # anywhere: plans and builds, no GPU

For each model (the bundled BERT layer; SegFormer-b0 and YOLOX-nano when bench/models holds
them, which `make bench-models` makes; bench/models is not in git, so a machine with only the
repository runs the BERT layer alone and the results say so):

1. stock: FuseOps/FuseTIR, MetaSchedule with `--trials` (CUDA schedule rules), log applied;
2. Korch: fission, GPU kernel rules, costing on the GPU, HiGHS, the same `--trials`;
3. both built with the CUDA pipeline (no re-fusion), outputs checked against ONNX Runtime
   (CPU) on the same random inputs, and timed interleaved on the GPU (VM time evaluator).

Both paths tune into the same log directory, `--logs/<target tag>/` (e.g. cuda-sm_90), which
is copied into `--out` for committing. `--time-limit` bounds the whole run: each compile gets
an equal share of what is left as its costing `time_budget` (the rest of its kernels are then
costed by prediction, which the results show).

Results: `--out/cuda_results.json` and `--out/cuda_results.md` (GPU name, driver, date).
With `--dry-run` (or no GPU) everything up to code generation runs: costs are predicted, the
CUDA source is compiled with nvcc when present, nothing is run; the results say so.
Exit code: 0 when every compiled model verified (or, in a dry run, built), 1 otherwise,
2 when no GPU is usable and --dry-run was not given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

MODELS = [  # name, file; "{bench}" is --bench-models (default bench/models, not in git)
    ("bert_layer", "models/bert_layer.onnx"),
    ("segformer_b0", "{bench}/segformer_b0.onnx"),
    ("yolox_nano", "{bench}/yolox_nano.onnx"),
]
# Verification tolerance on the GPU: nvcc/NVRTC build with fast math (approximate exp/erf/div),
# so outputs differ from ONNX Runtime by ~1e-4 of their scale; a wrong kernel is off by O(1).
CUDA_TOLERANCE = 2e-3

log = logging.getLogger("cuda_device_check")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "out/cuda_check",
                        help="folder for results and the copied tuning logs (default: $OUT)")
    parser.add_argument("--logs", default=os.path.join(ROOT, "tuning_logs"),
                        help="tuning-log root (records go to LOGS/<target tag>/)")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--trials", type=int, default=64,
                        help="MetaSchedule trials per compile, the same for stock and Korch")
    parser.add_argument("--models", default=",".join(m[0] for m in MODELS))
    parser.add_argument("--bench-models", default="bench/models",
                        help="folder holding segformer_b0.onnx and yolox_nano.onnx")
    parser.add_argument("--time-limit", type=float, default=420.0,
                        help="seconds for the whole run; split over the compiles")
    parser.add_argument("--repeat", type=int, default=50, help="latency samples per model/path")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU needed: plan on predictions, build, do not run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.perf_counter()
    deadline = started + args.time_limit
    os.makedirs(args.out, exist_ok=True)

    import tvm

    from korch_tvm.backend import cuda as cuda_build
    from korch_tvm.backend.target import configure_threads, parse_target, target_tag

    configure_threads()
    target = parse_target(args.target)
    env = environment(target)
    results = {"kind": "korch-tvm cuda device check", "environment": env,
               "target": str(target), "target_tag": target_tag(target), "trials": args.trials,
               "time_limit_s": args.time_limit, "dry_run": args.dry_run, "models": []}
    device = cuda_build.cuda_device_present()
    if not device and not args.dry_run:
        results["error"] = cuda_build.no_device_reason(target)
        write(results, args.out)
        print("cuda_device_check: " + results["error"] + " (use --dry-run to plan and build)")
        return 2
    if not device:
        results["note"] = ("dry run: " + (cuda_build.no_device_reason(target) or "no device")
                           + "; costs are predicted, nothing is run or verified")
    if args.dry_run and device:
        results["note"] = "dry run on a GPU machine: nothing is run"
    run_device = device and not args.dry_run

    wanted = [(name, path.format(bench=args.bench_models)) for name, path in MODELS
              if name in args.models.split(",")]
    present = [(name, path) for name, path in wanted if os.path.exists(os.path.join(ROOT, path))]
    compiles_left = 2 * len(present)
    for name, path in wanted:
        if (name, path) not in present:
            results["models"].append({"model": name, "skipped":
                                      f"{path} absent (bench/models is not in git; run "
                                      "`make bench-models` on a machine with the model tools)"})
            continue
        entry = {"model": name, "file": path}
        results["models"].append(entry)
        try:
            source = load(os.path.join(ROOT, path))
            entry["inputs"] = {k: list(v) for k, v in source["shapes"].items()}
            built = {}
            for korch in (False, True):
                label = "korch" if korch else "stock"
                share = max(10.0, (deadline - time.perf_counter()) / max(1, compiles_left) - 20)
                compiles_left -= 1
                built[label], entry[label] = compile_one(source, target, korch, args, share)
                write(results, args.out)
            if run_device:
                check_and_time(source, target, built, entry, args.repeat)
        except Exception as err:  # noqa: BLE001 - one model's failure must not lose the others
            entry["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            log.error("%s failed: %s", name, entry["error"])
        write(results, args.out)
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    copy_logs(args.logs, target_tag(target), args.out, results)
    write(results, args.out)
    print(markdown(results))
    ok = all("error" not in m for m in results["models"]) and any(
        "stock" in m for m in results["models"])
    if run_device:
        ok = ok and all(m.get(p, {}).get("verification", {}).get("passed", False)
                        for m in results["models"] if "stock" in m for p in ("stock", "korch"))
    return 0 if ok else 1


def environment(target) -> dict:
    """Who ran this where: date, GPU (nvidia-smi), driver, CUDA compiler, versions."""
    import tvm

    from korch_tvm.backend import cuda as cuda_build

    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "cpu": platform.processor() or platform.machine(),
           "python": platform.python_version(), "tvm": tvm.__version__,
           "cuda_runtime_loaded": cuda_build.cuda_runtime_loaded(),
           "cuda_device_present": cuda_build.cuda_device_present(),
           "cuda_compiler": cuda_build.cuda_compiler(), "nvcc": cuda_build.nvcc_path()}
    query = "name,driver_version,memory.total,clocks.max.sm"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        fields = [f.strip() for f in out.stdout.strip().splitlines()[0].split(",")]
        env.update(dict(zip(["gpu", "driver", "gpu_memory", "sm_clock_max"], fields)))
    except Exception as err:  # noqa: BLE001 - no nvidia-smi: no GPU fields
        env["gpu"] = f"unknown (nvidia-smi: {type(err).__name__})"
    if env["nvcc"]:
        try:
            out = subprocess.run([env["nvcc"], "--version"], capture_output=True, text=True,
                                 timeout=20)
            env["nvcc_version"] = out.stdout.strip().splitlines()[-1]
        except Exception:  # noqa: BLE001
            pass
    if env["cuda_device_present"]:
        device = tvm.cuda(0)
        env.update({"device_name": device.device_name,
                    "compute_version": device.compute_version,
                    "multiprocessors": device.multi_processor_count})
    return env


def load(path: str) -> dict:
    from korch_tvm.frontend.onnx_import import import_onnx, input_dtypes, input_shapes, load_onnx

    proto = load_onnx(path)
    return {"onnx": proto, "relax": import_onnx(proto, None), "shapes": input_shapes(proto, None),
            "dtypes": input_dtypes(proto)}


def compile_one(source, target, korch: bool, args, time_budget: float):
    """Plan (stock or Korch) with the shared log and budget, then build for CUDA."""
    from korch_tvm.backend import cuda as cuda_build
    from korch_tvm.config import KorchConfig

    config = KorchConfig(target=target, tuning_logs=args.logs, trials=args.trials,
                         time_budget=time_budget, progress=False)
    began = time.perf_counter()
    if korch:
        from korch_tvm.pipeline.korch import run_korch

        optimized, report = run_korch(source["relax"], config)
    else:
        from korch_tvm.pipeline.stock import run_stock

        optimized, report = run_stock(source["relax"], config)
    planned = time.perf_counter()
    executable = cuda_build.build(optimized, target)
    entry = {"plan_seconds": round(planned - began, 1),
             "build_seconds": round(time.perf_counter() - planned, 1),
             "time_budget_s": round(time_budget, 1), "tuning": report.get("tuning"),
             "modelled_ms": report.get("modelled_ms"),
             "kernels_scheduled_from_log": report.get("kernels_scheduled_from_log"),
             "kernels_with_searched_schedule": report.get("kernels_with_searched_schedule"),
             "device_code": cuda_build.check_device_code(executable, target)}
    if korch and isinstance(report.get("plan"), dict):
        plan = report["plan"]
        entry["plan"] = {k: plan[k] for k in ("kernels", "stock_modelled_ms", "solver_status",
                                              "candidates") if k in plan}
    log.info("%s: planned in %.1f s, built in %.1f s", "korch" if korch else "stock",
             entry["plan_seconds"], entry["build_seconds"])
    return executable, entry


def check_and_time(source, target, built: dict, entry: dict, repeat: int) -> None:
    """Verify both builds against ONNX Runtime, then time them interleaved on the GPU."""
    import numpy as np
    import tvm
    from tvm import relax

    from korch_tvm.backend.verify import (compare, onnxruntime_outputs, random_inputs,
                                          run_executable)

    inputs = random_inputs(source["shapes"], source["dtypes"], 0)
    expected = onnxruntime_outputs(source["onnx"], inputs)
    reference = "onnxruntime"
    if expected is None:  # no onnxruntime: the stock build is the reference
        expected, reference = run_executable(built["stock"], target, list(inputs.values())), \
            "stock-tvm-cuda"
    for label, executable in built.items():
        actual = run_executable(executable, target, list(inputs.values()))
        entry[label]["verification"] = compare(actual, expected, reference,
                                               CUDA_TOLERANCE).as_dict()
    device = tvm.cuda(0)
    runners = {}
    for label, executable in built.items():
        vm = relax.VirtualMachine(executable, device)
        args = [tvm.runtime.tensor(x, device) for x in inputs.values()]
        runners[label] = (vm.time_evaluator("main", device, number=10, repeat=1,
                                            min_repeat_ms=0), args)
        runners[label][0](*args)  # warm-up
    samples = {label: [] for label in built}
    for _ in range(repeat):  # interleaved, so clock and thermal drift hit both alike
        for label, (timer, args) in runners.items():
            samples[label].append(timer(*args).mean * 1e3)
    for label, values in samples.items():
        values = np.array(values)
        entry[label]["latency_ms"] = {"median": float(np.median(values)),
                                      "p10": float(np.percentile(values, 10)),
                                      "p90": float(np.percentile(values, 90)),
                                      "samples": len(values)}
    entry["speedup"] = (entry["stock"]["latency_ms"]["median"]
                        / entry["korch"]["latency_ms"]["median"])


def copy_logs(root: str, tag: str, out: str, results: dict) -> None:
    """Copy LOGS/<tag>/ into OUT/tuning_logs/<tag>/ (two folders down: the device tool's limit)."""
    source = os.path.join(root, tag)
    if not os.path.isdir(source):
        results["tuning_logs"] = f"none written under {source}"
        return
    destination = os.path.join(out, "tuning_logs", tag)
    if os.path.abspath(destination) != os.path.abspath(source):
        shutil.copytree(source, destination, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "*.corrupt*"))
    results["tuning_logs"] = {"copied_to": destination, "files": sorted(os.listdir(destination))}


def write(results: dict, out: str) -> None:
    with open(os.path.join(out, "cuda_results.json"), "w") as file:
        json.dump(results, file, indent=1, default=str)
    with open(os.path.join(out, "cuda_results.md"), "w") as file:
        file.write(markdown(results))


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = ["# CUDA device check: stock TVM vs Korch", "",
             f"- date (UTC): {env.get('date_utc')}",
             f"- GPU: {env.get('device_name') or env.get('gpu')}, driver {env.get('driver', '?')}, "
             f"memory {env.get('gpu_memory', '?')}",
             f"- target: `{results['target_tag']}`; CUDA compiler: {env.get('cuda_compiler')} "
             f"({env.get('nvcc_version', 'nvcc ?')}); TVM {env.get('tvm')}",
             f"- trials per compile (stock and Korch alike): {results['trials']}; "
             f"time limit {results['time_limit_s']:.0f} s"]
    if results.get("note"):
        lines.append(f"- note: {results['note']}")
    if results.get("error"):
        lines.append(f"- error: {results['error']}")
    lines += ["", "| model | path | latency ms (median, p10-p90) | modelled ms | kernels searched |"
              " costs: log/measured/tuned/predicted/failed | verification (max rel. error) |",
              "|---|---|---|---|---|---|---|"]
    for model in results["models"]:
        if "skipped" in model or ("error" in model and "stock" not in model):
            lines.append(f"| {model['model']} | - | {model.get('skipped') or model['error']} "
                         "| | | | |")
            continue
        for label in ("stock", "korch"):
            part = model.get(label)
            if part is None:
                continue
            lat = part.get("latency_ms")
            latency = (f"{lat['median']:.4f} ({lat['p10']:.4f}-{lat['p90']:.4f})" if lat
                       else "not run")
            tuning = part.get("tuning") or {}
            costs = "/".join(str(tuning.get(k, 0)) for k in
                             ("from_log", "measured", "tuned", "predicted", "failed"))
            ver = part.get("verification")
            verified = (f"{'pass' if ver['passed'] else 'FAIL'} ({ver['max_rel_error']:.2g})"
                        if ver else part["device_code"]["stage"] + ": not run")
            modelled = part.get("modelled_ms")
            lines.append(f"| {model['model']} | {label} | {latency} | "
                         f"{modelled:.4f} | {part.get('kernels_with_searched_schedule') or '-'} | "
                         f"{costs} | {verified} |" if modelled is not None else
                         f"| {model['model']} | {label} | {latency} | - | - | {costs} | "
                         f"{verified} |")
        if "speedup" in model:
            lines.append(f"| {model['model']} | **Korch speed-up** | "
                         f"**{model['speedup']:.2f}x** | | | | |")
        if "error" in model:
            lines.append(f"| {model['model']} | error | {model['error']} | | | | |")
    if results.get("total_seconds") is not None:
        lines += ["", f"Total run time: {results['total_seconds']} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
