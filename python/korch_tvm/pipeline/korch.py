"""KorchPass: fission -> primitive graph -> candidates -> costing -> orchestration -> rewrite.

Each stage takes the previous stage's value and returns a new one; this file only composes
them, so reading `plan_korch` and `run_korch` tells the whole story of a Korch compile.
`plan_korch` stops before the rewrite, so `korch-tvm explain` shows the very plan a compile
would build without building it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace

import tvm

from ..backend.rewrite import rewrite_with_plan
from ..backend.schedule_counts import schedule_counts
from ..backend.target import host_core_count, parse_target
from ..candidates.enumerate import enumerate_candidates
from ..candidates.gpu_rules import rules_for_target
from ..candidates.partition import partition_graph
from ..config import MEMORY_LIMITS, KorchConfig
from ..costing.cost_model import predict_kernels
from ..costing.in_model import load_in_model_times, scaled_costs
from ..costing.kernel_costs import (default_schedule_costs, measure_costs, open_tuning_log,
                                    shared_runner, summarize, tune_costs)
from ..costing.lazy import solve_lazily
from ..costing.measure import KernelCost
from ..costing.pooled_builder import PooledBuilder
from ..errors import KorchError, error_summary
from ..graph.primitive_graph import PrimitiveGraph
from ..kernels.fused import build_partition_module, distinct_kernels, structural_key
from ..kernels.kinds import kernel_kind, module_kernel_kinds, plan_kind_times
from ..layout.activations import LAYOUTS, best_layout, plan_layouts
from ..layout.regions import (MIXED, cheapest_layouts, region_module, split_regions,
                              stitched_module, switch_module)
from ..lowering.fission import lower_to_primitives, lowering_stats
from ..lowering.primitive_kinds import LINEAR, POOLING_OPS
from ..orchestration.memory_plan import StorageModel
from ..orchestration.problems import (orchestration_problems, plan_groups, plan_report,
                                      prune_by_prediction)
from ..orchestration.solver import Plan, solve_orchestration
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
    kernels of every layout's plan are tuned in one round, by their latency share (`_tune_once`).
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
        tuned, tuning_seconds = _tune_once(planned.values(), config.with_changes(time_budget=left),
                                           tuning_log)
    plans = {layout: pending.finish(tuned, tuning_seconds) for layout, pending in planned.items()}
    layouts = {layout: {"modelled_ms": plan.modelled_ms, "tuning": summarize(plan.costs.values())}
               for layout, plan in plans.items()}
    if regions is not None:
        layouts[MIXED]["regions"] = regions
    best = best_layout({layout: plan.modelled_ms for layout, plan in plans.items()})
    return replace(plans[best], layouts=layouts,
                   tuning=summarize(_distinct_costs(plan.costs for plan in plans.values())))


@dataclass(frozen=True)
class _Planned:
    """A layout's costed plan before the compile's one round of tuning: the latency share of
    each kernel of its plan on default-schedule costs, its costed kernels, and `finish(tuned
    costs, tuning seconds)`, which solves it again with the tuned costs it shares."""

    shares: Mapping[str, float]
    kernels: Mapping[str, tvm.IRModule]
    costs: Mapping[str, KernelCost]
    finish: Callable[[Mapping[str, KernelCost], float | None], KorchPlan]


def _tune_once(planned, config: KorchConfig, tuning_log) -> tuple[dict[str, KernelCost], float]:
    """One trial budget for the whole compile: split over the kernels of every layout's plan
    by their latency share in it (a kernel two layouts choose counts in both, and is tuned
    once). Returns (costs of every kernel, tuned ones updated; seconds it took)."""
    started = time.perf_counter()
    shares, kernels, costs = Counter(), {}, {}
    for pending in planned:
        shares.update(pending.shares)
        kernels.update(pending.kernels)
        costs.update(pending.costs)
    tuned = tune_costs(kernels, shares, costs, config, tuning_log)
    return tuned, round(time.perf_counter() - started, 3)


_WORK_RANK = {"predicted": 0, "log": 1, "failed": 2, "measured": 3, "tuned": 4}


def _distinct_costs(costs_of_plans) -> list[KernelCost]:
    """One cost per kernel key over several plans' costs: the one that says the most work was
    done for it (tuned, then measured, ...), so a kernel two layouts share counts once."""
    chosen: dict[str, KernelCost] = {}
    for costs in costs_of_plans:
        for key, cost in costs.items():
            if key not in chosen or _WORK_RANK[cost.source] > _WORK_RANK[chosen[key].source]:
                chosen[key] = cost
    return list(chosen.values())


def _plan_region_layouts(mod: tvm.IRModule, config: KorchConfig, tuning_log, *,
                         predict_only: bool, measure_with, seed=None
                         ) -> tuple[_Planned, list[dict]] | None:
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
                    *, predict_only: bool, measure_with, tuning_log=None, seed=None) -> _Planned:
    """`plan_korch` for `mod`, which is `source` with its activations in `layout`, costed with
    `tuning_log` (default: the configured one; reading a large log takes seconds) and `seed`
    (log_seeds.Seed: predictions and starting points from a compatible log), up to tuning."""
    target = parse_target(config.target)
    config = config.with_changes(target=target)
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
        costs = _logged_or_predicted(kept_kernels, predicted, tuning_log)
        clock.lap("measurement")
        return _Planned({}, {}, costs, finish_with(costs))

    stock_keys = {kernels.keys[i] for i in kept
                  if candidates[i].is_stock and kernels.keys[i] is not None}
    with (nullcontext(measure_with) if measure_with
          else _profiler_measurement(config, tuning_log, predicted, seed)) as measure:
        costs, first_choice = _cost_what_plans_need(
            kept_kernels, predicted, stock_keys,
            _work_anchors(graph, candidates, kept, kernels.keys), solve, kernels.keys, config,
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
    return _Planned(shares, measured_kernels, costs, finish_with(costs))


MEMORY_BOUND = "memory-bound"


def _work_anchors(graph, candidates, kept, key_of_candidate) -> dict[str, set]:
    """Per kernel key, what carries its work, for lazy costing's calibration: its matmul/conv
    primitives, else its pooling primitives, else the class of all memory-bound kernels.

    Pools are anchors of their own because the memory-bound class mispredicts them alike and
    badly: YOLOv4's 13x13 max pools over 13x13 maps ran 10-34x their calibrated prediction, and
    each kernel holding one was found out only when measured, one or two a round (24 rounds,
    314 kernels measured). Calibrating the other memory-bound kernels by the primitives they
    share instead measured 9 % more kernels for the same plan on YOLOX-nano.
    """
    anchors: dict[str, set] = {}
    for i in kept:
        key = key_of_candidate[i]
        if key is None:
            continue
        nodes = candidates[i].nodes
        linear = {n for n in nodes if graph.nodes[n].kind == LINEAR}
        pools = {n for n in nodes if graph.nodes[n].op_name in POOLING_OPS}
        anchors.setdefault(key, set()).update(linear or pools or {MEMORY_BOUND})
    return anchors


@contextmanager
def _profiler_measurement(config, tuning_log, predicted: Mapping[str, float], seed=None):
    """measure({key: module}) -> costs: log, else one default-schedule run, else the prediction
    already made for it (`predicted`, by kernel key: no feature extraction again). One runner
    and one builder pool serve every round (lazy costing measures in many small calls)."""
    def predict(module):
        return predicted[structural_key(module)]

    deadline = None if config.time_budget is None else time.perf_counter() + config.time_budget
    runner = shared_runner(config)
    builder = None if runner is None else PooledBuilder(config.target, host_core_count())

    def measure(modules):  # every round draws on what is left of the one time budget
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        return measure_costs(modules, config.with_changes(time_budget=left), tuning_log,
                             predictor=predict, runner=runner, builder=builder, seed=seed)

    try:
        yield measure
    finally:
        if builder is not None:
            builder.close()


def _cost_what_plans_need(kept_kernels, predicted, stock_keys, anchors, solve, key_of_candidate,
                          config, tuning_log, measure_modules):
    """(best known cost of every kernel worth a number, the plan on default-schedule costs).

    What the log holds and TVM's own fusion groups (so the stock plan is always costed for
    real and Korch's plan can never model worse than it) are looked up or measured first; the
    rest only when a plan chooses them (lazy_costing). With an infinite margin every kernel is
    measured up front, which is what full costing means.
    """
    def measure(keys):
        return measure_modules({key: kept_kernels[key] for key in keys})

    upfront = [key for key, module in kept_kernels.items()
               if key in stock_keys or tuning_log.best_seconds(module) is not None
               or not math.isfinite(config.prune_margin)]
    best = dict(measure(upfront))  # "predicted" where nothing could measure (no device, budget)
    known = {key: cost for key, cost in best.items() if cost.source != "predicted"}

    def solve_on(costs):
        solution = solve(costs)
        return solution, [key_of_candidate[i] for i in solution[2]]

    result = solve_lazily(
        solve_on, {key: predicted[key] for key in kept_kernels},
        default_schedule_costs(kept_kernels, known, tuning_log),
        lambda keys: default_schedule_costs(kept_kernels, _remember(best, measure(keys)),
                                            tuning_log),
        config.lazy_margin if math.isfinite(config.prune_margin) else 0.0, anchors)
    logger.info("costing: %d of %d kernels measured or logged, plan settled in %d round(s)",
                len(result.known), len(kept_kernels), result.rounds)
    return best, result.solution[2]


def _remember(store: dict, costs):
    """Add `costs` to `store` and return them."""
    store.update(costs)
    return costs


def _logged_or_predicted(kept_kernels, predicted, tuning_log) -> dict[str, KernelCost]:
    """Costs without running anything: a logged record where there is one, else the prediction."""
    costs = {}
    for key, module in kept_kernels.items():
        best = tuning_log.best_seconds(module)
        costs[key] = (KernelCost(predicted[key], "predicted", 0) if best is None
                      else KernelCost(best, "log", 0))
    return costs


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


@tvm.transform.module_pass(opt_level=0, name="KorchPass")
class KorchPass:
    """Use in place of FuseOps/FuseTIR: rebuild `main` as the optimal set of tuned kernels.

    On the CPU the result goes straight to `tvm.compile` (its pipeline does not re-fuse); for
    CUDA build it with `korch_tvm.backend.cuda.build`, since TVM's CUDA pipeline runs FuseOps
    again. The report of the last run is kept in `last_report`.
    """

    def __init__(self, config: KorchConfig | None = None):
        self.config = config or KorchConfig()
        self.last_report: dict | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        optimized, self.last_report = run_korch(mod, self.config)
        return optimized
