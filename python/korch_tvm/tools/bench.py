"""korch-tvm bench: stock TVM vs Korch vs ONNX Runtime vs OpenVINO, compiled and timed side by side.

    korch-tvm bench MODEL.onnx --target llvm --tuning-logs DIR --trials N [--json OUT]

What it does, in order (bench_compare.py runs it):

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
4. **Latency.** One process loads the stock and Korch libraries, an ONNX Runtime session and an
   OpenVINO compiled model (same thread count; OpenVINO on the CPU device with the latency hint
   and f32 inference, its outputs checked against ORT's), warms each up, then runs interleaved
   rounds A B C D A B C D ...; a sample is the mean of enough back-to-back calls to last
   `--min-sample-ms`, after one untimed call (`--settle-calls`) that brings the runtime's
   weights back into the caches, and a pause (`--gap-ms`) between runtimes lets the previous
   runtime's spinning worker threads go to sleep. Reported: median, p10/p90 per runtime, and
   the ratios of medians together with the p10/p90 of the per-round (paired) ratios. A
   difference is called real only when the whole p10..p90 range of the paired ratio lies on
   one side of 1.
5. **Kinds.** Once the timing is done, the same libraries and ORT run again with every kernel
   call timed (Relax VM instrument hook, ORT's profiler): in-model milliseconds per kernel kind
   (conv 1x1 / depthwise / 3x3 / other, matmul, memory-bound, VM runtime), next to the
   modelled split from the compile reports.
6. **Floor** (with `--machine M.json` from `bench/floor.py`): linear FLOPs / matmul peak and
   minimum bytes / memory bandwidth from the primitive graph; latency / floor per runtime.

Everything that needs TVM is imported inside functions, so `korch-tvm bench --help` stays fast.
"""

from __future__ import annotations

import os
import sys

from .bench_floor import machine_info  # noqa: F401  (bench/floor.py imports it from here)
from .bench_stats import GAP_MS

# The shared flags bench takes, from the one table in flags.py.
BENCH_FLAGS = ("target", "tuning_logs", "trials", "trials_per_kernel", "time_budget",
               "prune_margin", "input_shape", "threads", "exact_math", "layout", "library",
               "cache_state")


def add_arguments(parser) -> None:
    """Declare bench's flags on `parser` (the sub-command's argparse parser)."""
    from .common import add_verbosity
    from .flags import add_flags

    parser.add_argument("model", help="path to an ONNX model")
    # Unlike compile's, bench's log defaults to a fresh temporary directory: a benchmark from an
    # empty log times what a new user gets, and does not fill (or read) the user's cache.
    add_flags(parser, BENCH_FLAGS, tuning_logs=None)
    parser.add_argument("--calibrate", action="store_true",
                        help="keep each kernel's in-model / isolated time ratio in the tuning "
                             "log, so later plans are costed with them (experimental: the "
                             "per-call timing disturbs the run, see costing/in_model.py)")
    _add_output_arguments(parser)
    _add_timing_arguments(parser)
    parser.add_argument("--machine", metavar="MACHINE.json", default=None,
                        help="bandwidth and matmul peak from bench/floor.py: report "
                             "latency / physical floor")
    parser.add_argument("--no-ort", dest="ort", action="store_false",
                        help="leave ONNX Runtime out")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="leave OpenVINO out")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="skip the warm re-compiles (time the cold libraries)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the inference-memory child processes")
    add_verbosity(parser)


def _add_output_arguments(parser) -> None:
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
    parser.add_argument("--retime", metavar="RESULT.json", default=None,
                        help="time again the libraries an earlier run kept in --reports-dir "
                             "(no compiles); earlier timings are kept under 'earlier_timings'")


def _add_timing_arguments(parser) -> None:
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
    parser.add_argument("--settle-calls", type=int, default=1,
                        help="untimed calls at the start of each sample, which bring the "
                             "runtime's weights back into the caches the others used "
                             "(default 1; 0 times that first call too)")


def run(args) -> int:
    """Benchmark (or, with --retime, time again) the model `args` names; write the outputs."""
    from ..errors import KorchError
    from .bench_compare import bench_model, retime
    from .bench_stats import TimingProtocol
    from .bench_summary import load_json
    from .flags import config_from_args, config_values, input_shapes

    if not os.path.isfile(args.model):
        raise KorchError(f"model '{args.model}' does not exist")
    if args.repeat < 1:
        raise KorchError("--repeat must be >= 1")
    if args.settle_calls < 0:
        raise KorchError("--settle-calls must be >= 0")
    config_from_args(args)  # every knob refused in one line now, not in a child later
    timing = TimingProtocol(repeat=args.repeat, warmup=args.warmup,
                            min_sample_ms=args.min_sample_ms, gap_ms=args.gap_ms,
                            settle=args.settle_calls, max_timing_s=args.max_timing_s)
    engines = dict(with_ort=args.ort, with_openvino=args.openvino, machine=load_json(args.machine),
                   log=None if args.quiet else _stderr)
    if args.retime:
        if not args.reports_dir:
            raise KorchError("--retime needs --reports-dir (where the libraries were kept)")
        result = retime(args.model, load_json(args.retime), args.reports_dir,
                        input_shapes=input_shapes(args), threads=args.threads, timing=timing,
                        **engines)
    else:
        result = bench_model(args.model, config_values(args), input_shapes=input_shapes(args),
                             timing=timing, warm=args.warm, memory=args.memory,
                             reports_dir=args.reports_dir, calibrate=args.calibrate, **engines)
    _write_outputs(args, result)
    return 0


def _write_outputs(args, result: dict) -> None:
    """The JSON (if asked), the summary, and the latency plot beside the JSON."""
    from .bench_summary import summary_lines, write_json

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
    """--plot, else the JSON's path (`json_path`) with .png, else MODEL.bench.png in the current
    directory (`model`: the ONNX path)."""
    if plot:
        return plot
    if json_path:
        return os.path.splitext(json_path)[0] + ".png"
    return os.path.splitext(os.path.basename(model))[0] + ".bench.png"


def _stderr(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
