"""One layout's Korch plan, up to the compile's one round of tuning, and the plan record.

`plan_in_layout` reads as its stages, each taking the previous one's value: the primitive graph,
the candidates and their distinct kernels, predictions (and pruning by them), costing what the
plans need, the latency shares tuning is spent by. What it returns (`Planned`) is solved again
with the tuned costs by `finish`, which makes the `KorchPlan`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import NamedTuple

import tvm

from ..candidates.enumerate import enumerate_candidates
from ..candidates.gpu_rules import rules_for_target
from ..candidates.partition import partition_graph
from ..config import KorchConfig
from ..costing.cost_model import predict_kernels
from ..costing.failed_costs import is_failed
from ..costing.in_model import load_in_model_times, scaled_costs
from ..costing.kernel_costs import default_schedule_costs, summarize
from ..costing.measure import KernelCost
from ..costing.session import CostingSession
from ..graph.primitive_graph import PrimitiveGraph
from ..kernels.fused import DistinctKernels, distinct_kernels
from ..kernels.kinds import kernel_kind
from ..lowering.fission import lower_to_primitives, lowering_stats
from ..orchestration.memory_plan import StorageModel
from ..orchestration.plans import Plan, problem_shape
from ..orchestration.problems import (orchestration_problems, plan_groups, plan_report,
                                      prune_by_prediction)
from ..orchestration.solver import solve_orchestration
from ..substitutions.offer import graph_with_alternatives
from ..support.memo import KeyedMemo
from .korch_costs import (Planned, cost_what_plans_need, logged_or_predicted,
                          profiler_measurement, work_anchors)

logger = logging.getLogger("korch_tvm.passes")


class StageClock:
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
    layouts_stopped: tuple = ()  # layouts whose optimistic plan could not win, left unplanned
    tuning: dict = field(default_factory=dict)  # what the compile measured and tuned (costing)
    storage: StorageModel | None = None  # for the planned-storage report (memory_plan.py)
    call_seconds: float = 0.0  # the VM's time per kernel call, in every price
    #                            (costing/call_overhead.py)

    @property
    def modelled_ms(self) -> float:
        """Sum of the chosen kernels' costs, each with its call (inf when some piece found no
        plan)."""
        return sum(plan.objective for plan in self.plans) * 1e3

    @property
    def chosen_groups(self) -> list[frozenset[int]]:
        return [self.candidates[i].nodes for i in self.chosen]

    def opaque_primitives(self) -> list[tuple[int, str]]:
        """(id, op) of primitives Korch cannot fuse: they stay plain bindings, as in the stock
        path."""
        return [(node.index, node.op_name) for node in self.graph.nodes if not node.fusible]

    def report(self) -> dict:
        """The planning part of the compile report (JSON-friendly)."""
        plan = plan_report(self.graph, self.candidates, self.kept, self.problems, self.plans,
                           self.chosen, self.kernel_keys, self.costs, self.in_model_factors,
                           self.storage, self.call_seconds)
        plan["opaque_ops"] = sorted({op for _, op in self.opaque_primitives()})
        plan["kernel_calls"] = sum(1 for i in self.chosen if self.kernel_keys[i] is not None)
        plan["call_overhead_us"] = self.call_seconds * 1e6
        layouts = self.layouts or {self.layout: {"modelled_ms": self.modelled_ms,
                                                 "tuning": summarize(self.costs.values())}}
        return {
            "layout": self.layout,
            "layouts": layouts,
            "layouts_stopped": list(self.layouts_stopped),
            "lowering": lowering_stats(self.source, self.lowered),
            # every layout planned, each kernel once: what this compile measured and tuned
            "tuning": self.tuning or summarize(self.costs.values()),
            "plan": plan,
        }


class Found(NamedTuple):
    """The candidate stage's value: the graph cut into pieces, every candidate of every piece,
    their distinct kernels and the storage model of the stock plan."""

    graph: PrimitiveGraph
    pieces: list
    candidates: list
    kernels: DistinctKernels
    storage: StorageModel | None


class Lowered(NamedTuple):
    """A layout's model after operator fission, and its primitive graph (substitutions
    offered): what both the layout probe (TVM's fusion groups of it) and the layout's plan
    (every candidate of it) start from."""

    lowered: tvm.IRModule
    graph: PrimitiveGraph


class Prepared(NamedTuple):
    """A layout's model after operator fission, and its candidates."""

    lowered: tvm.IRModule
    found: Found


class Priced(NamedTuple):
    """The prediction stage's value: a predicted time per kernel, the candidates kept by it,
    their kernels by key, the in-model / isolated time factor per kernel ({} without), and the
    VM's seconds per kernel call, which every kernel's price includes."""

    predicted: dict[str, float]
    kept: list[int]
    kept_kernels: dict[str, tvm.IRModule]
    factors: dict[str, float]
    call_seconds: float = 0.0


def plan_in_layout(source: tvm.IRModule, mod: tvm.IRModule, layout: str, config: KorchConfig,
                   *, predict_only: bool, measure_with, session: CostingSession,
                   lowering: Lowered | None = None, beat_ms: float | None = None
                   ) -> Planned | None:
    """`plan_korch` for `mod`, which is `source` with its activations in `layout`, costed
    through the compile's `session` (its log, and its seed: predictions and starting points
    from a compatible log), up to tuning. `predict_only` and `measure_with` as in
    `plan_korch`; `lowering`: `lower_layout(mod, config)` where the caller has it already
    (the layout probe). None when no plan of this layout can model under `beat_ms` (another
    layout's plan): found before its fusion groups are measured (`cost_what_plans_need`)."""
    clock = StageClock()
    lowered, found = prepare_layout(mod, config, clock, session.built_kernels, lowering)
    priced = price_candidates(found, config, session)
    clock.lap("prediction")
    solve = Orchestrator(found, priced, config)
    if predict_only:
        costs = logged_or_predicted(priced.kept_kernels, priced.predicted, session.tuning_log)
        clock.lap("measurement")
        return Planned({}, {}, costs, Finish(source, mod, layout, lowered, found, priced, solve,
                                             costs, clock, config.target, session.tuning_log))
    stock_keys = {found.kernels.keys[i] for i in priced.kept
                  if found.candidates[i].is_stock and found.kernels.keys[i] is not None}
    with (nullcontext(measure_with) if measure_with
          else profiler_measurement(session, priced.predicted, config.time_budget)) as measure:
        costed = cost_what_plans_need(
            priced.kept_kernels, priced.predicted, stock_keys,
            work_anchors(found.graph, found.candidates, priced.kept, found.kernels.keys), solve,
            found.kernels.keys, config, session.tuning_log, measure,
            library=None if measure_with else lambda keys: session.library_costs(
                {key: priced.kept_kernels[key] for key in keys}),
            beat_seconds=None if beat_ms is None else beat_ms / 1e3)
    if costed is None:
        return None
    costs, first_choice = costed
    clock.lap("measurement")
    shares = tuning_shares(first_choice, found.kernels.keys, priced.kept_kernels, costs,
                           session.tuning_log) if config.tunes else Counter()
    measured_kernels = {key: priced.kept_kernels[key] for key in costs}
    return Planned(shares, measured_kernels, costs,
                   Finish(source, mod, layout, lowered, found, priced, solve, costs, clock,
                          config.target, session.tuning_log))


def lower_layout(mod: tvm.IRModule, config: KorchConfig,
                 clock: StageClock | None = None) -> Lowered:
    """`mod` lowered to primitives, and its graph with `config`'s substitutions offered;
    `clock` gets a lap."""
    lowered = lower_to_primitives(mod)
    graph = graph_with_alternatives(lowered, config.substitutions, fast_math=config.fast_math)
    (clock or StageClock()).lap("lowering")
    return Lowered(lowered, graph)


def prepare_layout(mod: tvm.IRModule, config: KorchConfig, clock: StageClock | None = None,
                   built: KeyedMemo | None = None, lowering: Lowered | None = None) -> Prepared:
    """`lower_layout` (or the `lowering` given) and its candidates (`find_candidates`, reusing
    the kernels in `built`); `clock` gets a lap per stage."""
    clock = clock or StageClock()
    lowering = lowering or lower_layout(mod, config, clock)
    found = find_candidates(lowering.graph, config, built)
    clock.lap("candidates")
    return Prepared(lowering.lowered, found)


def find_candidates(graph: PrimitiveGraph, config: KorchConfig,
                    built: KeyedMemo | None = None) -> Found:
    """The pieces of `graph` (at most `config.max_subproblem_nodes` primitives each), every
    candidate kernel of each under the target's kernel rules, and their distinct kernels
    (those `built` holds already are not built again: `distinct_kernels`)."""
    opaque = sorted({node.op_name for node in graph.nodes if not node.fusible})
    if opaque:
        logger.info("opaque ops kept as in the stock path (not fused or reordered): %s",
                    ", ".join(opaque))
    rules = rules_for_target(config.target, config.max_kernel_size)  # GPU limits for CUDA
    pieces = partition_graph(graph, config.max_subproblem_nodes)
    candidates = [candidate for piece in pieces
                  for candidate in enumerate_candidates(graph, rules, node_subset=piece)]
    kernels = distinct_kernels(graph, candidates, built)
    storage = StorageModel.of(graph, candidates, kernels.keys, kernels.modules)
    logger.info("%d primitives, %d candidates, %d distinct kernels, %d subproblems",
                len(graph.nodes), len(candidates), len(kernels.modules), len(pieces))
    return Found(graph, pieces, candidates, kernels, storage)


def price_candidates(found: Found, config: KorchConfig, session: CostingSession) -> Priced:
    """Predicted times (the session's seed where it knows a kernel, else the cost model), the
    candidates kept within `config.prune_margin` of the best by them, and the in-model factors
    the tuning log's directory holds for the kept kernels."""
    tuning_log, seed = session.tuning_log, session.seed
    modules, keys = found.kernels.modules, found.kernels.keys
    predicted = predict_kernels(tuning_log, config.target, modules, session.estimates)
    if seed is not None:  # a compatible log's calibrated times predict better than a model
        predicted.update(seed.predictions(modules, tuning_log))
    kept = prune_by_prediction(found.candidates, keys, predicted, config.prune_margin)
    kept_kernels = {keys[i]: modules[keys[i]] for i in kept if keys[i] is not None}
    return Priced(predicted, kept, kept_kernels, in_model_factors(tuning_log, kept_kernels),
                  session.call_seconds())


def in_model_factors(tuning_log, kernels: dict[str, tvm.IRModule]) -> dict[str, float]:
    """In-model / isolated time ratios kept by earlier benchmarks (costing/in_model.py) for
    `kernels`, by key; {} where the log's directory keeps none."""
    in_model = load_in_model_times(tuning_log.directory)
    if not in_model:
        return {}
    logger.info("costs scaled to in-model time: %d kernels by their own ratio, the rest by "
                "their kind's (%s)", sum(key in in_model.ratios for key in kernels),
                ", ".join(f"{kind} {ratio:.2f}"
                          for kind, ratio in sorted(in_model.kind_ratios().items())))
    return in_model.factors({key: kernel_kind(module["main"]) for key, module in kernels.items()})


class Orchestrator:
    """`solve(costs, usable)`: (problems, plans, chosen candidates) of one layout's pieces for
    `costs`, within the stock plan's activation storage when `config.memory_limit` is "stock"
    (and `within_memory`, the default, is True).

    Each piece's problem and plan are kept by the piece's usable candidates and their prices:
    each lazy-costing round and each memory round changes a few pieces, and the others are
    neither built nor solved again. A piece whose problem has the shape of one solved before
    (`problem_shape`: another copy of a transformer block, at the same prices) takes that
    plan: ViT-S/32's 24 pieces are two problems repeated. Whole answers are kept by the same
    inputs, so solving again what was solved (the plan of a compile that tuned nothing)
    costs nothing.
    `problems_built` and `memory_rounds` count the work, for tests.
    """

    def __init__(self, found: Found, priced: Priced, config: KorchConfig):
        self.found, self.priced, self.config = found, priced, config
        self._pieces_of = {i: [p for p, piece in enumerate(found.pieces)
                               if found.candidates[i].nodes <= piece] for i in priced.kept}
        self._pieces: KeyedMemo[tuple] = KeyedMemo()
        self._answers: KeyedMemo[tuple] = KeyedMemo(kept=64)
        self._plans: KeyedMemo[Plan] = KeyedMemo(kept=20_000)
        self.problems_built = self.memory_rounds = 0

    def __call__(self, costs, usable=None, *, within_memory: bool = True):
        found, keys = self.found, self.found.kernels.keys
        usable = tuple(self.priced.kept if usable is None else usable)
        costs = scaled_costs(costs, self.priced.factors)
        prices = {i: _price(costs, keys[i]) for i in usable}
        limited = (within_memory and found.storage is not None
                   and self.config.memory_limit == "stock")
        return self._answers.get((limited, usable, tuple(prices[i] for i in usable)),
                                 lambda: self._solve(costs, usable, prices, limited))

    def _solve(self, costs, usable, prices, limited):
        by_piece = [[] for _ in self.found.pieces]
        for i in usable:
            for piece in self._pieces_of.get(i, ()):
                by_piece[piece].append(i)

        def solved(left_out=frozenset()):
            pairs = [self._piece(piece, tuple(i for i in ids if i not in left_out), costs,
                                 prices) for piece, ids in enumerate(by_piece)]
            return [problem for problem, _ in pairs], [plan for _, plan in pairs]

        if limited:
            self.memory_rounds += 1
            problems, plans = self.found.storage.cheapest_within_stock(solved)
        else:
            problems, plans = solved()
        return problems, plans, plan_groups(problems, plans)

    def _piece(self, piece: int, ids: tuple, costs, prices):
        """(Subproblem, Plan) of piece number `piece` over candidates `ids`."""
        found = self.found

        def build():
            self.problems_built += 1
            problem = orchestration_problems(found.graph, [found.pieces[piece]], found.candidates,
                                             ids, found.kernels.keys, costs,
                                             self.priced.call_seconds)[0]
            return problem, self._plans.get(problem_shape(problem.problem), lambda: (
                solve_orchestration(problem.problem, time_limit=self.config.solver_time_limit)))

        return self._pieces.get((piece, ids, tuple(prices[i] for i in ids)), build)


def _price(costs, key):
    """What a kernel's cost means to its piece's program: its seconds and whether it failed
    (orchestration/problems.py prices a kernel by these alone); None for an opaque binding."""
    if key is None:
        return None
    cost = costs[key]
    return float(cost.seconds), is_failed(cost)


def tuning_shares(first_choice, keys, kept_kernels, costs, tuning_log) -> Counter:
    """Tune where the time goes: each kernel of the plan chosen from default-schedule costs,
    by its share of that plan's latency (the same plan on every compile, see costing)."""
    defaults = default_schedule_costs(kept_kernels, costs, tuning_log)
    shares = Counter()
    for i in first_choice:
        if keys[i] is not None:
            shares[keys[i]] += defaults[keys[i]].seconds
    return shares


@dataclass(frozen=True)
class Finish:
    """`Planned.finish(tuned, tuning_seconds)`: the layout solved again with the tuned costs of
    its kernels, as the `KorchPlan`; kernels no plan chose were never costed for real, so they
    stay out of the plan."""

    source: tvm.IRModule
    mod: tvm.IRModule
    layout: str
    lowered: tvm.IRModule
    found: Found
    priced: Priced
    solve: Orchestrator
    costs: dict
    clock: StageClock
    target: object
    tuning_log: object

    def __call__(self, tuned, tuning_seconds) -> KorchPlan:
        final = {**self.costs, **{key: cost for key, cost in tuned.items() if key in self.costs}}
        seconds = dict(self.clock.seconds)
        if tuning_seconds is not None:
            seconds["tuning"] = tuning_seconds
        started = time.perf_counter()
        keys = self.found.kernels.keys
        problems, plans, chosen = self.solve(
            final, [i for i in self.priced.kept if keys[i] is None or keys[i] in final])
        seconds["orchestration"] = round(time.perf_counter() - started, 3)
        never_measured = {key: KernelCost(self.priced.predicted[key], "predicted", 0)
                          for key in self.priced.kept_kernels if key not in final}
        found = self.found
        return KorchPlan(self.source, self.lowered, found.graph, found.pieces, found.candidates,
                         self.priced.kept, keys, found.kernels.modules,
                         {**never_measured, **final}, problems, plans, chosen, self.tuning_log,
                         self.target, seconds, self.priced.factors, self.layout, self.mod,
                         storage=found.storage, call_seconds=self.priced.call_seconds)
