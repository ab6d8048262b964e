"""korch-tvm bench: stock TVM vs Korch vs ONNX Runtime, compiled and timed side by side.

    korch-tvm bench MODEL.onnx --target llvm --tuning-logs DIR --trials N [--json OUT]

What it does, in order:

1. **Compile, cold.** Stock TVM first, then Korch, each in a fresh child process (so that each
   compile's peak memory is its own), with the same `--trials` budget into the same tuning-log
   directory. Kernels both paths share are tuned once, by the stock compile; Korch, running
   second, finds them in the log. That slightly favours Korch in *compile time*; in latency both
   end up reading the same log, see step 2.
2. **Compile, warm.** Both again, same log, same budget: every kernel is in the log now, so no
   trials run (the warm compile time is the cost of a re-compile). The *warm* libraries are the
   ones timed, so stock also picks up any record Korch added for a kernel they share: the
   latency comparison is orchestration only. Verification against ONNX Runtime runs here.
3. **Inference memory.** Each runtime loads and runs the model in its own child process; the
   peak resident memory above the process's own baseline is reported.
4. **Latency.** One process loads the stock and Korch libraries and an ONNX Runtime session
   (same thread count), warms each up, then runs interleaved rounds A B C A B C ...; a sample is
   the mean of enough back-to-back calls to last `--min-sample-ms`, and a pause (300 ms) between
   runtimes lets the previous runtime's spinning worker threads go to sleep. Reported: median,
   p10/p90 per runtime, and the ratios of medians together with the p10/p90 of the per-round
   (paired) ratios. A difference is called real only when the whole p10..p90 range of the
   paired ratio lies on one side of 1.
5. **Kinds.** Once the timing is done, the same libraries and ORT run again with every kernel
   call timed (Relax VM instrument hook, ORT's profiler): in-model milliseconds per kernel kind
   (conv 1x1 / depthwise / 3x3 / other, matmul, memory-bound, VM runtime), next to the
   modelled split from the compile reports.
6. **Floor** (with `--machine M.json` from `bench/floor.py`): linear FLOPs / matmul peak and
   minimum bytes / memory bandwidth from the primitive graph; latency / floor per runtime.

Everything that needs TVM is imported inside functions, so `korch-tvm bench --help` stays fast
and the statistics can be unit-tested without TVM.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

from ..config import LAYOUT_CHOICES

RUNTIMES = ("stock", "korch", "onnxruntime")
# Pause before each runtime's sample. With 20 ms, the previous runtime's worker threads were
# still spinning on the 2 cores: YOLOX-nano measured ORT 30 ms and stock 39 ms interleaved vs
# 9 and 25 ms alone (Korch, timed right after stock and sharing TVM's thread pool, was spared);
# from 200 ms on, interleaved and alone agree within 5 %.
GAP_MS = 300.0


# ----------------------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    from .common import add_verbosity

    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument("--target", default="llvm", help="target, as for `compile` (default llvm)")
    parser.add_argument("--tuning-logs", metavar="DIR", default=None,
                        help="root of the tuning logs, shared by the stock and Korch compiles "
                             "(default: a fresh temporary directory)")
    parser.add_argument("--trials", type=int, default=0, metavar="N",
                        help="MetaSchedule trial budget of *each* compile (stock and Korch get "
                             "the same)")
    parser.add_argument("--trials-per-kernel", type=int, default=None, metavar="N",
                        help="instead of --trials: N trials per kernel each compile tunes")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="bound on each compile's costing stage (see `compile`)")
    parser.add_argument("--prune-margin", type=float, default=None,
                        help="Korch's pruning margin (default: KorchConfig's; 'inf' costs every "
                             "candidate)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS",
                        help="static shape for a dynamic input (repeatable)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for TVM and ONNX Runtime (default: every available core)")
    parser.add_argument("--exact-math", dest="fast_math", action="store_false",
                        help="both compiles keep TVM's libm exp/sigmoid/tanh/erf (see `compile`)")
    parser.add_argument("--layout", choices=LAYOUT_CHOICES, default="auto",
                        help="activation layout, as for compile (default: auto, both paths "
                             "the same way; Korch may also pick a layout per region)")
    parser.add_argument("--calibrate", action="store_true",
                        help="keep each kernel's in-model / isolated time ratio in the tuning "
                             "log, so later plans are costed with them (experimental: the "
                             "per-call timing disturbs the run, see costing/in_model.py)")
    parser.add_argument("--json", metavar="OUT.json", default=None,
                        help="write the full result here")
    parser.add_argument("--plot", metavar="OUT.png", default=None,
                        help="draw the latencies here (default: beside --json as OUT.png, "
                             "else MODEL.bench.png; needs matplotlib, which `make install` "
                             "provides)")
    parser.add_argument("--no-plot", dest="draw_plot", action="store_false",
                        help="draw no plot")
    parser.add_argument("--reports-dir", metavar="DIR", default=None,
                        help="also keep each compile's full report (and library) here")
    parser.add_argument("--repeat", type=int, default=30,
                        help="interleaved rounds (samples per runtime, default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls per runtime")
    parser.add_argument("--max-timing-s", type=float, default=300.0,
                        help="run fewer rounds (at least 5) when --repeat would take longer")
    parser.add_argument("--min-sample-ms", type=float, default=20.0,
                        help="a sample averages back-to-back calls until it lasts this long")
    parser.add_argument("--gap-ms", type=float, default=GAP_MS,
                        help="pause between runtimes inside a round, so the previous runtime's "
                             f"spinning worker threads are asleep (default {GAP_MS:.0f})")
    parser.add_argument("--machine", metavar="MACHINE.json", default=None,
                        help="bandwidth and matmul peak from bench/floor.py: report "
                             "latency / physical floor")
    parser.add_argument("--retime", metavar="RESULT.json", default=None,
                        help="time again the libraries an earlier run kept in --reports-dir "
                             "(no compiles); earlier timings are kept under 'earlier_timings'")
    parser.add_argument("--no-ort", dest="ort", action="store_false",
                        help="leave ONNX Runtime out")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="skip the warm re-compiles (time the cold libraries)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the inference-memory child processes")
    add_verbosity(parser)


def run(args) -> int:
    from ..errors import KorchError

    if not os.path.isfile(args.model):
        raise KorchError(f"model '{args.model}' does not exist")
    if args.trials < 0:
        raise KorchError(f"--trials must be >= 0, got {args.trials}")
    if args.trials_per_kernel is not None and (args.trials_per_kernel < 0 or args.trials):
        raise KorchError("--trials-per-kernel must be >= 0 and replaces --trials")
    if args.repeat < 1:
        raise KorchError("--repeat must be >= 1")
    if args.retime:
        if not args.reports_dir:
            raise KorchError("--retime needs --reports-dir (where the libraries were kept)")
        result = retime(args.model, _load_json(args.retime), args.reports_dir,
                        input_shapes=dict(_parse_shape(text) for text in args.input_shape),
                        threads=args.threads, repeat=args.repeat, warmup=args.warmup,
                        min_sample_ms=args.min_sample_ms, gap_ms=args.gap_ms,
                        max_timing_s=args.max_timing_s, with_ort=args.ort,
                        machine=_load_json(args.machine))
        _write_outputs(args, result)
        return 0
    result = bench_model(
        args.model, target=args.target, tuning_logs=args.tuning_logs, trials=args.trials,
        trials_per_kernel=args.trials_per_kernel,
        time_budget=args.time_budget, prune_margin=args.prune_margin,
        input_shapes=dict(_parse_shape(text) for text in args.input_shape),
        threads=args.threads, repeat=args.repeat, warmup=args.warmup,
        min_sample_ms=args.min_sample_ms, gap_ms=args.gap_ms, max_timing_s=args.max_timing_s,
        with_ort=args.ort,
        warm=args.warm, memory=args.memory, machine=_load_json(args.machine),
        reports_dir=args.reports_dir, log=None if args.quiet else _stderr,
        fast_math=args.fast_math, calibrate=args.calibrate, layout=args.layout)
    _write_outputs(args, result)
    return 0


def _write_outputs(args, result: dict) -> None:
    """The JSON (if asked), the summary, and the latency plot beside the JSON."""
    if args.json:
        write_json(args.json, result)
    if not args.quiet:
        print("\n".join(summary_lines(result)))
    if args.draw_plot:
        from ..errors import EnvironmentFault
        from ..report.bench_plot import write_bench_plot

        path = plot_path(args.plot, args.json, args.model)
        try:
            written = write_bench_plot(result, path,
                                       say=lambda line: print(line, file=sys.stderr))
        except OSError as err:
            raise EnvironmentFault(f"cannot write the plot '{path}': {err.strerror or err}"
                                   ) from None
        if written and not args.quiet:
            print(f"wrote {written}")


def plot_path(plot: str | None, json_path: str | None, model: str) -> str:
    """--plot, else the JSON's path with .png, else MODEL.bench.png in the current directory."""
    if plot:
        return plot
    if json_path:
        return os.path.splitext(json_path)[0] + ".png"
    return os.path.splitext(os.path.basename(model))[0] + ".bench.png"


def _stderr(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _parse_shape(text: str) -> tuple[str, list[int]]:
    from ..errors import KorchError

    name, sep, dims = text.rpartition(":")
    try:
        shape = [int(d) for d in dims.replace(",", "x").split("x") if d]
    except ValueError:
        shape = []
    if not sep or not name or not shape or min(shape) <= 0:
        raise KorchError(f"'{text}' is not NAME:DIMS, e.g. input:1x3x224x224")
    return name, shape


def _load_json(path: str | None):
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path: str, value) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")


# ----------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    data = sorted(float(v) for v in values)
    if not data:
        return float("nan")
    position = (len(data) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def summarize_samples(samples: Sequence[float]) -> dict:
    """Median and spread of latency samples (ms)."""
    median = percentile(samples, 50)
    p10, p90 = percentile(samples, 10), percentile(samples, 90)
    return {"median": median, "p10": p10, "p90": p90, "min": min(samples),
            "max": max(samples), "n": len(samples),
            "spread": (p90 - p10) / median if median > 0 else float("nan")}


def paired_ratio(baseline: Sequence[float], candidate: Sequence[float]) -> dict:
    """How many times faster `candidate` is than `baseline` (> 1: candidate faster).

    `ratio` is median(baseline) / median(candidate); p10/p90 are the percentiles of the
    round-by-round ratios (both were timed in the same interleaved round, so a slow moment of
    the machine hits both). `verdict` says whether the difference exceeds that spread.
    """
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("paired samples need the same, non-zero length")
    per_round = [b / c for b, c in zip(baseline, candidate)]
    ratio = percentile(baseline, 50) / percentile(candidate, 50)
    p10, p90 = percentile(per_round, 10), percentile(per_round, 90)
    return {"ratio": ratio, "p10": p10, "p90": p90, "verdict": verdict(p10, p90)}


def verdict(p10: float, p90: float) -> str:
    if p10 > 1.0:
        return "faster"
    if p90 < 1.0:
        return "slower"
    return "within noise"


def geomean(values: Sequence[float]) -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def interleaved_samples(runners: Mapping[str, Callable[[], object]], repeat: int, *,
                        warmup: int = 3, min_sample_s: float = 0.02, gap_s: float = 0.0,
                        max_seconds: float | None = None, min_repeat: int = 5,
                        clock: Callable[[], float] = time.perf_counter,
                        sleep: Callable[[float], None] = time.sleep) -> dict[str, list[float]]:
    """Time each runner in rounds A B C A B C ...; returns seconds per call, per sample.

    Each runner first gets `warmup` calls. A sample is the mean of `number` back-to-back calls,
    the same `number` for every runner (so that each runner sees its caches evicted by the
    others equally often), chosen so that the fastest runner's sample lasts about
    `min_sample_s`. Every round runs every runner once, always in the same order, with `gap_s`
    of sleep before each. With `max_seconds`, fewer rounds run when `repeat` rounds would take
    longer (never fewer than `min_repeat`), estimated from the warm-up.
    """
    slowest = {}
    for name, call in runners.items():
        slowest[name] = 0.0
        for _ in range(max(1, warmup)):
            start = clock()
            call()
            slowest[name] = max(slowest[name], clock() - start)
    fastest = min(slowest.values(), default=0.0)
    number = max(1, int(math.ceil(min_sample_s / fastest))) if fastest > 0 else 1
    numbers = {name: number for name in runners}
    round_seconds = sum(number * seconds + gap_s for seconds in slowest.values())
    if max_seconds is not None and round_seconds > 0:
        repeat = max(min(repeat, min_repeat), min(repeat, int(max_seconds / round_seconds)))
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeat):
        for name, call in runners.items():
            if gap_s > 0:
                sleep(gap_s)
            number = numbers[name]
            start = clock()
            for _ in range(number):
                call()
            samples[name].append((clock() - start) / number)
    return samples


# ----------------------------------------------------------------------------- physical floor
LINEAR_OPS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
              "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose",
              "relax.nn.conv3d_transpose")


def linear_flops(op_name: str, input_shapes: Sequence[Sequence[int]],
                 output_shape: Sequence[int]) -> int:
    """Floating-point operations (a multiply-add is 2) of one linear primitive.

    matmul: 2 * |out| * K with K the last dim of the first operand. conv: 2 * |out| * |weight| /
    out_channels (= C_in/groups * kernel window). conv_transpose: 2 * |in| * |weight| / C_in
    (each input element scatters into C_out/groups * window outputs).
    """
    out = _prod(output_shape)
    if op_name == "relax.matmul":
        return 2 * out * int(input_shapes[0][-1])
    weight = input_shapes[1]
    if op_name.endswith("_transpose"):
        return 2 * _prod(input_shapes[0]) * _prod(weight) // int(weight[0])
    if op_name.startswith("relax.nn.conv"):
        return 2 * out * _prod(weight) // int(weight[0])
    raise ValueError(f"{op_name} is not a linear primitive")


def _prod(shape: Sequence[int]) -> int:
    result = 1
    for dim in shape:
        result *= int(dim)
    return result


def _dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits or 32) // 8)


def floor_seconds(flops: float, min_bytes: float, peak_flops: float,
                  bandwidth: float) -> dict:
    """The roofline floor max(FLOPs / peak, bytes / bandwidth) and which term binds."""
    compute = flops / peak_flops
    memory = min_bytes / bandwidth
    return {"seconds": max(compute, memory), "compute_seconds": compute,
            "memory_seconds": memory, "bound": "compute" if compute >= memory else "memory"}


def model_work(relax_module) -> dict:
    """FLOPs and minimum bytes of the primitive graph of a Relax model (`main`).

    FLOPs count the linear primitives (matmul, conv) after Korch's fission, from their shapes;
    the other primitives are counted separately (one operation per output element) and left out
    of the floor. Minimum bytes = model inputs + outputs + every weight/constant read once:
    what any implementation must move between memory and the cores at least once.
    """
    import tvm
    from tvm import relax

    from ..lowering.fission import lower_to_primitives

    lowered = lower_to_primitives(relax_module)
    func = lowered["main"]
    num_input = (int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs
                 else len(func.params))
    flops = other_ops = 0
    linear_count = 0
    constants = {}
    by_op: dict[str, int] = {}

    def tensor_bytes(sinfo) -> int:
        if isinstance(sinfo, relax.TensorType):
            return _prod(_static_shape(sinfo)) * _dtype_bytes(str(sinfo.dtype))
        if isinstance(sinfo, relax.TupleType):
            return sum(tensor_bytes(field) for field in sinfo.fields)
        return 0

    def visit(expr):
        nonlocal flops, other_ops, linear_count
        if isinstance(expr, tvm.ir.expr.Constant):
            constants[expr] = tensor_bytes(expr.ty)
        if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
            return
        name = expr.op.name
        out_sinfo = expr.ty
        if name in LINEAR_OPS:
            shapes = [_static_shape(arg.ty) for arg in expr.args[:2]]
            work = linear_flops(name, shapes, _static_shape(out_sinfo))
            flops += work
            linear_count += 1
            by_op[name] = by_op.get(name, 0) + work
        elif isinstance(out_sinfo, relax.TensorType):
            other_ops += _prod(_static_shape(out_sinfo))

    relax.analysis.post_order_visit(func.body, visit)
    weights = sum(tensor_bytes(p.ty) for p in func.params[num_input:])
    inputs = sum(tensor_bytes(p.ty) for p in func.params[:num_input])
    outputs = tensor_bytes(func.body.body.ty)
    constant_bytes = sum(constants.values())
    return {"linear_flops": flops, "linear_primitives": linear_count,
            "flops_by_op": by_op, "other_elementwise_ops": other_ops,
            "input_bytes": inputs, "output_bytes": outputs,
            "weight_bytes": weights + constant_bytes,
            "min_bytes": inputs + outputs + weights + constant_bytes}


def _static_shape(sinfo) -> list[int]:
    from ..errors import KorchError

    try:
        return [int(dim) for dim in sinfo.shape.values]
    except (AttributeError, TypeError):
        raise KorchError("the floor needs static shapes") from None


def floor_report(work: Mapping, machine: Mapping, latencies: Mapping[str, float]) -> dict:
    """Floor of a model on a machine, and each runtime's latency / floor."""
    peak = machine.get("peak_flops") or machine["matmul_peak_flops"]
    floor = floor_seconds(work["linear_flops"], work["min_bytes"], peak,
                          machine["bandwidth_bytes_per_s"])
    floor_ms = floor["seconds"] * 1e3
    return {**floor, "ms": floor_ms, "peak_flops": peak,
            "bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"],
            "latency_over_floor": {name: (ms / floor_ms if ms and floor_ms > 0 else None)
                                   for name, ms in latencies.items()}}


# ----------------------------------------------------------------------------- machine facts
def machine_info() -> dict:
    """CPU model, cores, memory, OS: what a reader needs to weigh the numbers."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gb = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"cpu": cpu, "cores": cores, "memory_gb": memory_gb,
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}


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


# ----------------------------------------------------------------------------- child processes
def _child(task: dict, log=None, timeout: float | None = None) -> dict:
    """Run `task` in a fresh Python (this module's worker); returns its JSON answer."""
    with tempfile.TemporaryDirectory(prefix="korch-bench-") as scratch:
        answer_path = os.path.join(scratch, "answer.json")
        task_path = os.path.join(scratch, "task.json")
        with open(task_path, "w", encoding="utf-8") as handle:
            json.dump({**task, "answer": answer_path}, handle)
        started = time.perf_counter()
        process = subprocess.run([sys.executable, "-m", "korch_tvm.tools.bench", "--worker",
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
    import logging

    from ..config import KorchConfig
    from ..pipeline.compile import compile_model
    from .common import configure_logging

    configure_logging(task.get("verbose", 0), False)
    logging.getLogger("korch_tvm").setLevel(logging.INFO)
    changes = {"num_threads": task.get("threads"),
               "trials_per_kernel": task.get("trials_per_kernel"),
               "fast_math": task.get("fast_math", True),
               "layout": task.get("layout", "auto")}
    if task.get("prune_margin") is not None:
        changes["prune_margin"] = float(task["prune_margin"])
    config = KorchConfig(**changes)
    started = time.perf_counter()
    executable, report = compile_model(
        task["model"], task["target"], korch=task["korch"], tuning_logs=task["tuning_logs"],
        trials=task["trials"], time_budget=task.get("time_budget"), verify=task["verify"],
        input_shapes_override=task.get("input_shapes") or None, config=config)
    compile_wall = time.perf_counter() - started
    if task.get("library"):
        executable.export_library(task["library"])
    report["compile_wall_seconds"] = round(compile_wall, 3)
    return {"report": report}


def _worker_memory(task: dict) -> dict:
    import numpy as np

    from ..backend.verify import random_inputs
    from ..frontend.onnx_import import input_dtypes, input_shapes, load_onnx

    proto = load_onnx(task["model"])
    shapes = input_shapes(proto, task.get("input_shapes") or None)
    inputs = random_inputs(shapes, input_dtypes(proto))
    threads = task.get("threads")
    if task["runtime"] == "onnxruntime":
        del proto
        baseline = _baseline()
        session = _ort_session(task["model"], threads)
        for _ in range(3):
            session.run(None, inputs)
    else:
        import tvm
        from tvm import relax

        from ..backend.target import configure_threads

        del proto
        configure_threads(threads)
        baseline = _baseline()
        device = tvm.cpu(0)
        with _quiet_stderr():
            vm = relax.VirtualMachine(tvm.runtime.load_module(task["library"]), device)
        args = [tvm.runtime.tensor(np.asarray(x), device) for x in inputs.values()]
        for _ in range(3):
            vm["main"](*args)
    peak = _rss_mb("VmHWM")
    return {"baseline_rss_mb": baseline, "peak_rss_after_baseline_mb": peak,
            "inference_peak_mb": None if peak is None or baseline is None else peak - baseline}


class _quiet_stderr:
    """Silence file descriptor 2 (native warnings) for the duration of a `with` block."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def _baseline() -> float | None:
    import gc

    gc.collect()
    _reset_peak_rss()
    return _rss_mb("VmRSS")


def _ort_session(model_path: str, threads: int | None, options=None):
    from ..backend.verify import import_onnxruntime

    onnxruntime = import_onnxruntime()  # telemetry off: nothing written under the home folder
    options = options or onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(threads or _cores())
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _ort_available() -> bool:
    from ..backend.verify import import_onnxruntime

    return import_onnxruntime() is not None


# ----------------------------------------------------------------------------- the benchmark
def bench_model(model: str, *, target="llvm", tuning_logs=None, trials=0, trials_per_kernel=None,
                time_budget=None,
                prune_margin=None, input_shapes=None, threads=None, repeat=30, warmup=3,
                min_sample_ms=20.0, gap_ms=GAP_MS, max_timing_s=None, with_ort=True, warm=True,
                memory=True, machine=None, reports_dir=None, log=None, fast_math=True,
                calibrate=False, layout="auto") -> dict:
    """Compile `model` stock and Korch (cold, then warm), then time them with ONNX Runtime."""
    from ..backend.target import configure_threads, parse_target

    log = log or (lambda message: None)
    threads = configure_threads(threads)
    tvm_target = parse_target(target)
    scratch = tempfile.mkdtemp(prefix="korch-bench-")
    try:
        return _bench_model(model, tvm_target, target, scratch, tuning_logs,
                            (trials, trials_per_kernel), time_budget,
                            prune_margin, input_shapes, threads, repeat, warmup, min_sample_ms,
                            gap_ms, max_timing_s, with_ort, warm, memory, machine, reports_dir,
                            log, fast_math, calibrate, layout)
    finally:  # libraries (unless kept in reports_dir) and a throw-away log
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _bench_model(model, tvm_target, target, scratch, tuning_logs, budget, time_budget,
                 prune_margin, input_shapes, threads, repeat, warmup, min_sample_ms, gap_ms,
                 max_timing_s, with_ort, warm, memory, machine, reports_dir, log,
                 fast_math, calibrate, layout) -> dict:
    import tvm

    from ..backend.target import target_tag
    from ..costing.in_model import record_in_model_times

    keep = reports_dir or scratch
    os.makedirs(keep, exist_ok=True)
    if tuning_logs is None:
        tuning_logs = os.path.join(scratch, "logs")
    stem = os.path.splitext(os.path.basename(model))[0]
    trials, trials_per_kernel = budget
    result = {
        "model": os.path.basename(model),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "tvm_version": tvm.__version__,
        "onnxruntime_version": _ort_version(),
        "target": str(tvm_target),
        "target_tag": target_tag(tvm_target),
        "threads": threads,
        "trials_budget": trials,
        "trials_per_kernel": trials_per_kernel,
        "time_budget": time_budget,
        "fast_math": fast_math,
        "layout": layout,
        "tuning_logs": os.path.abspath(tuning_logs),
        "protocol": {"repeat": repeat, "warmup": warmup, "min_sample_ms": min_sample_ms,
                     "gap_ms": gap_ms, "max_timing_s": max_timing_s,
                     "order": "stock, korch, onnxruntime per round",
                     "timed_libraries": "warm" if warm else "cold"},
    }
    phases = [("cold", False)] + ([("warm", True)] if warm else [])
    compiles: dict[str, dict] = {"stock": {}, "korch": {}}
    final_reports = {}  # the timed libraries' compile reports
    libraries = {}
    for phase, verify in phases:
        for path in ("stock", "korch"):
            library = os.path.join(keep, f"{stem}.{path}.{phase}.so")
            log(f"compile {path} ({phase}, trials "
                f"{trials if trials_per_kernel is None else f'{trials_per_kernel}/kernel'}) ...")
            task = {"kind": "compile", "model": os.path.abspath(model), "target": target,
                    "korch": path == "korch", "tuning_logs": os.path.abspath(tuning_logs),
                    "trials": trials, "trials_per_kernel": trials_per_kernel,
                    "time_budget": time_budget, "verify": verify,
                    "input_shapes": input_shapes, "threads": threads, "library": library,
                    "prune_margin": prune_margin if path == "korch" else None,
                    "fast_math": fast_math, "layout": layout}
            answer = _child(task, log)
            report = answer.pop("report")
            if reports_dir:
                write_json(os.path.join(reports_dir, f"{stem}.{path}.{phase}.json"), report)
            compiles[path][phase] = {**compile_summary(report), **answer}
            final_reports[path] = report
            libraries[path] = library
            log(f"  {path} {phase}: {report['compile_seconds']:.1f} s, "
                f"trials run {report.get('tuning', {}).get('trials_run', 0)}, modelled "
                f"{report.get('modelled_ms', float('nan')):.3f} ms, peak "
                f"{answer['peak_rss_mb']:.0f} MB")
    result["compile"] = compiles
    result["korch_plan"] = compiles["korch"][phases[-1][0]].get("plan")
    with_ort = with_ort and _ort_available()

    if memory:
        result["inference_memory_mb"] = {}
        for name in ("stock", "korch") + (("onnxruntime",) if with_ort else ()):
            task = {"kind": "memory", "runtime": name, "model": os.path.abspath(model),
                    "library": libraries.get(name), "threads": threads,
                    "input_shapes": input_shapes}
            answer = _child(task)
            result["inference_memory_mb"][name] = answer["inference_peak_mb"]
        log(f"inference peak memory (MB above baseline): {result['inference_memory_mb']}")

    log(f"timing: {repeat} interleaved rounds ...")
    _time_into(result, model, libraries, input_shapes, threads, with_ort, repeat=repeat,
               warmup=warmup, min_sample_ms=min_sample_ms, gap_ms=gap_ms,
               max_timing_s=max_timing_s)
    log("profile by kernel kind ...")
    rows = _profile_into(result, model, libraries, final_reports, input_shapes, threads,
                         with_ort)
    result["kind_modelled_ms"] = {path: compiles[path][phases[-1][0]].get("kind_ms")
                                  for path in ("stock", "korch")}
    if calibrate:
        directory = os.path.join(tuning_logs, target_tag(tvm_target))
        kept = record_in_model_times(directory, rows["stock"] + rows["korch"], stem)
        result["in_model"]["recorded"] = kept
        log(f"kept the in-model/isolated ratio of {kept} kernels in {directory} (later plans "
            "use them; delete the file to go back to isolated costs)")
    from ..pipeline.compile import _load_source

    source = _load_source(os.path.abspath(model), input_shapes)
    result["work"] = model_work(source.relax_module)
    _add_floor(result, machine)
    return result


def _profile_into(result: dict, model, libraries, reports, input_shapes, threads,
                  with_ort) -> dict:
    """Time every kernel call in the running libraries (and ORT's nodes); put the time per kind
    and the isolated -> in-model join into result; return the joined rows per path."""
    from ..costing.in_model import fidelity_by_kind, kernel_rows
    from .kind_profile import orchestration_ceiling, sum_by_kind

    kernel_ms, ort_kinds = profile_in_model(model, libraries, input_shapes, threads, with_ort)
    result["kind_profile_ms"] = {
        path: sum_by_kind(kernel_ms[path], reports[path].get("kernel_kinds") or {})
        for path in ("stock", "korch")}
    if ort_kinds is not None:
        result["kind_profile_ms"]["onnxruntime"] = ort_kinds
    result["orchestration_ceiling"] = orchestration_ceiling(result["kind_profile_ms"]["stock"])
    rows = {path: kernel_rows(reports[path], kernel_ms[path]) for path in ("stock", "korch")}
    result["in_model"] = {"by_kind": {path: fidelity_by_kind(rows[path]) for path in rows},
                          "kernels": rows}
    return rows


def _time_into(result: dict, model, libraries, input_shapes, threads, with_ort, *, repeat,
               warmup, min_sample_ms, gap_ms, max_timing_s) -> None:
    """Time the libraries (and ORT) interleaved; put samples, statistics and ratios in result."""
    samples = time_runtimes(model, libraries, input_shapes, threads, with_ort, repeat=repeat,
                            warmup=warmup, min_sample_s=min_sample_ms / 1e3,
                            gap_s=gap_ms / 1e3, max_seconds=max_timing_s)
    result["samples_ms"] = {name: [round(s * 1e3, 6) for s in values]
                            for name, values in samples.items()}
    result["latency_ms"] = {name: summarize_samples(values)
                            for name, values in result["samples_ms"].items()}
    result["ratios"] = {"korch_vs_stock": paired_ratio(result["samples_ms"]["stock"],
                                                       result["samples_ms"]["korch"])}
    if "onnxruntime" in samples:
        result["ratios"]["korch_vs_onnxruntime"] = paired_ratio(
            result["samples_ms"]["onnxruntime"], result["samples_ms"]["korch"])
        result["ratios"]["stock_vs_onnxruntime"] = paired_ratio(
            result["samples_ms"]["onnxruntime"], result["samples_ms"]["stock"])
    phases = result["compile"]["korch"]
    modelled = phases.get("warm", phases.get("cold", {})).get("modelled_ms")
    if modelled:
        result["korch_modelled_over_measured"] = modelled / result["latency_ms"]["korch"]["median"]


def _add_floor(result: dict, machine) -> None:
    if machine:
        result["floor"] = floor_report(
            result["work"], machine,
            {name: stats["median"] for name, stats in result["latency_ms"].items()})


def retime(model, previous: dict, reports_dir: str, *, input_shapes=None, threads=None,
           repeat=30, warmup=3, min_sample_ms=20.0, gap_ms=GAP_MS, max_timing_s=None,
           with_ort=True, machine=None) -> dict:
    """Time again the warm libraries an earlier `bench_model` kept in `reports_dir`."""
    from ..backend.target import configure_threads
    from ..errors import KorchError

    threads = configure_threads(threads)
    stem = os.path.splitext(os.path.basename(model))[0]
    phase = previous.get("protocol", {}).get("timed_libraries", "warm")
    libraries = {path: os.path.join(reports_dir, f"{stem}.{path}.{phase}.so")
                 for path in ("stock", "korch")}
    for library in libraries.values():
        if not os.path.exists(library):
            raise KorchError(f"library '{library}' is missing; run bench with --reports-dir")
    result = dict(previous)
    result.pop("first_timing", None)
    result["earlier_timings"] = list(previous.get("earlier_timings", [])) + [
        {key: previous.get(key) for key in
         ("date", "samples_ms", "latency_ms", "ratios", "protocol")}]
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    result["protocol"] = {**previous.get("protocol", {}), "repeat": repeat, "warmup": warmup,
                          "min_sample_ms": min_sample_ms, "gap_ms": gap_ms,
                          "max_timing_s": max_timing_s, "retimed": True}
    _time_into(result, model, libraries, input_shapes, threads,
               with_ort and _ort_available(), repeat=repeat, warmup=warmup,
               min_sample_ms=min_sample_ms, gap_ms=gap_ms, max_timing_s=max_timing_s)
    reports = {path: os.path.join(reports_dir, f"{stem}.{path}.{phase}.json")
               for path in ("stock", "korch")}
    if all(os.path.exists(path) for path in reports.values()):  # the profile needs them
        _profile_into(result, model, libraries, {p: _load_json(r) for p, r in reports.items()},
                      input_shapes, threads, with_ort and _ort_available())
    _add_floor(result, machine)
    return result


def _ort_version() -> str | None:
    from ..backend.verify import import_onnxruntime

    onnxruntime = import_onnxruntime()
    return None if onnxruntime is None else onnxruntime.__version__


def compile_summary(report: Mapping) -> dict:
    """The numbers of a compile report the benchmark keeps (the full report is large)."""
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


def time_runtimes(model, libraries: Mapping[str, str], input_shapes, threads, with_ort, *,
                  repeat, warmup, min_sample_s, gap_s,
                  max_seconds=None) -> dict[str, list[float]]:
    """Load the libraries (and an ORT session) in this process and time them interleaved."""
    inputs, args, vms = _loaded(model, libraries, input_shapes)
    runners = {name: (lambda main=vms[name]["main"]: main(*args)) for name in ("stock", "korch")}
    if with_ort:
        session = _ort_session(model, threads)
        runners["onnxruntime"] = lambda: session.run(None, inputs)
    return interleaved_samples(runners, repeat, warmup=warmup, min_sample_s=min_sample_s,
                               gap_s=gap_s, max_seconds=max_seconds)


def _loaded(model, libraries: Mapping[str, str], input_shapes):
    """(ONNX inputs by name, the same as TVM tensors, a Relax VM per library) for timing."""
    import numpy as np
    import tvm
    from tvm import relax

    from ..backend.verify import random_inputs
    from ..frontend.onnx_import import input_dtypes, load_onnx
    from ..frontend.onnx_import import input_shapes as onnx_input_shapes

    proto = load_onnx(model)
    inputs = random_inputs(onnx_input_shapes(proto, input_shapes or None), input_dtypes(proto))
    del proto
    device = tvm.cpu(0)
    args = [tvm.runtime.tensor(np.asarray(x), device) for x in inputs.values()]
    vms = {}
    for name, library in libraries.items():
        with _quiet_stderr():  # TVM warns once per loaded library scope ("Scope Loaded")
            vms[name] = relax.VirtualMachine(tvm.runtime.load_module(library), device)
    return inputs, args, vms


def profile_in_model(model, libraries: Mapping[str, str], input_shapes, threads, with_ort,
                     runs: int = 10):
    """({library name: {kernel: in-model ms per run}}, ORT's ms per kind or None), after the
    timing: a separate pass, since timing every call slows the run a little, so the latency
    numbers come from the plain interleaved runs and this only says where the time goes."""
    from .kind_profile import ort_profiled_kind_times, tvm_kernel_times

    inputs, args, vms = _loaded(model, libraries, input_shapes)
    kernel_ms = {name: tvm_kernel_times(vm, args, runs=runs) for name, vm in vms.items()}
    ort_kinds = None
    if with_ort:
        ort_kinds = ort_profiled_kind_times(
            lambda options: _ort_session(model, threads, options), inputs, runs=runs)
    return kernel_ms, ort_kinds


# ----------------------------------------------------------------------------- text summary
def _budget_text(result: Mapping) -> str:
    per_kernel = result.get("trials_per_kernel")
    return str(result["trials_budget"]) if per_kernel is None else f"{per_kernel} per kernel"


def summary_lines(result: Mapping) -> list[str]:
    lat = result["latency_ms"]
    lines = [f"{result['model']} on {result['machine']['cpu']} ({result['threads']} threads), "
             f"TVM {result['tvm_version']}, trials {_budget_text(result)} per compile"]
    for name, stats in lat.items():
        lines.append(f"  {name:12s} median {stats['median']:9.3f} ms  (p10 {stats['p10']:.3f}, "
                     f"p90 {stats['p90']:.3f}, n={stats['n']})")
    for name, ratio in result["ratios"].items():
        lines.append(f"  {name:24s} {ratio['ratio']:.3f}x  (paired p10 {ratio['p10']:.3f}, "
                     f"p90 {ratio['p90']:.3f}: {ratio['verdict']})")
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
    if result.get("inference_memory_mb"):
        lines.append("  inference peak memory (MB): " + ", ".join(
            f"{k} {v:.0f}" for k, v in result["inference_memory_mb"].items() if v is not None))
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2]))
    print("usage: korch-tvm bench MODEL.onnx ... (python -m korch_tvm.tools.bench is the worker)",
          file=sys.stderr)
    sys.exit(2)
