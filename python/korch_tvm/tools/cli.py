"""korch-tvm: the command line, in the style of the old `tvmc compile`.

Errors in the user's input are printed as one line (no traceback) with a non-zero exit code;
`-v` shows debug logs and tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ..errors import EnvironmentFault, KorchError
from ..support import interrupts, tvm_output
from .common import add_verbosity, configure_logging
from .flags import add_flags, config_from_args, input_shapes

EXIT_ENVIRONMENT = 1
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130


# What compile and tune share: every flag from the one table in flags.py.
COMPILE_FLAGS = ("target", "tuning_logs", "trials", "trials_per_kernel", "time_budget",
                 "input_shape", "threads", "exact_math", "layout", "memory_limit", "library",
                 "substitutions", "cache_state", "rpc_tracker", "rpc_key")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument("--korch", action="store_true",
                        help="orchestrate kernels with Korch (fission + optimal kernel choice) "
                             "instead of TVM's stock FuseOps fusion")
    add_flags(parser, COMPILE_FLAGS)
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
    """The korch-tvm parser with every sub-command and its flags."""
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

    config = config_from_args(args)
    # Checked before the compile, which can take minutes, so that a bad path fails first.
    for flag, path in (("-o", args.output), ("--report", args.report)):
        if path:
            check_output_path(path, flag)
    executable, report = compile_model(
        args.model, korch=args.korch, verify=args.verify,
        input_shapes_override=input_shapes(args), config=config,
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
# mean much; below it is ordinary jitter.
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
                        input_shapes_override=input_shapes(args),
                        config=config_from_args(args))
    if not args.quiet:
        from ..report.text import summary_lines

        print("\n".join(line.replace("compiled", "tuned", 1) for line in summary_lines(report)))
    return 0


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
    """Run korch-tvm with `argv` (default: sys.argv[1:]); returns the exit code (0, or one of
    EXIT_*), an error printed as one line."""
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
