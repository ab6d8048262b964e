"""The Korch path: fission -> primitive graph -> candidates -> costing -> orchestration -> rewrite.

Each stage takes the previous stage's value and returns a new one; this file only composes
them, so reading `plan_korch` and `rewrite_plan` tells the whole story of a Korch compile
(the Korch pipeline in passes.py runs the same steps as passes; `korch_report` is its report).
`plan_korch` stops before the rewrite, so `korch-tvm explain` shows the very plan a compile
would build without building it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

import tvm

from ..backend.rewrite import library_kernel_names, rewrite_with_plan
from ..backend.schedule_counts import schedule_counts
from ..config import KorchConfig
from ..costing.cache_state import for_model
from ..costing.kernel_costs import summarize
from ..costing.measure import KernelCost
from ..costing.session import CostingSession, open_tuning_log
from ..errors import error_summary
from ..kernels.fused import build_partition_module
from ..kernels.kinds import module_kernel_kinds, plan_kind_times
from ..layout.activations import LAYOUTS, best_layout, layout_variants, plan_layouts
from ..layout.regions import (MIXED, cheapest_layouts, region_module, split_regions,
                              stitched_module, switch_module, worth_stitching)
from ..support import interrupts
from .korch_costs import Planned, distinct_costs, tune_once
from .layout_plan import KorchPlan, lower_layout, plan_in_layout
from .layout_probe import screen_layouts

logger = logging.getLogger("korch_tvm.passes")


def plan_korch(mod: tvm.IRModule, config: KorchConfig, *, predict_only: bool = False,
               measure_with: Callable[[dict], Mapping[str, KernelCost]] | None = None,
               session: CostingSession | None = None) -> KorchPlan:
    """Fission, candidates, costing and orchestration of `main`; nothing is rewritten or built.

    With `predict_only` no kernel is measured or tuned: costs come from the tuning log where it
    has a record and from the cost model everywhere else (fast; the plan may differ from the
    one a compile, which measures, would choose). `measure_with({key: kernel module})` replaces
    the profiler's default-schedule measurement (a study replays another run's numbers).

    With ``config.layout == "auto"`` a model with convolutions is planned in each activation
    layout (layout/activations.py), then with a layout per region (layout/regions.py) unless
    the layout probe found that one cannot pay, and the plan of least modelled latency is
    kept. The trial budget is the compile's, not each layout's: the kernels of every layout's
    plan are tuned in one round, by their latency share (`tune_once`).
    With ``config.memory_limit == "stock"`` the plan needs no more activation storage than TVM's
    own fusion groups (orchestration/memory_plan.py). `session`: the compile's costing session
    (default: one opened here on `config`'s tuning log).
    """
    if session is None:  # opened here: its log outlives it, in the plan
        config = for_model(config, mod)
        with CostingSession.open(config, *open_tuning_log(config)) as opened:
            return plan_korch(mod, config, predict_only=predict_only, measure_with=measure_with,
                              session=opened)
    # One session for every layout planned: the log is read once, and a kernel two of them
    # share is costed once, through one runner and builder pool, within one time budget.
    variants, lowerings, regions_may_pay = layout_variants(mod, config.layout), {}, True
    if (config.layout == "auto" and len(variants) > 1 and not predict_only
            and measure_with is None):  # probed first: their lowering is kept for the plans
        lowerings, regions_may_pay = screen_layouts(
            {layout: lower_layout(variant, config) for layout, variant in variants.items()},
            session)
        variants = {layout: variants[layout] for layout in lowerings}

    # Untuned, a layout whose optimistic plan models above a layout planned before it cannot
    # win: it stops before its fusion groups are measured (the probe's fastest goes first).
    bounded = not (config.tunes or predict_only or measure_with is not None)
    planned_ms, cannot_win = [], []  # modelled ms of each layout planned; layouts left out

    def plan_in(layout, variant, time_budget):
        pending = plan_in_layout(mod, variant, layout, config.with_changes(time_budget=time_budget),
                                 predict_only=predict_only, measure_with=measure_with,
                                 session=session, lowering=lowerings.pop(layout, None),
                                 beat_ms=min(planned_ms) if bounded and planned_ms else None)
        if pending is None:  # cost_what_plans_need has said why
            cannot_win.append(layout)
        elif bounded:
            planned_ms.append(pending.finish({}, None).modelled_ms)
        return pending

    planned = {layout: pending for layout, pending in
               plan_layouts(variants, plan_in, session.seconds_left()).items() if pending}
    regions = None
    if (config.layout == "auto" and regions_may_pay
            and len(planned) + len(cannot_win) == len(LAYOUTS)):
        mixed = _try_region_layouts(mod, config, session, predict_only=predict_only,
                                    measure_with=measure_with)
        if mixed is not None:
            planned[MIXED], regions = mixed
    tuned, tuning_seconds = {}, None
    if config.tunes and not predict_only:
        tuned, tuning_seconds = tune_once(planned.values(), session)
    return _cheapest_plan({layout: pending.finish(tuned, tuning_seconds)
                           for layout, pending in planned.items()}, regions, cannot_win)


def _try_region_layouts(mod: tvm.IRModule, config: KorchConfig, session: CostingSession, *,
                        predict_only: bool, measure_with):
    """`_plan_region_layouts` within what is left of the time budget; None, with a warning,
    when it fails: an optional plan must not sink the compile."""
    try:
        left = session.seconds_left()
        return _plan_region_layouts(mod, config.with_changes(time_budget=left), session,
                                    predict_only=predict_only, measure_with=measure_with)
    except Exception as err:  # noqa: BLE001 - see the docstring
        if interrupts.pressed():  # a Ctrl-C TVM re-raised as an error
            raise
        logger.warning("a layout per region failed, so it is not considered: %s",
                       error_summary(str(err) or repr(err)))
        return None


def _cheapest_plan(plans: dict[str, KorchPlan], regions: list[dict] | None,
                   stopped: list[str]) -> KorchPlan:
    """The plan of least modelled latency, with every layout's outcome (`stopped`: those that
    could not win, left unplanned) and the compile's costing (each kernel once) in its
    report."""
    layouts = {layout: {"modelled_ms": plan.modelled_ms, "tuning": summarize(plan.costs.values())}
               for layout, plan in plans.items()}
    if regions is not None:
        layouts[MIXED]["regions"] = regions
    best = best_layout({layout: plan.modelled_ms for layout, plan in plans.items()})
    return replace(plans[best], layouts=layouts, layouts_stopped=tuple(stopped),
                   tuning=summarize(distinct_costs(plan.costs for plan in plans.values())))


def _plan_region_layouts(mod: tvm.IRModule, config: KorchConfig, session: CostingSession, *,
                         predict_only: bool, measure_with
                         ) -> tuple[Planned, list[dict]] | None:
    """The model with the layout of each region chosen (layout/regions.py), planned, and what
    was chosen per region; None when the model has fewer than two regions or a layout per
    region is not predicted to pay (`worth_stitching`). Regions and switches are costed
    without tuning or new measurements (the log, else the cost model): only the stitched
    model's plan is measured."""
    folded, regions = split_regions(mod)
    if len(regions) < 2:
        return None
    # A region's cost says which layout it prefers; the activation-storage limit is the whole
    # plan's to meet (on SSDlite its rounds took 12 of region costing's 65 profiled seconds).
    costing = config.with_changes(trials=0, trials_per_kernel=None, time_budget=None,
                                  memory_limit="none")

    def modelled_ms(module, layout):
        return plan_in_layout(module, module, layout, costing, predict_only=measure_with is None,
                              measure_with=measure_with,
                              session=session).finish({}, None).modelled_ms

    logger.info("layout per region: costing %d regions in %s", len(regions), " and ".join(LAYOUTS))
    modules = [{layout: region_module(folded, region, layout) for layout in LAYOUTS}
               for region in regions]
    with _quiet(logger):  # a line per region plan says nothing a user needs
        region_ms = [{layout: modelled_ms(module, layout) for layout, module in variants.items()}
                     for variants in modules]
        switch_ms = [0.0 if (module := switch_module(folded, region)) is None
                     else modelled_ms(module, "NCHW") for region in regions[:-1]]
    layouts, total_ms = cheapest_layouts(region_ms, switch_ms)
    logger.info("layout per region (%d regions): %s, predicted %.3f ms (one layout: %s)",
                len(regions), " ".join(layouts), total_ms, ", ".join(
                    f"{layout} {sum(costs[layout] for costs in region_ms):.3f} ms"
                    for layout in LAYOUTS))
    if not worth_stitching(layouts, total_ms, region_ms):
        return None
    stitched = stitched_module(folded, regions, layouts,
                               [variants[layout] for variants, layout in zip(modules, layouts)])
    plan = plan_in_layout(mod, stitched, MIXED, config,
                          predict_only=predict_only, measure_with=measure_with,
                          session=session)
    return plan, [{"bindings": [region.start, region.stop], "layout": layout,
                   "predicted_ms": {name: round(ms, 4) for name, ms in costs.items()}}
                  for region, layout, costs in zip(regions, layouts, region_ms)]


@contextmanager
def _quiet(log: logging.Logger):
    level = log.level
    log.setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    try:
        yield
    finally:
        log.setLevel(level)


def rewrite_plan(plan: KorchPlan):
    """The rewrite step: `plan`'s chosen kernels as `main`, their schedules from the plan's
    tuning log; returns (module ready for tvm.compile, compile report)."""
    rewrite_started = time.perf_counter()
    optimized = rewrite_with_plan(plan.graph, plan.chosen_groups, plan.tuning_log.database,
                                  plan.target, library_kernels(plan))
    return optimized, korch_report(plan, optimized, rewrite_started)


def library_kernels(plan: KorchPlan) -> list[str]:
    """The names in `partition_module(plan)` (`korch_k<g>`) of the chosen kernels whose cost
    is a library call's (costing/library_costs.py): they are built as that call."""
    return library_kernel_names([plan.kernel_keys[i] for i in plan.chosen], plan.costs)


def partition_module(plan: KorchPlan, groups: Sequence[Iterable[int]] | None = None
                     ) -> tvm.IRModule:
    """`plan`'s chosen kernels (or the node `groups` given, in execution order) as `main`, one
    unscheduled PrimFunc per group: what the Korch pipeline's planning pass returns, for the
    tuning log to schedule, and what the mismatch diagnosis builds its trial plans from."""
    return build_partition_module(plan.graph, plan.chosen_groups if groups is None else groups)


def korch_report(plan: KorchPlan, optimized: tvm.IRModule, rewrite_started: float) -> dict:
    """The Korch path's report: `plan`'s, with the schedule counts of `optimized` (the plan
    rewritten, its schedules applied) and the seconds since `rewrite_started` (the
    `time.perf_counter()` at which the rewrite began) as the rewrite's stage time."""
    report = plan.report()
    chosen_keys = {plan.kernel_keys[i] for i in plan.chosen} - {None}
    report.update(schedule_counts(optimized, [plan.kernel_modules[key] for key in chosen_keys],
                                  plan.tuning_log))
    report["stage_seconds"] = {**plan.stage_seconds,
                               "rewrite": round(time.perf_counter() - rewrite_started, 3)}
    report["modelled_ms"] = report["plan"]["modelled_ms"]
    _report_library_kernels(report, plan, optimized)
    if plan.in_model_factors:
        report["modelled_isolated_ms"] = sum(kernel["isolated_ms"] or 0.0
                                             for kernel in report["plan"]["kernels"]) \
            + report["plan"]["kernel_calls"] * plan.call_seconds * 1e3
    # kinds are read from the kernels as written: scheduling (inlined padding, dropped unit
    # loops) hides the convolution windows they are told apart by
    unscheduled = partition_module(plan)
    report["kind_ms"] = plan_kind_times(unscheduled, report["plan"])  # conv 1x1 / matmul / ...
    report["kernel_kinds"] = module_kernel_kinds(unscheduled)
    return report


def _report_library_kernels(report: dict, plan: KorchPlan, optimized: tvm.IRModule) -> None:
    """Each chosen kernel's implementation ("tvm" or the library call's name), how many are
    library calls, and the extension functions `optimized` calls (an export must link them:
    library.export_library, or the LibraryExecutable compile_model returns)."""
    from ..library import library_calls

    for kernel in report["plan"]["kernels"]:
        cost = plan.costs.get(kernel["key"]) if kernel["key"] is not None else None
        kernel["implementation"] = getattr(cost, "implementation", None) or "tvm"
    report["plan"]["library_kernels"] = sum(kernel["implementation"] != "tvm"
                                            for kernel in report["plan"]["kernels"])
    report["library_calls"] = sorted(library_calls(optimized))


def run_korch(mod: tvm.IRModule, config: KorchConfig):
    """Orchestrate `main` of `mod` as `config` says (`plan_korch`, then `rewrite_plan`);
    returns (module ready for tvm.compile, report dict)."""
    return rewrite_plan(plan_korch(mod, config))
