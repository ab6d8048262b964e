"""Run `korch-tvm bench` on every zoo model at each trial budget; one JSON, table and plot each.

    .venv/bin/python bench/run_zoo.py                       # every exported model, 0 trials
    .venv/bin/python bench/run_zoo.py --trials 0,256        # 0 trials, then 256 per compile
    .venv/bin/python bench/run_zoo.py --trials 5000 --time-budget 600   # 10 min of costing a compile
    .venv/bin/python bench/run_zoo.py --models resnet18,deit_tiny --repeat 10
    .venv/bin/python bench/run_zoo.py --aggregate-only      # rebuild zoo-<budget>.json/.md/.png
    .venv/bin/python bench/run_zoo.py --no-warm --order category   # cheaper pass, see below

The models come from bench/zoo/export.py (its manifest lists each model's export status). Each
model runs in its own `korch-tvm bench` process into a fresh tuning log of its own, as a new
user's first compile would: stock and Korch compiled cold, then warm with verification against
ONNX Runtime, then timed interleaved in one process with ONNX Runtime (and OpenVINO where
`korch-tvm bench` times it). Per model: bench/results/zoo-<budget>/<model>.json and .log.
Aggregate: bench/results/zoo-<budget>.json, .md and .png. Every zoo model is a row: one that
failed to export, compile or verify, or was not run, carries its reason.

`--no-warm` halves the compiles: the cold libraries are timed and their compile times are the
only ones reported; since `korch-tvm bench` verifies only warm compiles, the kept cold libraries
are then verified against ONNX Runtime in a fresh process (bench/zoo/verify_kept.py), so every
timed library is still checked. `--order category` runs one model of each category before a
second of any, so a pass cut short by a deadline still covers every category.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # bench.zoo

from bench.zoo.registry import ZOO  # noqa: E402
from bench.zoo.report import markdown, plot, summarize  # noqa: E402

MODELS_DIR = os.path.join(HERE, "zoo", "models")
LOGS_DIR = os.path.join(HERE, "zoo", "logs")  # git-ignored (bench/zoo/.gitignore)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated subset of the zoo")
    parser.add_argument("--skip", default="", help="comma-separated models to leave out")
    parser.add_argument("--trials", default="0",
                        help="comma-separated trial budgets of each compile (default 0)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds each compile's costing and tuning may take (korch-tvm "
                             "bench --time-budget; default: none, the trial budget decides)")
    parser.add_argument("--repeat", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--model-timeout", type=float, default=1800,
                        help="seconds one model's bench may take before it is a failed row")
    parser.add_argument("--models-dir", default=MODELS_DIR)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--tuning-logs", default=LOGS_DIR,
                        help="root of the per-model fresh tuning logs (<root>/<budget>/<model>)")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument("--note", default="", help="a line for the table's header (e.g. load)")
    parser.add_argument("--no-warm", action="store_true",
                        help="skip the warm re-compiles: time and verify the cold libraries")
    parser.add_argument("--order", choices=("zoo", "category"), default="zoo",
                        help="'category': one model of each category first, then the next")
    parser.add_argument("--code", metavar="COMMIT", default=None,
                        help="bench the python/ of this commit (extracted under the logs root) "
                             "instead of the working tree, which others may be editing")
    args = parser.parse_args(argv)
    head = _git("rev-parse", "--short", "HEAD")
    code = {"commit": head, "source": f"working tree at {head} (with any uncommitted edits)"}
    if args.code and not args.aggregate_only:
        code = use_commit(args.code, args.tuning_logs)

    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    names = args.models.split(",") if args.models else [entry.name for entry in ZOO]
    unknown = sorted(set(names) - {entry.name for entry in ZOO})
    if unknown:
        parser.error(f"unknown zoo model(s) {unknown}; see bench/zoo/registry.py")
    names = [name for name in names if name not in set(args.skip.split(","))]
    if args.order == "category":
        names = by_category(names)
    manifest = read_manifest(args.models_dir)
    for budget in [int(text) for text in args.trials.split(",")]:
        per_model_dir = os.path.join(args.out, f"zoo-{budget}")
        os.makedirs(per_model_dir, exist_ok=True)
        if not args.aggregate_only:
            for name in names:
                if manifest.get(name, {}).get("status") == "ok":
                    run_model(name, budget, args, per_model_dir, code)
        aggregate(per_model_dir, budget, manifest, args)
    return 0


def by_category(names: list[str]) -> list[str]:
    """`names` reordered round-robin over the zoo's categories (zoo order within each)."""
    queues: dict[str, list[str]] = {}
    for entry in ZOO:
        if entry.name in names:
            queues.setdefault(entry.category, []).append(entry.name)
    ordered = []
    while any(queues.values()):
        ordered += [queue.pop(0) for queue in queues.values() if queue]
    return ordered


def _git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *arguments], check=True, capture_output=True,
                          text=True).stdout.strip()


def use_commit(commit: str, logs_root: str) -> dict:
    """Extract `commit`'s python/ under `logs_root`, put it first on every child's path (the
    CLI's korch_tvm then comes from there, not from the editable install), and build its BLAS
    extension in a private environment (`private_python`)."""
    sha = _git("rev-parse", "--short", "--verify", f"{commit}^{{commit}}")
    directory = os.path.join(logs_root, f"code-{sha}")
    if not os.path.isdir(os.path.join(directory, "python")):
        os.makedirs(directory, exist_ok=True)
        archive = subprocess.run(["git", "-C", ROOT, "archive", sha, "python"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    os.environ["PYTHONPATH"] = os.path.join(directory, "python")
    python, built = private_python(os.path.join(directory, "env"))
    print(f"[zoo] benching the python/ of commit {sha} ({directory}); {built}", flush=True)
    return {"commit": sha, "source": f"git archive of {sha}'s python/", "python": python,
            "library_extension": built}


def private_python(env: str) -> tuple[str, str]:
    """A venv of its own that sees this venv's packages, with the extension built for the
    benched source inside it; (its python, the build's line).

    Why: korch_tvm keeps its built extension in <venv>/share, named by its source's hash, and
    a build removes the outputs of other sources, so a rebuild in the shared venv (someone
    editing the working tree) would take the benched commit's library kernels away mid-pass."""
    python = child_venv(env)
    done = subprocess.run([python, "-m", "korch_tvm.library.build"], capture_output=True,
                          text=True)
    line = (done.stdout or done.stderr).strip().splitlines()[-1:] or ["no output"]
    if done.returncode != 0:
        raise SystemExit(f"run_zoo: the benched commit's BLAS extension did not build: {line[0]}")
    return python, line[0]


def child_venv(env: str) -> str:
    """Create (once) a venv at `env` whose python also sees this venv's packages; its python."""
    import sysconfig

    python = os.path.join(os.path.abspath(env), "bin", "python")
    if not os.path.exists(python):
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", "--without-pip", env], check=True)
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], check=True, capture_output=True,
                              text=True).stdout.strip()
        with open(os.path.join(site, "_zoo_parent_venv.pth"), "w", encoding="utf-8") as pth:
            pth.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return python


def write_json(path: str, value) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=1, default=str)
        handle.write("\n")


def read_manifest(models_dir: str) -> dict:
    """The export manifest's rows by model name ({} when nothing was exported)."""
    path = os.path.join(models_dir, "manifest.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        models = json.load(handle).get("models", {})
    if not isinstance(models, dict):
        raise SystemExit(f"run_zoo: {path} is not an export manifest (no 'models' table)")
    return models


def run_model(name: str, budget: int, args, per_model_dir: str, code: dict) -> None:
    """Bench one model; on failure leave `<model>.failed.json` with the reason."""
    out_json = os.path.join(per_model_dir, f"{name}.json")
    failed_json = os.path.join(per_model_dir, f"{name}.failed.json")
    log_path = os.path.join(per_model_dir, f"{name}.log")
    tuning_logs = os.path.join(args.tuning_logs, str(budget), name)
    reports = os.path.join(args.tuning_logs, str(budget), f"{name}.reports")
    model = os.path.join(args.models_dir, f"{name}.onnx")
    python = code.get("python") or sys.executable
    command = [python, "-m", "korch_tvm.tools.cli", "bench", model, "--target", args.target,
               "--trials", str(budget), "--tuning-logs", tuning_logs, "--json", out_json,
               "--repeat", str(args.repeat), "--no-memory", "--no-plot", "--reports-dir", reports]
    if args.no_warm:
        command.append("--no-warm")
    if args.time_budget is not None:
        command += ["--time-budget", str(args.time_budget)]
    for stale in (out_json, failed_json):
        if os.path.exists(stale):
            os.remove(stale)
    for directory in (tuning_logs, reports):  # fresh, as a new user's first compile
        shutil.rmtree(directory, ignore_errors=True)
    print(f"[zoo] {name} ({budget} trials) ...", flush=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    reason = run_logged(command, log_path, args.model_timeout, "w")
    if reason is None and not os.path.exists(out_json):
        reason = "korch-tvm bench exited 0 but wrote no JSON"
    verification = None
    if reason is None and args.no_warm:
        verification, reason = verify_cold(python, model, reports, log_path,
                                           args.model_timeout - (time.perf_counter() - started))
    seconds = round(time.perf_counter() - started, 1)
    extra = {"zoo_seconds": seconds, "zoo_code": code, "load_before": round(load_before, 2),
             "load_after": round(os.getloadavg()[0], 2), "zoo_verification": verification,
             "zoo_library": kept_library_use(reports, name, log_path),
             "command": " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                 for c in command)}
    if reason is not None:
        write_json(failed_json, {"model": name, "reason": reason, **extra})
        print(f"[zoo] {name} FAILED in {seconds:.0f} s: {reason}", flush=True)
        return
    with open(out_json, encoding="utf-8") as handle:
        result = json.load(handle)
    write_json(out_json, {**result, **extra})
    print(f"[zoo] {name} done in {seconds:.0f} s", flush=True)


def run_logged(command: list[str], log_path: str, timeout: float, mode: str) -> str | None:
    """Run `command` with its output into `log_path`; None, or why it failed (one line)."""
    with open(log_path, mode, encoding="utf-8") as log:
        # its own process group, so a timeout also ends the compile workers it started
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            returncode = process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"timed out after {timeout:.0f} s (see {os.path.basename(log_path)})"
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return None if returncode == 0 else failure_reason(log_path, returncode)


def verify_cold(python: str, model: str, reports: str, log_path: str, timeout: float):
    """Verify the cold libraries `korch-tvm bench --no-warm` timed (bench/zoo/verify_kept.py);
    (the per-library verification, None or the failure's reason)."""
    stem = os.path.splitext(os.path.basename(model))[0]
    out = os.path.join(reports, "verification.json")
    command = [python, os.path.join(HERE, "zoo", "verify_kept.py"), model, out,
               *[f"{path}={os.path.join(reports, f'{stem}.{path}.cold.so')}"
                 for path in ("stock", "korch")]]
    reason = run_logged(command, log_path, timeout, "a")
    verification = _load(out)
    if reason is not None:
        failed = {path: entry for path, entry in (verification or {}).items()
                  if not entry.get("passed")}
        reason = f"verification of the timed (cold) libraries failed: {failed or reason}"
    return verification, (reason if len(reason or "") <= 400 else reason[:397] + "...")


def kept_library_use(reports: str, name: str, log_path: str) -> dict | None:
    """How many of Korch's kernels (cold compile) are library (OpenBLAS) calls, from its kept
    compile report, and the log's line if the extension was unavailable; None without a report."""
    report = _load(os.path.join(reports, f"{name}.korch.cold.json"))
    if report is None:
        return None
    plan = report.get("plan") or {}
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        missing = next((line.strip() for line in handle
                        if "library kernels unavailable" in line), None)
    return {"library_kernels": plan.get("library_kernels"),
            "kernels": len(plan.get("kernels") or []),
            "functions": sorted(map(str, report.get("library_calls") or [])),
            "unavailable": missing}


_ERROR_LINE = re.compile(r"(error|Error|Exception|Traceback|Killed|Segmentation)")


def failure_reason(log_path: str, returncode: int) -> str:
    """One line: the CLI's own error line, then (after " <- ") the innermost error line of the log
    if it says more (a worker's failure is reported by the CLI with the worker's last lines)."""
    with open(log_path, encoding="utf-8", errors="replace") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    headline = next((line for line in lines if line.startswith("korch-tvm:")), None)
    errors = [line for line in lines if _ERROR_LINE.search(line) and line != headline]
    parts = [part for part in (headline, errors[-1] if errors else None) if part]
    if returncode < 0:
        parts.insert(0, f"killed by signal {-returncode}")
    text = " <- ".join(parts) or f"exit {returncode} with no error line (see the log)"
    return text if len(text) <= 400 else text[:397] + "..."


def aggregate(per_model_dir: str, budget: int, manifest: dict, args) -> dict:
    """Per-model results -> zoo-<budget>.json, .md and .png; every zoo entry is a row."""
    rows = []
    for entry in ZOO:
        result = _load(os.path.join(per_model_dir, f"{entry.name}.json"))
        failure = _load(os.path.join(per_model_dir, f"{entry.name}.failed.json"))
        exported = manifest.get(entry.name)
        if result is not None:
            row = {"status": "ok", **zoo_row(result)}
        elif failure is not None:
            row = {"status": "failed", "reason": failure["reason"],
                   "zoo_seconds": failure.get("zoo_seconds"), "code": failure.get("zoo_code"),
                   "load": [failure.get("load_before"), failure.get("load_after")],
                   "command": failure.get("command")}
        elif exported is None:
            row = {"status": "not exported", "reason": "no row in the export manifest "
                   "(run bench/zoo/export.py)"}
        elif exported.get("status") != "ok":
            row = {"status": "export failed", "reason": exported.get("reason")}
        else:
            row = {"status": "not run", "reason": "exported, not benched in this pass"}
        rows.append({"model": entry.name, "category": entry.category,
                     "source": f"{entry.library}:{entry.arch}",
                     "inputs": [[i.name, list(i.shape), i.dtype] for i in entry.inputs],
                     **row})
    summary = summarize(rows, budget, {"head_when_aggregated": _git("rev-parse", "--short", "HEAD")},
                        args.note)
    stem = os.path.join(args.out, f"zoo-{budget}")
    write_json(stem + ".json", summary)
    with open(stem + ".md", "w", encoding="utf-8") as handle:
        handle.write(markdown(summary))
    plot(summary, stem + ".png")
    print(markdown(summary))
    return summary


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _ratio(ratios: dict, key: str):
    entry = ratios.get(key)
    return (entry["ratio"], entry["verdict"]) if entry else (None, None)


def _costing_seconds(compile_report: dict) -> float | None:
    """Seconds of a compile's measurement and tuning stages; None without a stage split."""
    stages = compile_report.get("stage_seconds") or {}
    parts = [stages[name] for name in ("measurement", "tuning") if stages.get(name) is not None]
    return sum(parts) if parts else None


def zoo_row(result: dict) -> dict:
    """What the zoo table shows of one `korch-tvm bench` result (OpenVINO where it was timed).

    Read from the JSON's documented fields, not through run_suite.model_row: the zoo's rows
    need a few fields the suite's do not, and none of its floor or profile columns."""
    latency, ratios, compiles = result["latency_ms"], result["ratios"], result["compile"]
    timed = "warm" if "warm" in compiles["korch"] else "cold"
    korch_ms = latency["korch"]["median"]
    modelled = (result.get("korch_plan") or {}).get("modelled_ms")
    verdicts, ranges, row = {}, {}, {}
    for column, key in (("stock", "korch_vs_stock"), ("ort", "korch_vs_onnxruntime"),
                        ("openvino", "korch_vs_openvino")):
        row[f"korch_vs_{column}"], verdicts[column] = _ratio(ratios, key)
        entry = ratios.get(key) or {}
        ranges[column] = [entry.get("p10"), entry.get("p90")] if entry else None
    # the compile's own check (warm compiles), else verify_kept.py's of the timed cold library
    verification = (compiles["korch"][timed].get("verification")
                    or (result.get("zoo_verification") or {}).get("korch") or {})
    return {
        "stock_ms": latency["stock"]["median"], "korch_ms": korch_ms,
        "ort_ms": (latency.get("onnxruntime") or {}).get("median"),
        "openvino_ms": (latency.get("openvino") or {}).get("median"),
        "korch_p10_p90_ms": [latency["korch"]["p10"], latency["korch"]["p90"]],
        **row, "verdicts": verdicts, "paired_p10_p90": ranges,
        "compile_cold_s": {path: compiles[path]["cold"]["compile_seconds"]
                           for path in ("stock", "korch")},
        "compile_warm_s": {path: compiles[path].get("warm", {}).get("compile_seconds")
                           for path in ("stock", "korch")},
        "korch_modelled_ms": modelled,
        "modelled_over_measured": modelled / korch_ms if modelled else None,
        "verification_rel_error": verification.get("max_rel_error"),
        "verification_passed": verification.get("passed"),
        "timed_libraries": timed, "library": result.get("zoo_library"),
        "repeat": (result.get("protocol") or {}).get("repeat"),
        "kernels_chosen": (result.get("korch_plan") or {}).get("kernels_chosen"),
        "trials_run_cold": {path: compiles[path]["cold"]["trials_run"]
                            for path in ("stock", "korch")},
        "time_budget_s": result.get("time_budget"),
        # what a time budget bounds: measurement and tuning (the stock report has no stages)
        "costing_s_cold": _costing_seconds(compiles["korch"]["cold"]),
        "threads": result["threads"], "date": result["date"],
        "zoo_seconds": result.get("zoo_seconds"), "code": result.get("zoo_code"),
        "load": [result.get("load_before"), result.get("load_after")],
        "versions": {"tvm": result.get("tvm_version"),
                     "onnxruntime": result.get("onnxruntime_version"),
                     "openvino": result.get("openvino_version")
                     or (result.get("openvino") or {}).get("version")},
        "foreign_settings": {name: (result.get(name) or {}).get("settings")
                             for name in ("onnxruntime", "openvino")},
        "machine": result.get("machine"), "target_tag": result.get("target_tag"),
    }


if __name__ == "__main__":
    sys.exit(main())
