"""korch-tvm: the command line, in the style of the old `tvmc compile`.

Errors in the user's input are printed as one line (no traceback) with a non-zero exit code;
`-v` shows debug logs and tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

from ..config import LAYOUT_CHOICES, MEMORY_LIMITS
from ..errors import EnvironmentFault, KorchError
from ..support import interrupts, tvm_output
from .common import add_verbosity, configure_logging, shape_arg

EXIT_ENVIRONMENT = 1
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument("--target", default="llvm",
                        help="'llvm' (this CPU: mcpu and cores detected), 'cuda', or a TVM JSON "
                             "target dict (default: llvm)")
    parser.add_argument("--korch", action="store_true",
                        help="orchestrate kernels with Korch (fission + optimal kernel choice) "
                             "instead of TVM's stock FuseOps fusion")
    from ..costing.log_seeds import user_log_root  # no TVM import: --help stays fast

    parser.add_argument("--tuning-logs", metavar="DIR", default=user_log_root(),
                        help="root of the tuning logs; records go to DIR/<target tag>/ and are "
                             "reused on the next compile (default: %(default)s, from "
                             "$KORCH_TVM_CACHE_DIR or $XDG_CACHE_HOME; '' keeps nothing). An "
                             "empty log is seeded from the shipped tuning_logs/ (read only; "
                             "$KORCH_TVM_SEED_LOGS overrides): this CPU's records as they are, "
                             "else those of a CPU with the same vector ISA as predictions and "
                             "starting points, measured here")
    parser.add_argument("--trials", type=int, default=0, metavar="N",
                        help="total MetaSchedule trials for kernels not yet in the log "
                             "(default 0: no search, kernels without records use default "
                             "schedules)")
    parser.add_argument("--trials-per-kernel", type=int, default=None, metavar="N",
                        help="instead of --trials: N trials per kernel that gets tuned (the "
                             "total, N times the kernels, is still split by latency share and "
                             "headroom)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="bound on the costing stage; kernels not costed in time use the "
                             "cost model's prediction")
    parser.add_argument("--input-shape", type=shape_arg, action="append", default=[],
                        metavar="NAME:DIMS", help="static shape for a dynamic input, e.g. "
                        "x:1x3x224x224 (repeatable)")
    parser.add_argument("--threads", type=int, default=None,
                        help="TVM runtime threads (default: every available core)")
    parser.add_argument("--exact-math", dest="fast_math", action="store_false",
                        help="legalize exp/sigmoid/tanh/erf to TVM's per-element libm calls "
                             "instead of vectorisable polynomials (within 4e-7 relative; 2-12x "
                             "faster on the CPU); applies to both paths")
    parser.add_argument("--layout", choices=LAYOUT_CHOICES, default="auto",
                        help="activation layout of convolutions and what follows them: 'auto' "
                             "(default) plans the model in both and keeps the faster modelled "
                             "plan (a model with convolutions is tuned twice); applies to both "
                             "paths. With 'auto' Korch also plans a layout per region of the "
                             "model and keeps it when it models faster (layout 'mixed')")
    parser.add_argument("--memory-limit", choices=MEMORY_LIMITS, default="stock",
                        help="'stock' (default): Korch's plan needs no more activation storage "
                             "than TVM's own fusion groups (within 1%%): pieces of the graph go "
                             "back to those groups until it fits; 'none': the fastest modelled "
                             "plan whatever its storage")
    parser.add_argument("--rpc-tracker", metavar="HOST:PORT", default=None,
                        help="measure kernels through a TVM RPC tracker")
    parser.add_argument("--rpc-key", default=None, help="device key registered at the tracker")
    add_verbosity(parser)


# Sub-commands that live in their own module: each has `add_arguments(parser)` and
# `run(args) -> int`, and imports TVM only inside `run` so that `--help` stays fast.
_PLUGGED_COMMANDS = {
    "explain": "show the Korch plan for a model without building it",
    "bench": "compile stock TVM, Korch and ONNX Runtime and time them side by side",
    "run": "load a compiled library, run it and print its outputs, latency and kernel profile",
    "logs": "summarise, check, merge or train on a tuning-log directory",
}


def _plugged_module(name: str):
    import importlib

    module = "logs_command" if name == "logs" else name  # `logs` would read as logging's
    return importlib.import_module(f".{module}", __package__)


def version_text() -> str:
    """'korch_tvm 0.1.0, TVM 0.27.0, tvm-ffi 0.1.14', read from the installed distributions'
    metadata so that `--version` stays fast (importing TVM takes seconds)."""
    from importlib import metadata

    def version(*distributions: str) -> str:
        for name in distributions:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return (f"korch_tvm {version('korch-tvm', 'korch_tvm')}, "
            f"TVM {version('apache-tvm', 'tvm')}, "
            f"tvm-ffi {version('apache-tvm-ffi', 'tvm-ffi')}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="korch-tvm",
        description="Compile ONNX models with Apache TVM, optionally with Korch's optimal "
                    "kernel orchestration.")
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print the versions of korch_tvm, TVM and tvm-ffi and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compile_parser = commands.add_parser("compile", help="compile a model into a library")
    _add_common(compile_parser)
    compile_parser.add_argument("-o", "--output", metavar="OUT.so", default=None,
                                help="write the compiled library here (load it with "
                                     "tvm.runtime.load_module and relax.VirtualMachine)")
    compile_parser.add_argument("--report", metavar="REPORT.json", default=None,
                                help="write the full compile report as JSON")
    compile_parser.add_argument("--no-verify", dest="verify", action="store_false",
                                help="skip checking the result against ONNX Runtime / the "
                                     "unoptimised model (on by default)")
    compile_parser.add_argument("--verify-tolerance", type=float, default=None,
                                help="largest accepted error relative to each output's scale "
                                     "(default by the output's dtype: 1e-4 for float32, "
                                     "2**-6 for float16, 2**-3 for bfloat16)")
    compile_parser.add_argument("--measure", action="store_true",
                                help="also measure end-to-end latency of the result")
    compile_parser.add_argument("--fallback-on-mismatch", action="store_true",
                                help="if the Korch build fails verification, build with the stock "
                                     "plan instead (the report says so) rather than fail")

    tune_parser = commands.add_parser(
        "tune", help="fill the tuning logs for a model without building it")
    _add_common(tune_parser)

    for name, help_text in _PLUGGED_COMMANDS.items():
        command_parser = commands.add_parser(name, help=help_text)
        _plugged_module(name).add_arguments(command_parser)

    return parser


def _command_compile(args) -> int:
    from ..pipeline.compile import compile_model
    from ..support.safe_io import check_output_path

    config = _config_from_args(args)
    # Checked before the compile, which can take minutes, so that a bad path fails first.
    for flag, path in (("-o", args.output), ("--report", args.report)):
        if path:
            check_output_path(path, flag)
    executable, report = compile_model(
        args.model, korch=args.korch, verify=args.verify,
        input_shapes_override=dict(args.input_shape), config=config,
        measure_latency=args.measure, fallback_on_mismatch=args.fallback_on_mismatch)
    if args.output:
        _export(executable, args.output)
        report["output"] = os.path.abspath(args.output)
    if args.report:
        _write_json(args.report, report)
    if not args.quiet:
        from ..report.text import summary_lines

        print("\n".join(summary_lines(report)))
    _warn_if_noisy(report.get("latency_ms"))
    return 0


# p90/p10 of end-to-end samples above this: the machine is too busy for one run's median to
# mean much. A quiet machine stays within ~1.1-1.2; 1.5 leaves room for ordinary jitter.
NOISY_SPREAD = 1.5


def _warn_if_noisy(latency: dict | None) -> None:
    if not latency or not latency.get("p10"):
        return
    spread = latency["p90"] / latency["p10"]
    if spread > NOISY_SPREAD:
        logging.getLogger("korch_tvm.cli").warning(
            "latency samples spread %.1fx (p90/p10 above %.1f): the machine is noisy; use "
            "`korch-tvm bench` for interleaved side-by-side timing", spread, NOISY_SPREAD)


def _command_tune(args) -> int:
    from ..pipeline.compile import tune_model

    report = tune_model(args.model, korch=args.korch,
                        input_shapes_override=dict(args.input_shape),
                        config=_config_from_args(args))
    if not args.quiet:
        from ..report.text import summary_lines

        print("\n".join(line.replace("compiled", "tuned", 1) for line in summary_lines(report)))
    return 0


def _config_from_args(args):
    """The one KorchConfig of a compile or tune command (validated as it is made)."""
    from ..config import KorchConfig

    return KorchConfig(target=args.target, tuning_logs=args.tuning_logs, trials=args.trials,
                       time_budget=args.time_budget,
                       verify_tolerance=getattr(args, "verify_tolerance", None),
                       num_threads=args.threads, rpc_tracker=args.rpc_tracker,
                       rpc_key=args.rpc_key, trials_per_kernel=args.trials_per_kernel,
                       fast_math=args.fast_math, layout=args.layout,
                       memory_limit=args.memory_limit)


def _export(executable, path: str) -> None:
    """The library, written whole (temporary file, then rename) or not at all."""
    from ..support.safe_io import write_atomically

    write_atomically(path, executable.export_library)


def _write_json(path: str, value: dict) -> None:
    from ..support.safe_io import write_text_atomically

    write_text_atomically(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


COMMANDS = {"compile": _command_compile, "tune": _command_tune,
            **{name: (lambda args, name=name: _plugged_module(name).run(args))
               for name in _PLUGGED_COMMANDS}}


def _machine_fault(err: BaseException) -> str:
    """One line for a MemoryError or OSError that reached the top: what and where."""
    if isinstance(err, MemoryError):
        detail = str(err).strip()
        return "out of memory" + (f" ({detail})" if detail else "") + (
            "; give smaller --input-shape sizes or free memory")
    from ..support.safe_io import os_error_message

    if err.filename is not None:
        return os_error_message(err, action="use")
    return err.strerror or str(err).strip() or type(err).__name__


def _interrupted() -> int:
    print("korch-tvm: interrupted; tuning records written so far are kept", file=sys.stderr)
    return EXIT_INTERRUPTED


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "verbose", 0), getattr(args, "quiet", False))
    interrupts.install()
    try:
        code = tvm_output.run_without_tvm_noise(COMMANDS[args.command], args,
                                                enabled=not getattr(args, "verbose", 0))
        # a Ctrl-C raised where Python ignores it (an object's __del__, say: TVM's worker pools
        # are torn down in one) let the run go on; it still ends as interrupted
        return _interrupted() if interrupts.pressed() else code
    except KorchError as err:
        print(f"korch-tvm: error: {str(err).strip() or type(err).__name__}", file=sys.stderr)
        return EXIT_ENVIRONMENT if isinstance(err, EnvironmentFault) else EXIT_USER_ERROR
    except KeyboardInterrupt:
        return _interrupted()
    except (MemoryError, OSError) as err:  # the machine refused: disk, permissions, memory
        if interrupts.pressed():
            return _interrupted()
        print(f"korch-tvm: error: {_machine_fault(err)}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except Exception as err:  # noqa: BLE001 - last line of defence: one line, not a traceback
        if interrupts.pressed():  # a KeyboardInterrupt TVM turned into a RuntimeError
            return _interrupted()
        if getattr(args, "verbose", 0):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"korch-tvm: internal error: {type(err).__name__}: {first} (rerun with -v for "
              "the traceback, and please report it)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    finally:
        interrupts.uninstall()


if __name__ == "__main__":
    sys.exit(main())
