"""compile_model: ONNX or Relax in, a built Relax executable and a report out.

Two paths share everything but the middle: the stock path fuses with TVM's FuseOps/FuseTIR,
the Korch path runs KorchPass (fission, candidates, costing, optimal orchestration). Both tune
through the same tuning log with the same trial budget, so comparing them compares
orchestration only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from .config import KorchConfig
from .errors import KorchError
from .frontend import import_onnx, input_dtypes, input_shapes, load_onnx
from .target import configure_threads, parse_target, target_tag
from .verify import DEFAULT_TOLERANCE, compare, onnxruntime_outputs, random_inputs, run_executable

logger = logging.getLogger("korch_tvm.compile")


def compile_model(model, target="llvm", *, korch: bool = True, tuning_logs: str | None = None,
                  trials: int = 0, time_budget: float | None = None, verify: bool = True,
                  verify_tolerance: float = DEFAULT_TOLERANCE,
                  input_shapes_override: Mapping[str, Sequence[int]] | None = None,
                  config: KorchConfig | None = None, measure_latency: bool = False):
    """Compile `model` (ONNX path, `onnx.ModelProto` or Relax `IRModule`) for `target`.

    Returns `(executable, report)`: a `tvm.relax.Executable` (export it with
    `export_library`, run it with `relax.VirtualMachine`) and a JSON-friendly dict saying what
    was done (tuning, plan, verification error, latency when `measure_latency`).
    """
    import tvm

    started = time.perf_counter()
    config = (config or KorchConfig()).with_changes(
        target=target, tuning_logs=tuning_logs, trials=int(trials), time_budget=time_budget)
    if config.trials < 0:
        raise KorchError(f"--trials must be >= 0, got {config.trials}")
    tvm_target = parse_target(config.target)
    threads = configure_threads(config.num_threads)
    source = _load_source(model, input_shapes_override)
    report = {
        "model": source.name,
        "target": str(tvm_target),
        "target_tag": target_tag(tvm_target),
        "korch": bool(korch),
        "threads": threads,
        "tvm_version": tvm.__version__,
        "trials_budget": config.trials,
    }
    if korch:
        from .passes import run_korch

        optimized, korch_report = run_korch(source.relax_module, config.with_changes(target=tvm_target))
        report.update(korch_report)
    else:
        from .stock import run_stock

        optimized, stock_report = run_stock(source.relax_module, config.with_changes(target=tvm_target))
        report.update(stock_report)
    executable = tvm.compile(optimized, target=tvm_target)
    report["compile_seconds"] = round(time.perf_counter() - started, 3)
    if verify:
        verification = verify_executable(executable, tvm_target, source, verify_tolerance)
        report["verification"] = verification.as_dict()
        if not verification.passed:
            raise KorchError(
                f"verification failed: output {verification.worst_output} differs from "
                f"{verification.reference} by {verification.max_rel_error:.3g} (relative), above "
                f"the tolerance {verification.tolerance:g}")
    if measure_latency:
        report["latency_ms"] = measure_latency_ms(executable, tvm_target, source)
    return executable, report


class _Source:
    """The model in the forms later stages need: Relax module, original ONNX, input specs."""

    def __init__(self, name, relax_module, onnx_model, shapes, dtypes):
        self.name = name
        self.relax_module = relax_module
        self.onnx_model = onnx_model
        self.shapes = shapes
        self.dtypes = dtypes


def _load_source(model, shape_overrides) -> _Source:
    import tvm

    if isinstance(model, tvm.IRModule):
        if not any(gv.name_hint == "main" for gv, _ in model.functions_items()):
            raise KorchError("the Relax module has no 'main' function")
        params = model["main"].params
        shapes, dtypes = {}, {}
        for param in params:
            ty = param.ty
            try:
                shapes[param.name] = [int(s) for s in ty.shape.values]
            except (AttributeError, TypeError):
                raise KorchError(f"parameter '{param.name}' of main has no static tensor shape; "
                                 "only static shapes are supported") from None
            dtypes[param.name] = str(ty.dtype)
        return _Source("relax-module", model, None, shapes, dtypes)
    if isinstance(model, (str, os.PathLike)):
        name = os.path.basename(os.fspath(model))
    else:
        name = getattr(getattr(model, "graph", None), "name", "onnx-model")
    proto = load_onnx(model)
    shapes = input_shapes(proto, shape_overrides)
    relax_module = import_onnx(proto, shape_overrides)
    return _Source(name, relax_module, proto, shapes, input_dtypes(proto))


def verify_executable(executable, target, source: _Source, tolerance: float, seed: int = 0):
    """Compare the built model with ONNX Runtime (when possible) or the unoptimised Relax module."""
    import tvm

    inputs = random_inputs(source.shapes, source.dtypes, seed)
    actual = run_executable(executable, target, list(inputs.values()))
    expected, reference = None, "relax-unoptimised"
    if source.onnx_model is not None:
        expected = onnxruntime_outputs(source.onnx_model, inputs)
        reference = "onnxruntime"
    if expected is None:
        reference = "relax-unoptimised"
        baseline = tvm.compile(source.relax_module, target=target)
        expected = run_executable(baseline, target, list(inputs.values()))
    return compare(actual, expected, reference, tolerance)


def measure_latency_ms(executable, target, source: _Source, repeat: int = 20) -> dict:
    """Median and spread of end-to-end latency in milliseconds (warm-up call excluded)."""
    import tvm
    from tvm import relax

    from .target import device_for

    device = device_for(target)
    vm = relax.VirtualMachine(executable, device)
    inputs = random_inputs(source.shapes, source.dtypes)
    args = [tvm.runtime.tensor(x, device) for x in inputs.values()]
    timer = vm.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=0)
    result = timer(*args)
    samples = np.array(result.results) * 1e3
    return {"median": float(np.median(samples)), "p10": float(np.percentile(samples, 10)),
            "p90": float(np.percentile(samples, 90)), "repeat": repeat}

