"""Check a compiled model against a reference on the same seeded random inputs.

The reference is ONNX Runtime when the model came from ONNX and onnxruntime is installed (an
implementation independent of TVM), else the unoptimised Relax module built with plain
`tvm.compile` (no fusion, no tuning, no fission).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import KorchError
from ..support.pool_spin import note_parallel_work

# float32 kernels that reorder reductions (tiling, vectorised sums) differ from the reference
# by ~1e-6 of the output's scale; 1e-4 leaves room for long reductions and still catches
# any wrong kernel (a wrong kernel is off by O(1) of the scale).
DEFAULT_TOLERANCE = 1e-4

# 16-bit floats. ONNX's own backend tests (onnx/backend/test/runner/__init__.py,
# `assert_similar_outputs`; node tests are made with rtol=1e-3, atol=1e-7 in
# onnx/backend/test/case/node/__init__.py) accept rtol 1e-3 for every dtype and raise it to
# max(rtol, 2**-6), "two bfloat16 ULPs", for bfloat16. Their references are computed in the
# output's precision; ours (ONNX Runtime) accumulates float16 reductions in float32 while TVM's
# legalized kernels accumulate in the output's dtype, which adds about sqrt(K)/2 ULPs for a
# reduction of length K. So a 16-bit output may differ by 16 ULPs of its dtype at the output's
# scale: 2**-6 for float16 (ONNX's own bfloat16 bound) and 2**-3 for bfloat16. A wrong kernel
# is still off by O(1) of the scale.
DTYPE_TOLERANCES = {"float16": 2.0 ** -6, "bfloat16": 2.0 ** -3}


def tolerance_for(dtype, floor: float = DEFAULT_TOLERANCE) -> float:
    """The default verification tolerance of an output of `dtype`, at least `floor`."""
    # a name as well as a dtype: numpy knows bfloat16 only once ml_dtypes is imported
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return max(floor, DTYPE_TOLERANCES.get(name, DEFAULT_TOLERANCE))


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
    note_parallel_work()
    return _flatten(result)


def _flatten(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def import_onnxruntime():
    """`onnxruntime` with its telemetry off, or None when it is not installed.

    Importing it writes a device id and an event database under ~/.cache/Microsoft unless
    ORT_DISABLE_TELEMETRY is set before the import (`disable_telemetry_events()` alone does not
    stop that); a user's own setting of the variable is kept.
    """
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    try:
        import onnxruntime
    except ImportError:
        return None
    onnxruntime.disable_telemetry_events()
    return onnxruntime


def onnxruntime_outputs(onnx_model, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
    """Outputs from ONNX Runtime, or None when it is not installed."""
    onnxruntime = import_onnxruntime()
    if onnxruntime is None:
        return None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    return [np.asarray(x) for x in session.run(None, dict(inputs))]


def onnxruntime_opset_problem(onnx_model) -> str | None:
    """Why ONNX Runtime cannot run a model of `onnx_model`'s opset, or None (also when it is
    not installed). Probes a one-node model stamped with the same opset, in milliseconds, so a
    model the verifier would refuse is refused before the compile."""
    onnxruntime = import_onnxruntime()
    opset = default_opset(onnx_model)
    if onnxruntime is None or opset is None or _onnxruntime_runs_opset(onnxruntime, opset):
        return None
    import onnx

    newest = next((version for version in range(onnx.defs.onnx_opset_version(), 0, -1)
                   if _onnxruntime_runs_opset(onnxruntime, version)), None)
    supported = f"opsets up to {newest}" if newest else "no opset tried"
    return (f"ONNX Runtime {onnxruntime.__version__}, the verifier, cannot run opset {opset} "
            f"(it runs {supported}); export the model with an older opset, or skip the "
            "check with --no-verify")


def default_opset(onnx_model) -> int | None:
    """The model's version of the default ("ai.onnx") operator set."""
    versions = [entry.version for entry in onnx_model.opset_import
                if entry.domain in ("", "ai.onnx")]
    return max(versions) if versions else None


def _onnxruntime_runs_opset(onnxruntime, opset: int) -> bool:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "opset_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    probe.ir_version = 8
    try:
        onnxruntime.InferenceSession(probe.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - ORT raises its own exception types for a refused opset
        return False
    return True


def compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], reference: str,
            tolerance: float | None = DEFAULT_TOLERANCE,
            tolerance_floor: float = DEFAULT_TOLERANCE) -> Verification:
    """Errors of `actual` against `expected`, each output scaled by its own magnitude.

    `tolerance=None` gives each output the default of its dtype (`tolerance_for`, at least
    `tolerance_floor`); a number applies to every output. The worst output is the one furthest
    beyond its own tolerance.
    """
    if len(actual) != len(expected):
        raise KorchError(f"the compiled model returns {len(actual)} outputs, the reference "
                         f"{len(expected)}")
    errors = [_output_error(got, want, index) for index, (got, want)
              in enumerate(zip(actual, expected))]
    if not errors:
        return Verification(reference, 0.0, 0.0, tolerance or tolerance_floor, True, 0)
    limits = [tolerance if tolerance is not None else tolerance_for(want.dtype, tolerance_floor)
              for want in expected]
    worst = max(range(len(errors)), key=lambda index: errors[index][1] / limits[index])
    max_abs = max(abs_error for abs_error, _ in errors)
    passed = all(rel_error <= limit for (_, rel_error), limit in zip(errors, limits))
    return Verification(reference, max_abs, errors[worst][1], limits[worst], passed, worst)


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
                             target, tolerance: float | None = DEFAULT_TOLERANCE,
                             tolerance_floor: float = DEFAULT_TOLERANCE) -> int | None:
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
        return not compare(actual, expected, "", tolerance, tolerance_floor).passed

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
