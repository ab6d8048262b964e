"""compile_model: ONNX or Relax in, a built Relax executable and a report out.

Two paths share everything but the middle, a pipeline of passes (pipeline/passes.py): the
stock path fuses with TVM's FuseOps/FuseTIR, the Korch path plans with PlanKorch (fission,
candidates, costing, optimal orchestration); both then apply the tuning log. One costing
session serves the whole compile, so both tune through the same tuning log with the same trial
budget, and comparing them compares orchestration only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ..backend.cuda import check_device_code, is_cuda, no_device_reason
from ..backend.executable import build_executable
from ..backend.target import configure_threads, target_tag
from ..backend.verify import (DEFAULT_TOLERANCE, compare, onnxruntime_opset_problem,
                              onnxruntime_outputs, random_inputs, run_executable)
from ..config import KorchConfig
from ..costing.cache_state import choose, for_model
from ..costing.session import CostingSession
from ..errors import KorchError
from ..frontend.onnx_import import (check_activations_fit, import_onnx, input_dtypes, input_shapes,
                                    load_onnx)
from ..support.scratch import scratch_directory

logger = logging.getLogger("korch_tvm.compile")

# CUDA kernels are compiled with fast math (approximate exp/erf/rsqrt), so their error against
# a float32 reference is larger than the CPU's, though still far below a wrong kernel's.
CUDA_TOLERANCE = 2e-3


def compile_model(model, target=None, *, korch: bool = True, tuning_logs: str | None = None,
                  trials: int | None = None, time_budget: float | None = None,
                  verify: bool = True, verify_tolerance: float | None = None,
                  input_shapes_override: Mapping[str, Sequence[int]] | None = None,
                  config: KorchConfig | None = None, measure_latency: bool = False,
                  fallback_on_mismatch: bool = False):
    """Compile `model` (ONNX path, `onnx.ModelProto` or Relax `IRModule`) for `target`
    (anything `KorchConfig.target` takes: "llvm", "cuda", a JSON dict, a `Target`).

    `korch` picks the path (Korch's orchestration, or TVM's stock fusion: the baseline);
    `tuning_logs` is the root of the on-disk logs, `trials` the compile's MetaSchedule budget
    and `time_budget` its seconds (see `KorchConfig`). `verify` checks the build against ONNX
    Runtime (or the unoptimised module); `input_shapes_override` ({input name: dims}) replaces
    an ONNX model's input shapes (needed where they are dynamic); `measure_latency` adds the
    built model's latency.

    Returns `(executable, report)`: a `tvm.relax.VMExecutable` (export it with
    `export_library`, run it with `relax.VirtualMachine`; on the CPU a
    `backend.executable.ExportedExecutable`, loaded from the library it was exported to once,
    with any library kernels' extension linked in, so `export_library` copies it) and a
    JSON-friendly dict saying what was done (tuning, plan, verification error, latency when
    `measure_latency`).

    `target`, `tuning_logs`, `trials`, `time_budget` and `verify_tolerance` override `config`
    only when given (None keeps the config's value; the config defaults to `KorchConfig()`).
    A `verify_tolerance` of None gives each output the tolerance of its dtype.

    When the Korch build's outputs differ from the reference, the error names the first chosen
    kernel from which they differ; with `fallback_on_mismatch` the model is rebuilt on the stock
    path instead (and the report's "fallback" says why).
    """
    started = time.perf_counter()
    config = (config or KorchConfig()).overridden(
        target=target, tuning_logs=tuning_logs, trials=trials, time_budget=time_budget,
        verify_tolerance=verify_tolerance)
    tvm_target = config.target  # resolved by KorchConfig
    threads = configure_threads(config.num_threads)
    source = _load_source(model, input_shapes_override, check_verifier=verify)
    timed_from = choose(config, source.relax_module)
    config = for_model(config, source.relax_module, timed_from)
    report = _base_report(source, config, tvm_target, korch, threads)
    report["cache_state"] = timed_from.as_dict()
    # One costing session for the whole compile, fallback included: the log is read once and
    # the builders start once; it stays open through the build and the verification, which
    # read the plan's log (a throw-away one lives in the session's scratch folder).
    with scratch_directory(), CostingSession.open(config) as session:
        optimized, plan = _optimize(source, config, korch, report, session)
        # exported once, with any library kernels' extension linked in, and loaded from that
        executable = build_executable(optimized, tvm_target)
        report["compile_seconds"] = round(time.perf_counter() - started, 3)
        if is_cuda(tvm_target):
            report["device_code"] = check_device_code(executable, tvm_target)
        missing_device = no_device_reason(tvm_target)
        if missing_device is not None:
            # Nothing can run: costs were predicted, and verification/latency need the device.
            report["verification"] = {"skipped": missing_device}
            verify = measure_latency = False
        if verify:
            executable = _verify(executable, source, config, plan, report,
                                 fallback_on_mismatch, session)
            report["compile_seconds"] = round(time.perf_counter() - started, 3)
    if measure_latency:
        report["latency_ms"] = measure_latency_ms(executable, tvm_target, source)
    return executable, report


def _base_report(source, config: KorchConfig, tvm_target, korch: bool, threads: int) -> dict:
    import tvm

    report = {
        "model": source.name,
        "target": str(tvm_target),
        "target_tag": target_tag(tvm_target),
        "korch": bool(korch),
        "threads": threads,
        "tvm_version": tvm.__version__,
        "trials_budget": config.trials,
        "trials_per_kernel": config.trials_per_kernel,
        "fast_math": config.fast_math,
    }
    if korch:
        report["memory_limit"] = config.memory_limit
    return report


def _optimize(source, config: KorchConfig, korch: bool, report: dict, session):
    """(optimized module, Korch plan or None) on the chosen path, costed through `session`;
    the path's report joins `report`. A model without operators has nothing to orchestrate:
    both paths build it as is."""
    if korch and not has_operators(source.relax_module):
        logger.info("the model has no operators, so there is nothing for Korch to orchestrate")
        korch = False
        report["korch_note"] = "no operators: built on the stock path"
    optimized, path_report, plan = _run_path(source.relax_module, config, korch, session)
    report.update(path_report)
    return optimized, plan


def _run_path(mod, config: KorchConfig, korch: bool, session):
    """(optimized module, the path's report, Korch plan or None): the Korch or the stock
    pipeline (pipeline/passes.py) run on `mod` through `session`; the schedule counts are
    read off the pipeline's result."""
    from .korch import korch_report
    from .passes import PlanKorch, StockPass, korch_pipeline, run_pipeline, stock_pipeline
    from .stock import stock_report

    if korch:
        planning = PlanKorch(config, session)
        optimized = run_pipeline(korch_pipeline(config, session, planning), mod, planning)
        plan = planning.last_plan
        return optimized, korch_report(plan, optimized, planning.planned_at), plan
    stock = StockPass(config, session)
    optimized = run_pipeline(stock_pipeline(config, session, stock), mod, stock)
    return optimized, stock_report(stock.last_choice, optimized, session.tuning_log), None


def has_operators(mod) -> bool:
    """Whether `main` computes anything (a model may pass its inputs straight to its outputs)."""
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(
        mod["main"].body, lambda expr: found.append(1) if isinstance(expr, relax.Call) else None)
    return bool(found)


def _verify(executable, source, config: KorchConfig, plan, report: dict, fallback: bool,
            session):
    """Check the build against the reference; on a mismatch fail with what to do, or rebuild
    on the stock path through `session` when `fallback` (the Korch path only). Returns the
    executable to keep."""
    target = config.target
    verification = verify_executable(executable, target, source, config.verify_tolerance,
                                     tolerance_floor=_tolerance_floor(target))
    report["verification"] = verification.as_dict()
    if verification.passed:
        return executable
    message = _mismatch_message(verification, plan, source, target, config.verify_tolerance)
    if plan is None or not fallback:
        hint = "; or rerun with --fallback-on-mismatch to use the stock plan" if plan else ""
        raise KorchError(message + "; " + _MISMATCH_ADVICE + hint)
    return _stock_fallback(source, config, message, report, session)


# What a user can do about a verification failure, in the order worth trying.
_MISMATCH_ADVICE = ("if the error is small, raise --verify-tolerance; try --exact-math; if it "
                    "persists, please report it with the model")


def _tolerance_floor(target) -> float:
    """The smallest default tolerance on `target` (CUDA's fast-math kernels need more)."""
    return CUDA_TOLERANCE if is_cuda(target) else DEFAULT_TOLERANCE


def tune_model(model, target=None, *, korch: bool = True, tuning_logs: str | None = None,
               trials: int | None = None, time_budget: float | None = None,
               input_shapes_override: Mapping[str, Sequence[int]] | None = None,
               config: KorchConfig | None = None) -> dict:
    """Fill the tuning logs with what compiling `model` would measure and tune; build nothing.

    The keyword arguments mean and override `config` as in `compile_model` (`tuning_logs`
    is required: without a log the results are lost). A later `compile_model` with the same
    settings then finds every kernel in the log. Returns the costing report (a dict).
    """
    started = time.perf_counter()
    config = (config or KorchConfig()).overridden(
        target=target, tuning_logs=tuning_logs, trials=trials, time_budget=time_budget)
    if not config.tuning_logs:
        raise KorchError("tuning needs --tuning-logs DIR: without a log the results are lost")
    threads = configure_threads(config.num_threads)
    source = _load_source(model, input_shapes_override, check_verifier=False)
    config = for_model(config, source.relax_module)
    with scratch_directory(), CostingSession.open(config) as session:
        if korch and has_operators(source.relax_module):
            from .korch import plan_korch

            report = plan_korch(source.relax_module, config, session=session).report()
        else:
            from .stock import run_stock

            _, report = run_stock(source.relax_module, config, session)
    report.update(model=source.name, korch=bool(korch), target_tag=target_tag(config.target),
                  threads=threads,
                  trials_budget=config.trials, trials_per_kernel=config.trials_per_kernel,
                  compile_seconds=round(time.perf_counter() - started, 3))
    return report


def _mismatch_message(verification, plan, source, target, tolerance) -> str:
    """One line: which output is wrong by how much and, on the Korch path, which kernel first.
    `tolerance` is the one asked for (None: each output's dtype default)."""
    message = (f"verification failed: output {verification.worst_output} differs from "
               f"{verification.reference} by {verification.max_rel_error:.3g} (relative), above "
               f"the tolerance {verification.tolerance:g}")
    if plan is None:
        return message
    import tvm

    from ..backend.verify import first_mismatching_kernel
    from . import korch
    from .passes import ApplyTuningLog, ShareIdenticalKernels

    # the steps the Korch pipeline itself ran after planning, on trial plans
    rewrite = tvm.transform.Sequential([ApplyTuningLog(plan.tuning_log.database, target),
                                        ShareIdenticalKernels()])

    from ..backend.rewrite import KERNEL_PREFIX, use_library_kernels

    # A chosen library kernel stays its library call in a trial plan that has its group at its
    # own position (a trial is a prefix of the chosen kernels, then one kernel per primitive).
    library = {g for g, i in enumerate(plan.chosen)
               if getattr(plan.costs.get(plan.kernel_keys[i]), "implementation", None)}

    def build_groups(groups):
        names = [f"{KERNEL_PREFIX}{g}" for g, group in enumerate(groups)
                 if g in library and frozenset(group) == frozenset(plan.chosen_groups[g])]
        partition = use_library_kernels(korch.partition_module(plan, groups), names, target)
        return build_executable(rewrite(partition), target)

    inputs = random_inputs(source.shapes, source.dtypes, 0)
    expected = reference_outputs(source, target, inputs)
    logger.info("verification failed; looking for the first kernel whose output differs")
    try:
        index = first_mismatching_kernel(build_groups, plan.chosen_groups, len(plan.graph.nodes),
                                         list(inputs.values()), expected, target, tolerance,
                                         _tolerance_floor(target))
    except Exception as err:  # noqa: BLE001 - the diagnosis must not hide the mismatch itself
        logger.warning("could not isolate the mismatching kernel: %s", err)
        return message
    if index is None:
        return message + ("; even one kernel per primitive differs, so the error is in the "
                          "operator lowering or import, not in a chosen kernel")
    nodes = sorted(plan.chosen_groups[index])
    ops = " + ".join(plan.graph.nodes[i].op_name.removeprefix("relax.") for i in nodes)
    return message + (f"; the first kernel whose output differs is k{index} ({ops}, primitives "
                      f"{','.join(map(str, nodes))})") + _wrong_record_note(plan, nodes, target)


def _wrong_record_note(plan, nodes, target) -> str:
    """Check the mismatching kernel's tuned records (a log tuned before records were checked
    may hold wrong ones) and say what was set aside."""
    from ..costing.measure import set_aside_wrong_records
    from ..kernels.fused import candidate_kernel

    if not all(plan.graph.nodes[i].fusible for i in nodes):
        return ""
    log = plan.tuning_log
    if not set_aside_wrong_records(log, candidate_kernel(plan.graph, nodes), target):
        return ""
    return ("; its fastest tuned schedule computes something else and is now set aside in the "
            f"log, so compile again (`korch-tvm logs {os.path.dirname(log.directory)} --check` "
            "checks every kernel's)")


def _stock_fallback(source, config, reason, report, session):
    """Rebuild on the stock path, through the compile's `session`, after a Korch mismatch;
    the report keeps both verifications."""
    logger.warning("%s; falling back to the stock plan", reason)
    optimized, stock_report, _ = _run_path(source.relax_module, config, False, session)
    executable = build_executable(optimized, config.target)
    verification = verify_executable(executable, config.target, source, config.verify_tolerance,
                                     tolerance_floor=_tolerance_floor(config.target))
    report["fallback"] = {"reason": reason, "path": "stock",
                          "korch_verification": report["verification"], "stock": stock_report}
    report["verification"] = verification.as_dict()
    report["modelled_ms"] = stock_report["modelled_ms"]
    if not verification.passed:
        raise KorchError(f"{reason}; the stock plan differs too (by "
                         f"{verification.max_rel_error:.3g}), so the reference or the model is at "
                         f"fault; {_MISMATCH_ADVICE}")
    return executable


class _Source:
    """The model in the forms later stages need: Relax module, original ONNX, input specs."""

    def __init__(self, name, relax_module, onnx_model, shapes, dtypes):
        self.name = name
        self.relax_module = relax_module
        self.onnx_model = onnx_model
        self.shapes = shapes
        self.dtypes = dtypes


def _load_source(model, shape_overrides, check_verifier: bool = True) -> _Source:
    """The model with static input shapes; for ONNX, refused before any compile work when its
    activations cannot fit in memory or (with `check_verifier`) ONNX Runtime cannot run its
    opset."""
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
    check_activations_fit(proto, shapes)
    problem = onnxruntime_opset_problem(proto) if check_verifier else None
    if problem:
        raise KorchError(problem)
    relax_module = import_onnx(proto, shape_overrides)
    return _Source(name, relax_module, proto, shapes, input_dtypes(proto))


def verify_executable(executable, target, source: _Source, tolerance: float | None,
                      seed: int = 0, tolerance_floor: float = DEFAULT_TOLERANCE):
    """Compare the built model with ONNX Runtime (when possible) or the unoptimised Relax module.

    `executable` was built for `target` from `source`; it runs on random inputs drawn with
    `seed`. `tolerance=None`: each output's dtype default, at least `tolerance_floor`. Returns
    the comparison (`backend.verify.compare`)."""
    inputs = random_inputs(source.shapes, source.dtypes, seed)
    actual = run_executable(executable, target, list(inputs.values()))
    expected, reference = reference_outputs(source, target, inputs, with_name=True)
    return compare(actual, expected, reference, tolerance, tolerance_floor)


def reference_outputs(source: _Source, target, inputs, with_name: bool = False):
    """The outputs to match for `inputs` ({name: array}): ONNX Runtime's when it can run the
    model, else those of `source`'s unoptimised Relax module (plain `tvm.compile` for `target`:
    no fusion, no tuning, no fission). With `with_name`, (outputs, "onnxruntime" or
    "relax-unoptimised")."""
    import tvm

    expected, reference = None, "relax-unoptimised"
    if source.onnx_model is not None:
        expected = onnxruntime_outputs(source.onnx_model, inputs)
        reference = "onnxruntime"
    if expected is None:
        reference = "relax-unoptimised"
        baseline = build_executable(source.relax_module, target)
        expected = run_executable(baseline, target, list(inputs.values()))
    return (expected, reference) if with_name else expected


def measure_latency_ms(executable, target, source: _Source, repeat: int = 20) -> dict:
    """Median and spread (p10, p90) of `executable`'s end-to-end latency on `target`, in
    milliseconds over `repeat` calls on random inputs shaped as `source`'s (warm-up excluded)."""
    import tvm
    from tvm import relax

    from ..backend.target import device_for

    device = device_for(target)
    vm = relax.VirtualMachine(executable, device)
    inputs = random_inputs(source.shapes, source.dtypes)
    args = [tvm.runtime.tensor(x, device) for x in inputs.values()]
    timer = vm.time_evaluator("main", device, number=1, repeat=repeat, min_repeat_ms=0)
    result = timer(*args)
    samples = np.array(result.results) * 1e3
    return {"median": float(np.median(samples)), "p10": float(np.percentile(samples, 10)),
            "p90": float(np.percentile(samples, 90)), "repeat": repeat}

