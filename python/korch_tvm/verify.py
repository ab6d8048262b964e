"""Check a compiled model against a reference on the same seeded random inputs.

The reference is ONNX Runtime when the model came from ONNX and onnxruntime is installed (an
implementation independent of TVM), else the unoptimised Relax module built with plain
`tvm.compile` (no fusion, no tuning, no fission).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .errors import KorchError

# float32 kernels that reorder reductions (tiling, vectorised sums) differ from the reference
# by ~1e-6 of the output's scale; 1e-4 leaves room for long reductions and still catches
# any wrong kernel (a wrong kernel is off by O(1) of the scale).
DEFAULT_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Verification:
    reference: str              # "onnxruntime" or "relax-unoptimised"
    max_abs_error: float
    max_rel_error: float        # max |actual - expected| / max |expected|, per output, worst one
    tolerance: float
    passed: bool
    worst_output: int           # index of the output with the largest relative error

    def as_dict(self) -> dict:
        return asdict(self)


def random_inputs(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str],
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal floats; integers in [0, 2) so index inputs stay in range."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape in shapes.items():
        dtype = np.dtype(dtypes.get(name, "float32"))
        if dtype.kind == "f":
            inputs[name] = rng.standard_normal(shape).astype(dtype)
        else:  # integers and booleans: 0 or 1, valid as indices and as masks
            inputs[name] = rng.integers(0, 2, shape).astype(dtype)
    return inputs


def run_executable(executable, target, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run `main` of a built Relax executable once and return its outputs as numpy arrays."""
    import tvm
    from tvm import relax

    from .target import device_for

    device = device_for(target)
    vm = relax.VirtualMachine(executable, device)
    result = vm["main"](*[tvm.runtime.tensor(x, device) for x in inputs])
    return _flatten(result)


def _flatten(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def onnxruntime_outputs(onnx_model, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
    """Outputs from ONNX Runtime, or None when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return [np.asarray(x) for x in session.run(None, dict(inputs))]


def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], reference: str,
            tolerance: float = DEFAULT_TOLERANCE) -> Verification:
    """Errors of `actual` against `expected`, each output scaled by its own magnitude."""
    if len(actual) != len(expected):
        raise KorchError(f"the compiled model returns {len(actual)} outputs, the reference "
                         f"{len(expected)}")
    errors = [_output_error(got, want, index) for index, (got, want)
              in enumerate(zip(actual, expected))]
    if not errors:
        return Verification(reference, 0.0, 0.0, tolerance, True, 0)
    worst = max(range(len(errors)), key=lambda index: errors[index][1])
    max_abs = max(abs_error for abs_error, _ in errors)
    max_rel = errors[worst][1]
    return Verification(reference, max_abs, max_rel, tolerance, max_rel <= tolerance, worst)


def _output_error(got: np.ndarray, want: np.ndarray, index: int) -> tuple[float, float]:
    """(max abs error, max abs error / max |expected|); infinite when NaN/inf patterns differ."""
    if tuple(got.shape) != tuple(want.shape):
        raise KorchError(f"output {index} has shape {got.shape}, the reference {want.shape}")
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isfinite(got64), np.isfinite(want64)):
        return float("inf"), float("inf")
    finite = np.isfinite(want64)
    if not finite.any():
        return 0.0, 0.0
    abs_error = float(np.abs(got64[finite] - want64[finite]).max())
    scale = float(np.abs(want64[finite]).max())
    return abs_error, (abs_error / scale if scale > 0 else abs_error)


def first_mismatching_kernel(build: Callable, chosen_groups: Sequence, num_primitives: int,
                             inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                             target, tolerance: float = DEFAULT_TOLERANCE) -> int | None:
    """Index (execution order) of the first chosen kernel that makes the outputs go wrong.

    Bisects over prefixes: `build(groups)` compiles the model from the first p chosen kernels
    plus one kernel per primitive they do not cover, so O(log kernels) builds find the first p
    at which the outputs stop matching. None when even p = 0 (no fusion at all) differs: then
    the fault is before orchestration (fission, import). Assumes that a wrong kernel, once
    included, keeps the outputs wrong (it feeds them, or it would not have been chosen).
    """
    def wrong(prefix: int) -> bool:
        groups = [sorted(group) for group in chosen_groups[:prefix]]
        covered = {node for group in groups for node in group}
        groups += [[node] for node in range(num_primitives) if node not in covered]
        actual = run_executable(build(groups), target, inputs)
        return not compare(actual, expected, "", tolerance).passed

    if wrong(0):
        return None
    good, bad = 0, len(chosen_groups)  # wrong(len) is what verification just saw
    while bad - good > 1:
        middle = (good + bad) // 2
        if wrong(middle):
            bad = middle
        else:
            good = middle
    return bad - 1
