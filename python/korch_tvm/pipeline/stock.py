"""TVM's stock Relax path: LegalizeOps, FuseOps, FuseTIR, MetaSchedule tuning, apply the log.

It is the baseline Korch is measured against, so it tunes through the same tuning log with the
same trial budget as the Korch path.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import tvm
from tvm import relax

from ..backend.rewrite import apply_tuning_log
from ..backend.schedule_counts import schedule_counts
from ..config import KorchConfig
from ..costing.cache_state import for_model
from ..costing.in_model import load_in_model_times
from ..costing.kernel_costs import merge_summaries
from ..costing.session import CostingSession
from ..kernels.fused import kernel_module, structural_key
from ..kernels.kinds import kind_times, module_kernel_kinds
from ..kernels.weight_packing import mark_layout_free_weights
from ..layout.activations import in_best_layout
from ..lowering.fast_math import legalize_ops

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def stock_fusion(mod: tvm.IRModule, target, *, fast_math: bool = True) -> tvm.IRModule:
    """The fusion TVM's own pipeline performs (relax.get_pipeline("zero") without the tuning),
    with the kernels' constant weights marked layout free and the same legalization of exp,
    sigmoid, tanh and erf (lowering/fast_math.py) as Korch's kernels."""
    with target:
        fused = tvm.transform.Sequential([
            legalize_ops(fast_math),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ])(mod)
    return mark_layout_free_weights(fused)


def kernel_calls(mod: tvm.IRModule, func_name: str = "main") -> Counter:
    """How often `main` calls each PrimFunc (by name): the weight of its cost in the model."""
    calls = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(CALL_TIR):
            calls[expr.args[0].name_hint] += 1

    relax.analysis.post_order_visit(mod[func_name], visit)
    return calls


@dataclass(frozen=True)
class StockChoice:
    """The stock path up to the schedules: the fused module of the cheapest layout, its kernels
    (name -> standalone kernel module) and its report (without the schedule counts, which are
    read off the scheduled module: `stock_report`)."""

    fused: tvm.IRModule
    kernels: dict[str, tvm.IRModule]
    report: dict


def run_stock(mod: tvm.IRModule, config: KorchConfig, session: CostingSession | None = None):
    """Fuse, tune (within the budget, reusing the log) and apply schedules; returns (mod, report).

    `choose_stock_layout`, then the tuning log applied (`apply_tuning_log`): the steps of the
    stock pipeline (pipeline/passes.py) as plain calls. `session`: the compile's costing
    session (None: one opened for this call).
    """
    if session is None:
        with CostingSession.open(for_model(config, mod)) as opened:
            return run_stock(mod, config, opened)
    choice = choose_stock_layout(mod, config, session)
    tuned = apply_tuning_log(choice.fused, session.tuning_log.database, session.target)
    return tuned, stock_report(choice, tuned, session.tuning_log)


def choose_stock_layout(mod: tvm.IRModule, config: KorchConfig,
                        session: CostingSession | None = None) -> StockChoice:
    """Stock fusion and costing (measured, tuned within the budget) of `mod` in the layout of
    least modelled latency; nothing is scheduled.

    Layouts are chosen as Korch chooses them (layout/activations.py): with "auto", a model with
    convolutions is fused in each layout and the one of least modelled latency is kept.
    Every layout is costed through `session` (None: one opened for this call), so they share
    its log, runner, builder pool and time budget.
    """
    if session is None:
        with CostingSession.open(for_model(config, mod)) as opened:
            return choose_stock_layout(mod, config, opened)
    best, results = in_best_layout(
        mod, config.layout,
        lambda _, variant, budget: _stock_in_layout(variant, config, session, budget),
        lambda result: result.report["modelled_ms"], session.seconds_left())
    layouts = {layout: {"modelled_ms": result.report["modelled_ms"],
                        "tuning": result.report["tuning"]}
               for layout, result in results.items()}
    chosen = results[best]
    return replace(chosen, report={
        **chosen.report, "layout": best, "layouts": layouts,
        "tuning": merge_summaries(entry["tuning"] for entry in layouts.values())})


def stock_report(choice: StockChoice, tuned: tvm.IRModule, tuning_log) -> dict:
    """The stock path's report: `choice`'s, with the schedule counts of `tuned` (its fused
    module with the schedules of `tuning_log` applied)."""
    return {**choice.report, **schedule_counts(tuned, choice.kernels.values(), tuning_log)}


def _stock_in_layout(mod: tvm.IRModule, config: KorchConfig, session: CostingSession,
                     time_budget: float | None) -> StockChoice:
    """`choose_stock_layout` of one layout variant, costed within `time_budget` (its part of
    the compile's)."""
    fused = stock_fusion(mod, session.target, fast_math=config.fast_math)
    calls = kernel_calls(fused)
    kernels = {name: kernel_module(fused[name]) for name in calls}
    costing = session.profile(kernels, weights=dict(calls), time_budget=time_budget)
    kinds = module_kernel_kinds(fused)
    keys = {name: structural_key(kernels[name]) for name in calls}
    # The same in-model scaling as Korch's plan (costing/in_model.py), so both modelled numbers
    # compare.
    in_model = load_in_model_times(costing.tuning_log.directory)
    factors = in_model.factors({keys[name]: kinds.get(name, "memory") for name in calls})
    isolated_ms = {name: _finite_ms(costing.costs[name].seconds) for name in calls}
    kernel_ms = {name: _finite_ms(costing.costs[name].seconds * factors.get(keys[name], 1.0))
                 for name in calls}
    call_seconds = session.call_seconds()  # the VM's time per call (costing/call_overhead.py)
    report = {
        "kernel_calls": sum(calls.values()),
        "call_overhead_us": call_seconds * 1e6,
        "tuning": costing.summary,
        "modelled_ms": _total_ms(kernel_ms, calls, call_seconds),
        # per kernel (ms of one call) and per kind (ms per model run), for the bench's profile
        "kernels": [{"name": name, "calls": count, "ms": kernel_ms[name],
                     "isolated_ms": isolated_ms[name], "kind": kinds.get(name, "memory"),
                     "key": keys[name]}
                    for name, count in calls.items()],
        "kind_ms": kind_times(fused, kernel_ms, calls),
        "kernel_kinds": kinds,
    }
    if in_model:
        report["modelled_isolated_ms"] = _total_ms(isolated_ms, calls, call_seconds)
    return StockChoice(fused, kernels, report)


def _total_ms(kernel_ms, calls, call_seconds: float) -> float:
    """Sum over calls, each with the VM's `call_seconds`; an unmeasurable kernel makes the
    total infinite."""
    return sum(math.inf if kernel_ms[name] is None else (kernel_ms[name] + call_seconds * 1e3)
               * count for name, count in calls.items())


def _finite_ms(seconds: float) -> float | None:
    return seconds * 1e3 if math.isfinite(seconds) else None
