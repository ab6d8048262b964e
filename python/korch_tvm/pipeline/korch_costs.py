"""The Korch path's costing: what each layout's candidates cost, measured only where a plan needs it.

`plan_korch` (korch.py) composes these: the kernels the log knows and TVM's own fusion groups are
costed first, the rest lazily as plans choose them (costing/lazy.py), and one trial budget is then
spent over the kernels of every layout's plan (`tune_once`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import tvm

from ..costing.kernel_costs import KernelCost, default_schedule_costs
from ..costing.lazy import lazy_round, optimistic_plan, solve_lazily
from ..costing.session import CostingSession
from ..kernels.fused import structural_key
from ..lowering.primitive_kinds import LINEAR, POOLING_OPS

logger = logging.getLogger("korch_tvm.passes")


@dataclass(frozen=True)
class Planned:
    """A layout's costed plan before the compile's one round of tuning: the latency share of
    each kernel of its plan on default-schedule costs, its costed kernels, and `finish(tuned
    costs, tuning seconds)`, which solves it again with the tuned costs it shares."""

    shares: Mapping[str, float]
    kernels: Mapping[str, tvm.IRModule]
    costs: Mapping[str, KernelCost]
    finish: Callable[[Mapping[str, KernelCost], float | None], "KorchPlan"]  # noqa: F821 (korch.py)


def tune_once(planned, session: CostingSession) -> tuple[dict[str, KernelCost], float]:
    """One trial budget for the whole compile: split over the kernels of every layout's plan
    (`planned`: Planned values) by their latency share in it (a kernel two layouts choose
    counts in both, and is tuned once), within what is left of the session's time budget.
    Returns (costs of every kernel, tuned ones updated; seconds it took)."""
    started = time.perf_counter()
    shares, kernels, costs = Counter(), {}, {}
    for pending in planned:
        shares.update(pending.shares)
        kernels.update(pending.kernels)
        costs.update(pending.costs)
    tuned = session.tune(kernels, shares, costs)
    return tuned, round(time.perf_counter() - started, 3)


_WORK_RANK = {"predicted": 0, "log": 1, "failed": 2, "measured": 3, "tuned": 4}


def distinct_costs(costs_of_plans) -> list[KernelCost]:
    """One cost per kernel key over several plans' costs: the one that says the most work was
    done for it (tuned, then measured, ...), so a kernel two layouts share counts once."""
    chosen: dict[str, KernelCost] = {}
    for costs in costs_of_plans:
        for key, cost in costs.items():
            if key not in chosen or _WORK_RANK[cost.source] > _WORK_RANK[chosen[key].source]:
                chosen[key] = cost
    return list(chosen.values())


MEMORY_BOUND = "memory-bound"


def work_anchors(graph, candidates, kept, key_of_candidate) -> dict[str, set]:
    """Per kernel key, what carries its work, for lazy costing's calibration: its matmul/conv
    primitives, else its pooling primitives, else its largest primitive (by output elements),
    as `(MEMORY_BOUND, node)`.

    Pools are anchors of their own because the memory-bound class mispredicts them alike and
    badly, and each kernel holding one would otherwise be found out only when measured, one or
    two a lazy-costing round (bench/results/HISTORY.md has the measurements). So are the other
    memory-bound kernels' largest primitives: calibrated as one class, the many fused variants
    around one large transpose or norm (SegFormer's 64x64 maps) each looked 1.6x cheaper than
    it ran and were measured one a round (85 of 97 rounds); by their largest primitive the
    first one measured corrects the rest. `graph`, `candidates`: the layout's; `kept`: the
    candidate indices kept after pruning; `key_of_candidate`: each candidate's kernel key (None:
    no kernel).
    """
    anchors: dict[str, set] = {}
    for i in kept:
        key = key_of_candidate[i]
        if key is None:
            continue
        nodes = candidates[i].nodes
        linear = {n for n in nodes if graph.nodes[n].kind == LINEAR}
        pools = {n for n in nodes if graph.nodes[n].op_name in POOLING_OPS}
        anchors.setdefault(key, set()).update(
            linear or pools or {(MEMORY_BOUND, _largest(graph, nodes))})
    return anchors


def _largest(graph, nodes) -> int:
    """The node of `nodes` with the most output elements (the lowest id among equals)."""
    def elements(node):
        shape = graph.nodes[node].shape
        static = shape is not None and all(isinstance(dim, int) for dim in shape)
        return math.prod(shape) if static else 0

    return max(sorted(nodes), key=elements)


@contextmanager
def profiler_measurement(session: CostingSession, predicted: Mapping[str, float],
                         time_budget: float | None = None):
    """measure({key: module}) -> costs: log, else one default-schedule run, else the prediction
    already made for it (`predicted`, by kernel key: no feature extraction again). Every round
    draws on what is left of `time_budget` (this layout's part; None: the session's), through
    the session's one runner and builder pool (lazy costing measures in many small calls)."""
    def predict(module):
        return predicted[structural_key(module)]

    deadline = None if time_budget is None else time.perf_counter() + time_budget

    def measure(modules):
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        return session.measure(modules, predictor=predict, time_budget=left)

    yield measure


def cost_what_plans_need(kept_kernels, predicted, stock_keys, anchors, solve, key_of_candidate,
                          config, tuning_log, measure_modules, library=None,
                          beat_seconds=None):
    """(best known cost of every kernel worth a number, the plan on default-schedule costs),
    or None when the plan cannot model under `beat_seconds` (another layout's plan).

    What the log holds is looked up first, and the library calls' times taken
    (`library(keys)`: the costs of those kept kernels that have a library implementation, TVM's
    kernel not measured); then TVM's own fusion groups are measured (so the stock plan is always
    costed for real and Korch's plan can never model worse than it); the rest only when a plan
    chooses them (lazy_costing), the plan without the memory limit first, then within it (an
    infinite margin measures all up front: full costing). A library call's time is a ceiling
    there: TVM's kernel is measured only where a plan wants it below that time. Before the
    fusion groups are measured, and again after (their times calibrate the predictions), a
    plan on the optimistic prices that models above `beat_seconds` ends it (`_cannot_win`).
    """
    def measure(keys):
        return measure_modules({key: kept_kernels[key] for key in keys})

    margin = config.lazy_margin if math.isfinite(config.prune_margin) else 0.0
    predicted = {key: predicted[key] for key in kept_kernels}
    first = [key for key, module in kept_kernels.items()
             if tuning_log.best_seconds(module) is not None
             or not math.isfinite(config.prune_margin)]
    best, solve_on = dict(measure(first)), _with_seconds(solve, key_of_candidate)
    ceilings = {} if library is None else {
        key: cost for key, cost in library([key for key in kept_kernels if key not in best]
                                           ).items() if math.isfinite(cost.seconds)}

    def cannot_win(known_defaults, stage: str) -> bool:
        return beat_seconds is not None and _cannot_win(
            lambda costs: solve_on(costs, False), predicted, known_defaults, margin, anchors,
            ceilings, beat_seconds, stage)

    if cannot_win(default_schedule_costs(kept_kernels, _measured(best), tuning_log),
                  "on what the log holds"):
        return None
    best.update(measure([key for key in kept_kernels if key in stock_keys and key not in best]))
    known = _measured(best)
    start = default_schedule_costs(kept_kernels, known, tuning_log)
    if cannot_win(start, "with TVM's fusion groups measured"):
        return None
    anchors = _library_apart(anchors, known)

    def lazily(within_memory, measured):
        return solve_lazily(
            lambda costs: solve_on(costs, within_memory), predicted, measured,
            lambda keys: default_schedule_costs(kept_kernels, _remember(best, measure(keys)),
                                                tuning_log), margin, anchors,
            config.settle_gap, ceilings)

    def settled(measured, within_memory) -> bool:
        """Whether the first round would measure nothing (a compile whose log has every
        kernel of its plan: it must measure nothing, as before)."""
        return not lazy_round(lambda costs: solve_on(costs, within_memory), predicted, measured,
                              margin, anchors, config.settle_gap, ceilings=ceilings)[1]

    # A solve within the memory limit solves a piece again per round of kernels it leaves out
    # (hundreds on a cold log's optimistic prices: 13 s of ViT-S/32's 45 s in one layout), so
    # the rounds settle the plan without the limit first, then go on within it.
    unlimited = (None if settled(start, False) and settled(start, True)
                 else lazily(False, start))
    limited = lazily(True, start if unlimited is None else unlimited.known)
    rounds = limited.rounds + (unlimited.rounds if unlimited else 0)
    logger.info("costing: %d of %d kernels measured or logged, %d more at a library call's "
                "time alone, plan settled in %d round(s)", len(limited.known), len(kept_kernels),
                len(set(ceilings) - set(best)), rounds)
    return {**ceilings, **best}, limited.solution[2]


def _cannot_win(solve, predicted, known, margin, anchors, ceilings, beat_seconds: float,
                stage: str) -> bool:
    """Whether the plan on optimistic prices (`known` costs, the ceilings, the other
    predictions calibrated and lowered by `margin`) models above `beat_seconds`, said in one
    line: then no plan of this program can win, as far as the lowered predictions are lower
    bounds (the premise of lazy costing)."""
    bound = optimistic_plan(solve, predicted, known, margin, _library_apart(anchors, known),
                            ceilings)[2]
    if bound <= beat_seconds:
        return False
    logger.info("this layout cannot win: its optimistic plan models %.3f ms %s, above the "
                "%.3f ms of a layout planned before; not measured further", bound * 1e3, stage,
                beat_seconds * 1e3)
    return True


def _with_seconds(solve, key_of_candidate):
    """`solve` as lazy costing calls it: (solution, chosen kernels' keys, modelled seconds)."""
    def solve_on(costs, within_memory):
        solution = solve(costs, within_memory=within_memory)
        seconds = math.fsum(plan.objective for plan in solution[1])
        return solution, [key_of_candidate[i] for i in solution[2]], seconds
    return solve_on


def _measured(costs) -> dict:
    """`costs` less those only predicted (nothing could measure them: no device, a budget)."""
    return {key: cost for key, cost in costs.items() if cost.source != "predicted"}


def _library_apart(anchors, known) -> dict:
    """`anchors` with each kernel whose cost is a library call's in a class of its own: a
    BLAS time says nothing of how far off the cost model is for TVM kernels sharing its
    matmul, and calibrating them by it would make every one look cheap and be measured."""
    return {key: ({("library", key)} if key in known and known[key].implementation
                  else anchor) for key, anchor in anchors.items()}


def _remember(store: dict, costs):
    """Add `costs` to `store` and return them."""
    store.update(costs)
    return costs


def logged_or_predicted(kept_kernels, predicted, tuning_log) -> dict[str, KernelCost]:
    """Costs without running anything: a logged record where there is one, else the prediction."""
    costs = {}
    for key, module in kept_kernels.items():
        best = tuning_log.best_seconds(module)
        costs[key] = (KernelCost(predicted[key], "predicted", 0) if best is None
                      else KernelCost(best, "log", 0))
    return costs
