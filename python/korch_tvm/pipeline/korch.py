"""The Korch path: fission -> primitive graph -> candidates -> costing -> orchestration -> rewrite.

Each stage takes the previous stage's value and returns a new one; this file only composes
them, so reading `plan_korch` and `rewrite_plan` tells the whole story of a Korch compile
(`KorchPass`, in passes.py, runs the two).
`plan_korch` stops before the rewrite, so `korch-tvm explain` shows the very plan a compile
would build without building it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import tvm

from ..backend.rewrite import rewrite_with_plan
from ..backend.schedule_counts import schedule_counts
from ..candidates.enumerate import enumerate_candidates
from ..candidates.gpu_rules import rules_for_target
from ..candidates.partition import partition_graph
from ..config import MEMORY_LIMITS, KorchConfig
from ..costing.cost_model import predict_kernels
from ..costing.in_model import load_in_model_times, scaled_costs
from ..costing.kernel_costs import default_schedule_costs, open_tuning_log, summarize
from ..costing.measure import KernelCost
from ..errors import KorchError, error_summary
from ..graph.primitive_graph import PrimitiveGraph
from ..kernels.fused import build_partition_module, distinct_kernels
from ..kernels.kinds import kernel_kind, module_kernel_kinds, plan_kind_times
from ..layout.activations import LAYOUTS, best_layout, plan_layouts
from ..layout.regions import (MIXED, cheapest_layouts, region_module, split_regions,
                              stitched_module, switch_module)
from ..lowering.fission import lower_to_primitives, lowering_stats
from ..orchestration.memory_plan import StorageModel
from ..orchestration.problems import (orchestration_problems, plan_groups, plan_report,
                                      prune_by_prediction)
from ..orchestration.solver import Plan, solve_orchestration
from .korch_costs import (Planned, cost_what_plans_need, distinct_costs, logged_or_predicted,
                          profiler_measurement, tune_once, work_anchors)
from ..support import interrupts
from ..support.memo import KeyedMemo

logger = logging.getLogger("korch_tvm.passes")


class _StageClock:
    """Seconds spent per stage, for the report."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._last, 3)
        self._last = now


@dataclass(frozen=True)
class KorchPlan:
    """Everything planning decided, before any module is rewritten or built."""

    source: tvm.IRModule       # the module as given
    lowered: tvm.IRModule      # in the plan's layout, after operator fission
    graph: PrimitiveGraph
    pieces: list               # primitive-id sets, one orchestration problem each
    candidates: list           # every enumerated Candidate
    kept: list[int]            # candidate indices that survived pruning by prediction
    kernel_keys: list          # structural key of each candidate (None: opaque)
    kernel_modules: dict       # key -> standalone kernel module
    costs: dict[str, KernelCost]
    problems: list             # planning.Subproblem per piece
    plans: list                # orchestration.Plan per piece
    chosen: list[int]          # candidate indices of the chosen kernels, in execution order
    tuning_log: object
    target: object
    stage_seconds: dict
    in_model_factors: dict = field(default_factory=dict)  # key -> in-model/isolated used
    layout: str = "NCHW"       # activation layout of the plan (layout/activations.py)
    in_layout: tvm.IRModule | None = None  # source in that layout, before fission
    layouts: dict = field(default_factory=dict)  # every layout planned -> modelled_ms, tuning
    tuning: dict = field(default_factory=dict)  # what the compile measured and tuned (costing)
    storage: StorageModel | None = None  # for the planned-storage report (orchestration/memory_plan.py)

    @property
    def modelled_ms(self) -> float:
        """Sum of the chosen kernels' costs (inf when some piece found no plan)."""
        return sum(plan.objective for plan in self.plans) * 1e3

    @property
    def chosen_groups(self) -> list[frozenset[int]]:
        return [self.candidates[i].nodes for i in self.chosen]

    def opaque_primitives(self) -> list[tuple[int, str]]:
        """(id, op) of primitives Korch cannot fuse: they stay plain bindings, as in the stock path."""
        return [(node.index, node.op_name) for node in self.graph.nodes if not node.fusible]

    def report(self) -> dict:
        """The planning part of the compile report (JSON-friendly)."""
        plan = plan_report(self.graph, self.candidates, self.kept, self.problems, self.plans,
                           self.chosen, self.kernel_keys, self.costs, self.in_model_factors,
                           self.storage)
        plan["opaque_ops"] = sorted({op for _, op in self.opaque_primitives()})
        layouts = self.layouts or {self.layout: {"modelled_ms": self.modelled_ms,
                                                 "tuning": summarize(self.costs.values())}}
        return {
            "layout": self.layout,
            "layouts": layouts,
            "lowering": lowering_stats(self.source, self.lowered),
            # every layout planned, each kernel once: what this compile measured and tuned
            "tuning": self.tuning or summarize(self.costs.values()),
            "plan": plan,
        }


def plan_korch(mod: tvm.IRModule, config: KorchConfig, *, predict_only: bool = False,
               measure_with: Callable[[dict], Mapping[str, KernelCost]] | None = None
               ) -> KorchPlan:
    """Fission, candidates, costing and orchestration of `main`; nothing is rewritten or built.

    With `predict_only` no kernel is measured or tuned: costs come from the tuning log where it
    has a record and from the cost model everywhere else (fast; the plan may differ from the
    one a compile, which measures, would choose). `measure_with({key: kernel module})` replaces
    the profiler's default-schedule measurement (a study replays another run's numbers).

    With ``config.layout == "auto"`` a model with convolutions is planned in each activation
    layout (layout/activations.py), then with a layout per region (layout/regions.py), and the plan of
    least modelled latency is kept. The trial budget is the compile's, not each layout's: the
    kernels of every layout's plan are tuned in one round, by their latency share (`tune_once`).
    With
    ``config.memory_limit == "stock"`` the plan needs no more activation storage than TVM's own
    fusion groups (orchestration/memory_plan.py).
    """
    if config.memory_limit not in MEMORY_LIMITS:
        raise KorchError(f"unknown memory limit '{config.memory_limit}': choose one of "
                         f"{', '.join(MEMORY_LIMITS)}")

    # One log for every layout planned: read once, and a kernel two of them share is costed once.
    tuning_log, seed = open_tuning_log(config)
    deadline = None if config.time_budget is None else time.perf_counter() + config.time_budget

    def plan_in(layout, variant, time_budget):
        return _plan_in_layout(mod, variant, layout, config.with_changes(time_budget=time_budget),
                               predict_only=predict_only, measure_with=measure_with,
                               tuning_log=tuning_log, seed=seed)

    planned = plan_layouts(mod, config.layout, plan_in, config.time_budget)
    regions = None
    if config.layout == "auto" and len(planned) == len(LAYOUTS):
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            mixed = _plan_region_layouts(mod, config.with_changes(time_budget=left), tuning_log,
                                         predict_only=predict_only, measure_with=measure_with,
                                         seed=seed)
        except Exception as err:  # noqa: BLE001 - an optional plan must not sink the compile
            if interrupts.pressed():  # a Ctrl-C TVM re-raised as an error
                raise
            logger.warning("a layout per region failed, so it is not considered: %s",
                           error_summary(str(err) or repr(err)))
            mixed = None
        if mixed is not None:
            planned[MIXED], regions = mixed
    tuned, tuning_seconds = {}, None
    if config.tunes and not predict_only:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        tuned, tuning_seconds = tune_once(planned.values(), config.with_changes(time_budget=left),
                                           tuning_log)
    plans = {layout: pending.finish(tuned, tuning_seconds) for layout, pending in planned.items()}
    layouts = {layout: {"modelled_ms": plan.modelled_ms, "tuning": summarize(plan.costs.values())}
               for layout, plan in plans.items()}
    if regions is not None:
        layouts[MIXED]["regions"] = regions
    best = best_layout({layout: plan.modelled_ms for layout, plan in plans.items()})
    return replace(plans[best], layouts=layouts,
                   tuning=summarize(distinct_costs(plan.costs for plan in plans.values())))


def _plan_region_layouts(mod: tvm.IRModule, config: KorchConfig, tuning_log, *,
                         predict_only: bool, measure_with, seed=None
                         ) -> tuple[Planned, list[dict]] | None:
    """The model with the layout of each region chosen (layout/regions.py), planned, and what
    was chosen per region; None when the model has fewer than two regions or one layout is
    cheapest throughout. Regions and switches are costed without tuning or new measurements
    (the log, else the cost model): only the stitched model's plan is measured."""
    folded, regions = split_regions(mod)
    if len(regions) < 2:
        return None
    costing = config.with_changes(trials=0, trials_per_kernel=None, time_budget=None)

    def modelled_ms(module, layout):
        return _plan_in_layout(module, module, layout, costing, predict_only=measure_with is None,
                               measure_with=measure_with, tuning_log=tuning_log,
                               seed=seed).finish({}, None).modelled_ms

    logger.info("layout per region: costing %d regions in %s", len(regions), " and ".join(LAYOUTS))
    modules = [{layout: region_module(folded, region, layout) for layout in LAYOUTS}
               for region in regions]
    with _quiet(logger):  # a line per region plan says nothing a user needs
        region_ms = [{layout: modelled_ms(module, layout) for layout, module in variants.items()}
                     for variants in modules]
        switch_ms = [0.0 if (module := switch_module(folded, region)) is None
                     else modelled_ms(module, "NCHW") for region in regions[:-1]]
    layouts, total_ms = cheapest_layouts(region_ms, switch_ms)
    logger.info("layout per region (%d regions): %s, predicted %.3f ms", len(regions),
                " ".join(layouts), total_ms)
    if len(set(layouts)) == 1:
        return None
    stitched = stitched_module(folded, regions, layouts,
                               [variants[layout] for variants, layout in zip(modules, layouts)])
    plan = _plan_in_layout(mod, stitched, MIXED, config,
                           predict_only=predict_only, measure_with=measure_with,
                           tuning_log=tuning_log, seed=seed)
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


def _plan_in_layout(source: tvm.IRModule, mod: tvm.IRModule, layout: str, config: KorchConfig,
                    *, predict_only: bool, measure_with, tuning_log=None, seed=None) -> Planned:
    """`plan_korch` for `mod`, which is `source` with its activations in `layout`, costed with
    `tuning_log` (default: the configured one; reading a large log takes seconds) and `seed`
    (log_seeds.Seed: predictions and starting points from a compatible log), up to tuning."""
    target = config.target
    clock = _StageClock()

    lowered = lower_to_primitives(mod)
    graph = PrimitiveGraph.from_module(lowered, fast_math=config.fast_math)
    clock.lap("lowering")
    opaque = sorted({node.op_name for node in graph.nodes if not node.fusible})
    if opaque:
        logger.info("opaque ops kept as in the stock path (not fused or reordered): %s",
                    ", ".join(opaque))

    rules = rules_for_target(target, config.max_kernel_size)  # GPU limits for CUDA targets
    pieces = partition_graph(graph, config.max_subproblem_nodes)
    candidates = [candidate for piece in pieces
                  for candidate in enumerate_candidates(graph, rules, node_subset=piece)]
    kernels = distinct_kernels(graph, candidates)
    storage = StorageModel.of(graph, candidates, kernels.keys, kernels.modules)
    logger.info("%d primitives, %d candidates, %d distinct kernels, %d subproblems",
                len(graph.nodes), len(candidates), len(kernels.modules), len(pieces))
    clock.lap("candidates")

    if tuning_log is None:
        tuning_log, seed = open_tuning_log(config)
    predicted = predict_kernels(tuning_log, target, kernels.modules)
    if seed is not None:  # a compatible log's calibrated times predict better than a model
        predicted.update(seed.predictions(kernels.modules, tuning_log))
    kept = prune_by_prediction(candidates, kernels.keys, predicted, config.prune_margin)
    kept_kernels = {kernels.keys[i]: kernels.modules[kernels.keys[i]] for i in kept
                    if kernels.keys[i] is not None}
    clock.lap("prediction")

    # In-model / isolated time ratios kept by earlier benchmarks (costing/in_model.py); {} without.
    in_model = load_in_model_times(tuning_log.directory)
    factors = in_model.factors({key: kernel_kind(module["main"])
                                for key, module in kept_kernels.items()}) if in_model else {}
    if in_model:
        logger.info("costs scaled to in-model time: %d kernels by their own ratio, the rest by "
                    "their kind's (%s)", sum(key in in_model.ratios for key in kept_kernels),
                    ", ".join(f"{kind} {ratio:.2f}"
                              for kind, ratio in sorted(in_model.kind_ratios().items())))

    # Plans by problem (costs included): each lazy-costing round and each memory round
    # changes a few pieces, and the others need not be solved again.
    solutions: KeyedMemo[Plan] = KeyedMemo()

    def solve_piece(problem):
        return solutions.get(problem, lambda: solve_orchestration(
            problem, time_limit=config.solver_time_limit))

    def solve(costs, usable=kept):
        costs = scaled_costs(costs, factors)

        def solved(left_out=frozenset()):
            problems = orchestration_problems(graph, pieces, candidates,
                                              [i for i in usable if i not in left_out],
                                              kernels.keys, costs)
            return problems, [solve_piece(problem.problem) for problem in problems]

        if storage is not None and config.memory_limit == "stock":
            problems, plans = storage.cheapest_within_stock(solved)
        else:
            problems, plans = solved()
        return problems, plans, plan_groups(problems, plans)

    def finish_with(costs, usable=kept):
        def finish(tuned, tuning_seconds):
            final = {**costs, **{key: cost for key, cost in tuned.items() if key in costs}}
            seconds = dict(clock.seconds)
            if tuning_seconds is not None:
                seconds["tuning"] = tuning_seconds
            started = time.perf_counter()
            # Kernels no plan chose were never costed for real; they stay out of the plan.
            problems, plans, chosen = solve(final, [i for i in usable if kernels.keys[i] is None
                                                    or kernels.keys[i] in final])
            seconds["orchestration"] = round(time.perf_counter() - started, 3)
            never_measured = {key: KernelCost(predicted[key], "predicted", 0)
                              for key in kept_kernels if key not in final}
            return KorchPlan(source, lowered, graph, pieces, candidates, kept, kernels.keys,
                             kernels.modules, {**never_measured, **final}, problems, plans,
                             chosen, tuning_log, target, seconds, factors, layout, mod,
                             storage=storage)
        return finish

    if predict_only:
        costs = logged_or_predicted(kept_kernels, predicted, tuning_log)
        clock.lap("measurement")
        return Planned({}, {}, costs, finish_with(costs))

    stock_keys = {kernels.keys[i] for i in kept
                  if candidates[i].is_stock and kernels.keys[i] is not None}
    with (nullcontext(measure_with) if measure_with
          else profiler_measurement(config, tuning_log, predicted, seed)) as measure:
        costs, first_choice = cost_what_plans_need(
            kept_kernels, predicted, stock_keys,
            work_anchors(graph, candidates, kept, kernels.keys), solve, kernels.keys, config,
            tuning_log, measure)
    clock.lap("measurement")
    shares = Counter()
    if config.tunes:
        # Tune where the time goes: the kernels of the plan chosen from default-schedule costs,
        # by their share of that plan's latency (the same plan on every compile, see costing).
        defaults = default_schedule_costs(kept_kernels, costs, tuning_log)
        for i in first_choice:
            if kernels.keys[i] is not None:
                shares[kernels.keys[i]] += defaults[kernels.keys[i]].seconds
    measured_kernels = {key: kept_kernels[key] for key in costs}
    return Planned(shares, measured_kernels, costs, finish_with(costs))


def rewrite_plan(plan: KorchPlan):
    """The rewrite step: (module ready for tvm.compile, compile report) from a plan."""
    rewrite_started = time.perf_counter()
    optimized = rewrite_with_plan(plan.graph, plan.chosen_groups, plan.tuning_log.database,
                                  plan.target)
    report = plan.report()
    chosen_keys = {plan.kernel_keys[i] for i in plan.chosen} - {None}
    report.update(schedule_counts(optimized, [plan.kernel_modules[key] for key in chosen_keys],
                                  plan.tuning_log))
    report["stage_seconds"] = {**plan.stage_seconds,
                               "rewrite": round(time.perf_counter() - rewrite_started, 3)}
    report["modelled_ms"] = report["plan"]["modelled_ms"]
    if plan.in_model_factors:
        report["modelled_isolated_ms"] = sum(kernel["isolated_ms"] or 0.0
                                             for kernel in report["plan"]["kernels"])
    # kinds are read from the kernels as written: scheduling (inlined padding, dropped unit
    # loops) hides the convolution windows they are told apart by
    unscheduled = build_partition_module(plan.graph, plan.chosen_groups)
    report["kind_ms"] = plan_kind_times(unscheduled, report["plan"])  # conv 1x1 / matmul / ...
    report["kernel_kinds"] = module_kernel_kinds(unscheduled)
    return optimized, report


def run_korch(mod: tvm.IRModule, config: KorchConfig):
    """Orchestrate `main` of `mod`; returns (module ready for tvm.compile, report dict)."""
    return rewrite_plan(plan_korch(mod, config))
