"""The benchmark's child processes: each compile, and each runtime's inference memory, in a fresh
Python of its own.

A fresh process per compile makes each compile's peak memory its own (nothing cached from the
previous one), and a fresh process per runtime gives each its own baseline for the inference
memory. The parent writes a task as JSON and reads the answer back as JSON; nothing else crosses.

    python -m korch_tvm.tools.bench_workers TASK.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def run_child(task: dict, log=None, timeout: float | None = None) -> dict:
    """Run `task` (a JSON-friendly dict with a "kind": "compile" or "memory") in a fresh Python;
    returns its JSON answer. `log`: a callable given the child's output lines; `timeout` in
    seconds."""
    with tempfile.TemporaryDirectory(prefix="korch-bench-") as scratch:
        answer_path = os.path.join(scratch, "answer.json")
        task_path = os.path.join(scratch, "task.json")
        with open(task_path, "w", encoding="utf-8") as handle:
            json.dump({**task, "answer": answer_path}, handle)
        started = time.perf_counter()
        process = subprocess.run([sys.executable, "-m", "korch_tvm.tools.bench_workers",
                                  task_path],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=timeout, env=os.environ.copy())
        wall = time.perf_counter() - started
        if process.returncode != 0 or not os.path.exists(answer_path):
            tail = "\n".join(process.stdout.strip().splitlines()[-15:])
            from ..errors import KorchError

            raise KorchError(f"{task['kind']} worker failed (exit {process.returncode}):\n{tail}")
        with open(answer_path, encoding="utf-8") as handle:
            answer = json.load(handle)
    answer["process_wall_seconds"] = round(wall, 3)
    if log and process.stdout.strip():
        lines = [line for line in process.stdout.strip().splitlines()
                 if "Warning: Scope Saving" not in line]  # TVM's note per exported scope
        for line in lines[-40:]:
            log(f"  | {line}")
    return answer


def _worker(task_path: str) -> int:
    import resource

    with open(task_path, encoding="utf-8") as handle:
        task = json.load(handle)
    answer = {"compile": _worker_compile, "memory": _worker_memory}[task["kind"]](task)
    answer["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    answer["children_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    with open(task["answer"], "w", encoding="utf-8") as handle:
        json.dump(answer, handle, default=str)
    return 0


def _worker_compile(task: dict) -> dict:
    """Compile with the KorchConfig fields the parent sent (`flags.config_values`)."""
    import logging

    from ..config import KorchConfig
    from ..pipeline.compile import compile_model
    from .common import configure_logging

    configure_logging(task.get("verbose", 0), False)
    logging.getLogger("korch_tvm").setLevel(logging.INFO)
    config = KorchConfig(**task["config"])
    started = time.perf_counter()
    executable, report = compile_model(
        task["model"], korch=task["korch"], verify=task["verify"],
        input_shapes_override=task.get("input_shapes") or None, config=config)
    compile_wall = time.perf_counter() - started
    if task.get("library"):
        executable.export_library(task["library"])
    report["compile_wall_seconds"] = round(compile_wall, 3)
    return {"report": report}


def _worker_memory(task: dict) -> dict:
    """Load one runtime, run it three times; its peak resident memory above the baseline."""
    from . import engines

    inputs = engines.model_inputs(task["model"], task.get("input_shapes"))
    threads = task.get("threads")
    if task["runtime"] == "onnxruntime":
        baseline = _baseline()
        session = engines.ort_session(task["model"], threads)
        run = lambda: session.run(None, inputs)  # noqa: E731
    elif task["runtime"] == "openvino":
        baseline = _baseline()
        run = engines.openvino_runner(engines.openvino_model(task["model"], threads, inputs),
                                      inputs)
    else:
        from ..backend.target import configure_threads

        configure_threads(threads)
        baseline = _baseline()
        main = engines.tvm_machines({"library": task["library"]})["library"]["main"]
        args = engines.tvm_arguments(inputs)
        run = lambda: main(*args)  # noqa: E731
    for _ in range(3):
        run()
    peak = _rss_mb("VmHWM")
    return {"baseline_rss_mb": baseline, "peak_rss_after_baseline_mb": peak,
            "inference_peak_mb": None if peak is None or baseline is None else peak - baseline}


def _baseline() -> float | None:
    import gc

    gc.collect()
    _reset_peak_rss()
    return _rss_mb("VmRSS")


def _rss_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
            handle.write("5")
        return True
    except OSError:
        return False



if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m korch_tvm.tools.bench_workers TASK.json (korch-tvm bench runs it)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(_worker(sys.argv[1]))
