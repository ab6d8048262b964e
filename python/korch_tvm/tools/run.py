"""korch-tvm run: load a compiled library, run it and time it, in the spirit of trtexec.

The inputs come from an .npz file (checked by name, shape and dtype against the parameters the
library's `main` declares, so that a wrong input is named in one line instead of failing inside
the VM) or are drawn at random in the declared shapes. The latency is the spread of single runs
after a few warm-up runs; `--profile` splits one run's time by kernel with the Relax VM's
instrument hook. A library is code: this runs whatever it contains, so run only libraries you
built or trust.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

# The Relax VM keeps each parameter's annotation in the error message of its input check:
# ErrorContext(fn=main, loc=param[0], param=x, annotation=R.Tensor((16, 32), dtype="float32"))
_PARAMETER_ANNOTATION = re.compile(
    r'loc=param\[(\d+)\], param=[^\n]*?, annotation=R\.Tensor\(\(([^()]*)\), dtype="(\w+)"\)')


@dataclass(frozen=True)
class Parameter:
    """A declared input of `main`: dims are ints, or names for symbolic dimensions."""
    name: str
    shape: tuple | None  # None: not a tensor the annotation describes
    dtype: str | None

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.name} (undeclared shape)"
        return f"{self.name} {self.dtype}{_shape_text(self.shape)}"


def add_arguments(parser) -> None:
    """Declare run's flags on `parser` (the sub-command's argparse parser)."""
    from .common import add_verbosity

    parser.add_argument("library", metavar="LIB.so", help="a library korch-tvm compile -o wrote")
    parser.add_argument("--inputs", metavar="FILE.npz", default=None,
                        help="inputs by parameter name (numpy .npz); default: random inputs of "
                             "the declared shapes")
    parser.add_argument("--repeat", type=int, default=50, metavar="N",
                        help="timed runs (default 50)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed runs before timing (default 3)")
    parser.add_argument("--profile", action="store_true",
                        help="also print the time per kernel (calls, ms per run, share)")
    parser.add_argument("--threads", type=int, default=None,
                        help="TVM runtime threads (default: every available core)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: cuda when the library has CUDA code)")
    parser.add_argument("--save-outputs", metavar="OUT.npz", default=None,
                        help="write the outputs of the first run as output_0, output_1, ...")
    add_verbosity(parser, "show TVM's own messages and tracebacks")


def run(args) -> int:
    """Load the library `args` names, run it on its inputs and print what `args` asks for."""
    from ..errors import KorchError

    for flag, value, least in (("--repeat", args.repeat, 1), ("--warmup", args.warmup, 0),
                               ("--threads", args.threads, 1)):
        if value is not None and value < least:
            raise KorchError(f"{flag} must be at least {least}, not {value}")
    _check_output_path(args.save_outputs)
    library = _load_library(args.library)
    device = _device(library, args.device, args.threads)
    parameters = declared_parameters(library, device)
    inputs = (read_inputs(args.inputs, parameters) if args.inputs
              else random_parameter_inputs(parameters))
    result = run_library(library, device, inputs, args.repeat, args.warmup, args.profile)
    if args.save_outputs:
        np.savez(args.save_outputs, **{f"output_{i}": out for i, out in enumerate(result.outputs)})
    if not args.quiet:
        print("\n".join(result_lines(args.library, device, inputs, result,
                                     inputs_are_random=not args.inputs)))
    return 0


def _check_output_path(path: str | None) -> None:
    from ..errors import KorchError

    if path is None:
        return
    if not path.endswith(".npz"):
        raise KorchError(f"--save-outputs '{path}' must end in .npz")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise KorchError(f"output directory '{directory}' does not exist")


def _load_library(path: str):
    import tvm

    from ..errors import KorchError

    if not os.path.isfile(path):
        raise KorchError(f"library '{path}' does not exist")
    try:
        library = tvm.runtime.load_module(os.path.abspath(path))
    except Exception as err:  # noqa: BLE001 - TVM raises its own error types for a bad file
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise KorchError(f"cannot load '{path}' as a TVM library: {reason}") from None
    if library.kind != "relax.VMExecutable":
        raise KorchError(f"'{path}' is a TVM '{library.kind}' module, not a Relax VM library "
                         "(korch-tvm compile -o writes those)")
    return library


def _device(library, choice: str, threads: int | None):
    import tvm

    from ..backend.target import configure_threads
    from ..errors import KorchError

    if choice == "auto":
        choice = "cuda" if _has_cuda_code(library) else "cpu"
    if choice == "cuda":
        device = tvm.cuda(0)
        if not device.exist:
            raise KorchError("the library needs a CUDA device and none is visible")
        return device
    configure_threads(threads)
    return tvm.cpu(0)


def _has_cuda_code(module) -> bool:
    return module.kind == "cuda" or any(_has_cuda_code(m) for m in module.imports)


def declared_parameters(library, device) -> list[Parameter]:
    """`main`'s parameters with the shapes and dtypes the library checks its inputs against."""
    from tvm import relax

    from ..errors import KorchError

    vm = relax.VirtualMachine(library, device)
    try:
        count = vm._get_function_arity("main")
    except Exception:  # noqa: BLE001 - TVM's error when the function is missing
        raise KorchError("the library has no 'main' function") from None
    annotations = {int(index): (dims, dtype) for index, dims, dtype
                   in _PARAMETER_ANNOTATION.findall(relax.VMExecutable(library).stats())}
    parameters = []
    for index in range(count):
        name = str(vm._get_function_param_name("main", index))
        dims, dtype = annotations.get(index, (None, None))
        parameters.append(Parameter(name, None if dims is None else _parse_dims(dims), dtype))
    return parameters


def _parse_dims(text: str) -> tuple:
    dims = [d.strip().strip('"') for d in text.split(",") if d.strip()]
    return tuple(int(d) if d.isdigit() else d for d in dims)


def _shape_text(shape) -> str:
    return "[" + "x".join(str(d) for d in shape) + "]"


def read_inputs(path: str, parameters: list[Parameter]) -> dict[str, np.ndarray]:
    """The arrays of an .npz file in parameter order, or a one-line error naming the mismatch."""
    from ..errors import KorchError

    if not os.path.isfile(path):
        raise KorchError(f"inputs file '{path}' does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError) as err:
        raise KorchError(f"cannot read '{path}' as a numpy .npz file: {err}") from None
    names = [p.name for p in parameters]
    missing = [n for n in names if n not in arrays]
    unknown = sorted(set(arrays) - set(names))
    if missing or unknown:
        raise KorchError(f"'{path}' does not match the library's inputs "
                         f"({', '.join(p.describe() for p in parameters)}): "
                         + "; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                                     + ([f"unknown {', '.join(unknown)}"] if unknown else [])))
    for parameter in parameters:
        _check_array(parameter, arrays[parameter.name], path)
    return {name: arrays[name] for name in names}


def _check_array(parameter: Parameter, array: np.ndarray, path: str) -> None:
    from ..errors import KorchError

    if parameter.shape is None:
        return
    given = f"{array.dtype}{_shape_text(array.shape)}"
    if str(array.dtype) != parameter.dtype:
        raise KorchError(f"input '{parameter.name}' in '{path}' is {given}; the library "
                         f"expects {parameter.dtype}")
    fixed = [(got, want) for got, want in zip(array.shape, parameter.shape) if isinstance(want, int)]
    if len(array.shape) != len(parameter.shape) or any(got != want for got, want in fixed):
        raise KorchError(f"input '{parameter.name}' in '{path}' is {given}; the library "
                         f"expects {parameter.dtype}{_shape_text(parameter.shape)}")


def random_parameter_inputs(parameters: list[Parameter]) -> dict[str, np.ndarray]:
    """Seeded random inputs of the declared shapes (the verifier's own generator)."""
    from ..backend.verify import random_inputs
    from ..errors import KorchError

    for parameter in parameters:
        if parameter.shape is None or not all(isinstance(d, int) for d in parameter.shape):
            raise KorchError(f"input {parameter.describe()} has no fixed shape; give the "
                             "inputs with --inputs FILE.npz")
    return random_inputs({p.name: p.shape for p in parameters},
                         {p.name: p.dtype for p in parameters})


@dataclass
class RunResult:
    outputs: list
    latencies_ms: list
    warmup: int
    kernel_profile: list | None  # [(kernel, calls per run, ms per run)], slowest first


def run_library(library, device, inputs, repeat: int, warmup: int, profile: bool) -> RunResult:
    """Runs `main` once for the outputs, `warmup` more times untimed, then `repeat` timed runs."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(library, device)
    args = [tvm.runtime.tensor(array, device) for array in inputs.values()]
    outputs = _flatten(vm["main"](*args))
    for _ in range(warmup):
        vm["main"](*args)
    device.sync()
    timer = vm.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=0)
    latencies = [seconds * 1e3 for seconds in timer(*args).results]
    kernels = kernel_profile(vm, args, runs=min(repeat, 20)) if profile else None
    return RunResult(outputs, latencies, warmup, kernels)


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def kernel_profile(vm, args, runs: int) -> list[tuple[str, int, float]]:
    """(kernel, calls per run, ms per run), slowest first; the VM's builtins (allocation, shape
    checks) are one row, last. Each kernel's time is its median over the runs, so that a stall
    of a busy machine in one run does not land on whichever kernel it hit."""
    import time

    from ..kernels.weight_packing import original_kernel_name
    from .kind_profile import RUNTIME

    per_run: list[dict[str, float]] = []
    calls: dict[str, int] = {}
    started: dict[str, float] = {}

    def instrument(func, symbol, before_run, ret_value, *call_args):
        symbol = str(symbol)
        if before_run:
            started[symbol] = time.perf_counter()
            return 0  # run the call as usual
        name = RUNTIME if symbol.startswith("vm.") else original_kernel_name(symbol)
        per_run[-1][name] = per_run[-1].get(name, 0.0) + time.perf_counter() - started[symbol]
        if len(per_run) == 1:
            calls[name] = calls.get(name, 0) + 1
        return 0

    vm["main"](*args)  # warm-up: the first instrumented call pays for the hook's set-up
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            per_run.append({})
            vm["main"](*args)
    finally:
        vm.set_instrument(None)
    rows = [(name, count, 1e3 * float(np.median([run.get(name, 0.0) for run in per_run])))
            for name, count in calls.items()]
    return sorted(rows, key=lambda row: (row[0] == RUNTIME, -row[2]))


def result_lines(path, device, inputs, result: RunResult,
                 inputs_are_random: bool) -> list[str]:
    """The run as text: the library `path` on `device`, each input (random or read) and output,
    and the latency of `result`."""
    source = "random" if inputs_are_random else "from --inputs"
    lines = [f"library {path} on {device}"]
    lines += [f"input  {name}: {array.dtype}{_shape_text(array.shape)} ({source})"
              for name, array in inputs.items()]
    lines += [f"output output_{i}: {out.dtype}{_shape_text(out.shape)}"
              for i, out in enumerate(result.outputs)]
    p10, median, p90 = np.percentile(result.latencies_ms, [10, 50, 90])
    lines.append(f"latency over {len(result.latencies_ms)} runs (after {result.warmup + 1} "
                 f"untimed runs): p10 {p10:.4g} ms, median {median:.4g} ms, p90 {p90:.4g} ms")
    if p90 > 1.5 * median:
        lines.append("  (p90 is over 1.5x the median: the machine is busy or the runs are too "
                     "short to time alone; try a larger --repeat or an idle machine)")
    if result.kernel_profile is not None:
        lines += profile_lines(result.kernel_profile)
    return lines


def profile_lines(rows) -> list[str]:
    """`kernel_profile`'s rows (kernel, calls, ms per run) as an aligned table with shares."""
    total = sum(ms for _, _, ms in rows) or 1.0
    width = max([len("kernel")] + [len(name) for name, _, _ in rows])
    lines = [f"{'kernel':<{width}}  {'calls':>5}  {'ms/run':>9}  {'%':>5}"]
    lines += [f"{name:<{width}}  {calls:>5}  {ms:>9.4f}  {100 * ms / total:>5.1f}"
              for name, calls, ms in rows]
    lines.append(f"{'total':<{width}}  {sum(c for _, c, _ in rows):>5}  {total:>9.4f}  100.0")
    lines.append("(medians over runs timed by the VM's instrument hook, whose Python between "
                 "calls adds to each: shares are approximate, most on small models)")
    return lines
