"""Measure only the kernels a plan wants: solve on predictions, measure what is chosen, repeat.

Measuring every candidate's default schedule dominated cold compiles, and most candidates are
never chosen. So the solver first sees predictions for everything the log does not know, scaled
optimistically; the kernels of its plan that are still predictions are measured and the problem
is solved again, until the plan consists of measured kernels only. If every scaled prediction
were at most the kernel's measured time, the final plan would be the one full costing finds: any
other plan costs at least its optimistic sum, which is no less than the final plan's measured sum.

The scaling is a calibration, then a margin. A prediction is multiplied by the median measured /
predicted ratio of already measured kernels that share an *anchor* with it (the caller's choice:
the same matmul or convolution primitive, or the class of memory-bound kernels), else by the
median ratio of all measured kernels: the variants of one big matmul are mispredicted alike, so
their measured sibling corrects them far better than a global factor. It is then divided by
`1 + margin`. A wide margin makes every unmeasured variant of a big kernel look cheaper than the
measured one, and the loop measures them all; a narrow one trusts the calibrated model.

A kernel may also have a ceiling: a real cost that measuring it can only lower (a library
call's time; measuring TVM's kernel keeps the cheaper of the two). It is priced at the lower of
the ceiling and its optimistic prediction, and measured only when a plan wants it below the
ceiling.

The loop depends only on the log, the ceilings and the predictor, so a second compile with the
same log finds the last round's plan at once and measures nothing.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .measure import KernelCost

logger = logging.getLogger("korch_tvm.lazy_costing")

MIN_CALIBRATION_KERNELS = 3  # fewer measured kernels than this: predictions are used as they are
CALIBRATION_STEP = math.log(1.05)  # calibration factors are multiples of 5 % (`_snapped`)

Solution = TypeVar("Solution")


@dataclass(frozen=True)
class LazyResult(Generic[Solution]):
    known: dict[str, KernelCost]   # every kernel with a real number (log or measured)
    solution: Solution             # the last solve, on `known` plus optimistic predictions
    rounds: int                    # solves it took


def calibration(known: Mapping[str, KernelCost], predicted: Mapping[str, float]) -> float:
    """Median ratio measured / predicted over the known kernels (1 when too few to tell).

    The analytic estimate is a roofline, often an order of magnitude below a default schedule;
    unscaled it would make every unmeasured kernel look better than every measured one, and the
    loop would end up measuring nearly everything.
    """
    ratios = list(_log_ratios(known, predicted).values())
    if len(ratios) < MIN_CALIBRATION_KERNELS:
        return 1.0
    return _snapped(statistics.median(ratios))


def _log_ratios(known: Mapping[str, KernelCost], predicted: Mapping[str, float]):
    return {key: math.log(cost.seconds / predicted[key]) for key, cost in known.items()
            if key in predicted and math.isfinite(cost.seconds) and cost.seconds > 0
            and predicted[key] > 0}


def calibrated_predictions(predicted: Mapping[str, float], known: Mapping[str, KernelCost],
                           anchors: Mapping[str, Collection[Hashable]]) -> dict[str, float]:
    """Every unknown kernel's prediction times the ratio of its measured siblings (see above).

    `anchors[key]` are the primitives that carry the kernel's work; kernels sharing one are
    siblings. Kernels without a measured sibling take the global `calibration`.
    """
    ratios = _log_ratios(known, predicted)
    by_anchor: dict[Hashable, list[float]] = {}
    for key, ratio in ratios.items():
        for anchor in anchors.get(key, ()):
            by_anchor.setdefault(anchor, []).append(ratio)
    overall = calibration(known, predicted)
    result = {}
    for key, seconds in predicted.items():
        if key in known:
            continue
        siblings = [r for anchor in anchors.get(key, ()) for r in by_anchor.get(anchor, ())]
        result[key] = seconds * (_snapped(statistics.median(siblings)) if siblings else overall)
    return result


def _snapped(log_ratio: float) -> float:
    """exp(log_ratio) on a grid of CALIBRATION_STEP: each measurement moves a median a little,
    and unsnapped every unknown kernel's price would move with it, so every piece of the
    program would be solved again in every round (SegFormer: 16 of 18 pieces a round)."""
    return math.exp(round(log_ratio / CALIBRATION_STEP) * CALIBRATION_STEP)


def optimistic_costs(calibrated: Mapping[str, float], known: Mapping[str, KernelCost],
                     margin: float, ceilings: Mapping[str, KernelCost] | None = None
                     ) -> dict[str, KernelCost]:
    """What a lazy round solves on: `known` costs, and the `calibrated_predictions` of the
    rest lowered by `margin`, or a kernel's ceiling where that is lower (see `solve_lazily`)."""
    ceilings = ceilings or {}
    costs = {key: _lowered(key, seconds / (1.0 + margin), ceilings)
             for key, seconds in calibrated.items()}
    costs.update(known)
    return costs


def _lowered(key: str, seconds: float, ceilings: Mapping[str, KernelCost]) -> KernelCost:
    ceiling = ceilings.get(key)
    return ceiling if ceiling is not None and ceiling.seconds <= seconds else \
        KernelCost(seconds, "predicted", 0)


def measured_only_costs(predicted: Mapping[str, float], known: Mapping[str, KernelCost],
                        ceilings: Mapping[str, KernelCost] | None = None
                        ) -> dict[str, KernelCost]:
    """`known` costs, then the ceilings, and the rest priced as failed runs
    (costing/failed_costs.py): no plan chooses one but a stock group that nothing measured (no
    device), at its prediction."""
    costs = {key: KernelCost(seconds, "failed", 0, error="not measured")
             for key, seconds in predicted.items() if key not in known}
    costs.update(ceilings or {})
    costs.update(known)
    return costs


def optimistic_plan(solve, predicted: Mapping[str, float], known: Mapping[str, KernelCost],
                    margin: float, anchors: Mapping[str, Collection[Hashable]],
                    ceilings: Mapping[str, KernelCost] | None = None):
    """`solve`'s answer on the optimistic prices (`known`, and calibrated predictions lowered by
    `margin`, or the ceilings below them): (solution, chosen keys, modelled seconds, the
    optimistic prices). Its seconds bound what any plan costs, as far as the lowered
    predictions are lower bounds."""
    optimistic = optimistic_costs(calibrated_predictions(predicted, known, anchors), known,
                                  margin, ceilings)
    return (*solve(optimistic), optimistic)


def lazy_round(solve, predicted: Mapping[str, float], known: Mapping[str, KernelCost],
               margin: float, anchors: Mapping[str, Collection[Hashable]], gap: float = 0.0,
               number: int | None = None, ceilings: Mapping[str, KernelCost] | None = None
               ) -> tuple[Solution, list[str], dict[str, KernelCost]]:
    """One round of `solve_lazily`: (the plan, the kernels to measure for it, the optimistic
    prices); no kernels when the plan is settled, measured in full (or at ceilings TVM's
    kernel cannot beat) or within `gap`. `number` is the round's, for the log (None: a check
    that logs nothing)."""
    solution, chosen, bound, optimistic = optimistic_plan(solve, predicted, known, margin,
                                                          anchors, ceilings)
    missing = sorted({key for key in chosen if key is not None and key not in known
                      and optimistic[key].source == "predicted"})
    if not missing or gap <= 0:
        if missing and number is not None:
            logger.info("round %d: measuring %d kernels of the plan that were predictions",
                        number, len(missing))
        return solution, missing, optimistic
    ceilings = ceilings or {}
    settled, kernels, seconds = solve(measured_only_costs(predicted, known, ceilings))
    measured_plan = all(key is None or key in known or key in ceilings for key in kernels)
    if measured_plan and seconds <= bound * (1.0 + gap):
        if number is not None:
            logger.info("round %d: the plan of measured kernels (%.3f ms) is within %g %% "
                        "of the optimistic one (%.3f ms): %d kernels left unmeasured",
                        number, seconds * 1e3, gap * 100, bound * 1e3, len(missing))
        return settled, [], optimistic
    if number is not None:
        # the distance still to close, so that a long cold compile shows it converging
        apart = (f"{(seconds / bound - 1.0) * 100:.1f} % above" if measured_plan
                 and math.isfinite(seconds) and bound > 0 else "not yet comparable to")
        logger.info("round %d: measuring %d kernels of the plan that were predictions (the "
                    "plan of measured kernels models %s the optimistic %.3f ms)", number,
                    len(missing), apart, bound * 1e3)
    return solution, missing, optimistic


def solve_lazily(solve: Callable[[dict[str, KernelCost]],
                                 tuple[Solution, Collection[str], float]],
                 predicted: Mapping[str, float], known: Mapping[str, KernelCost],
                 measure: Callable[[list[str]], Mapping[str, KernelCost]],
                 margin: float,
                 anchors: Mapping[str, Collection[Hashable]] | None = None,
                 gap: float = 0.0, ceilings: Mapping[str, KernelCost] | None = None
                 ) -> LazyResult[Solution]:
    """Solve, measure the chosen kernels that are only predicted, and solve again until none are,
    or until the best plan of measured kernels is within `gap` of the optimistic one.

    `ceilings` are real costs of some unknown kernels that measuring them could only lower (a
    library call's time: measuring TVM's kernel keeps the cheaper of the two). Such a kernel is
    priced at the lower of its ceiling and its optimistic prediction, and measured only when a
    plan chooses it below its ceiling: at the ceiling, TVM's kernel could not beat it.

    `solve(costs)` returns (solution, keys of the chosen kernels, its modelled seconds);
    `measure(keys)` returns a cost for each key, "predicted" where it could not measure (a time
    budget ran out), which ends the loop with those predictions in the plan. Without `anchors`
    every kernel takes the global calibration.

    The optimistic plan's seconds bound what any plan can cost, as far as the scaled
    predictions are lower bounds (the premise of the loop), so a plan of measured kernels
    within `gap` of it is within `gap` of the fully costed optimum: the rounds that would
    measure the rest can gain no more (the last rounds of a cold ViT-S/32 plan measured one
    or two kernels each for plans a fraction of a percent apart).
    """
    assert margin >= 0 and math.isfinite(margin), "lazy costing needs a finite margin"
    known = dict(known)
    anchors = anchors or {}
    rounds = 0
    while True:
        rounds += 1
        solution, missing, optimistic = lazy_round(solve, predicted, known, margin, anchors, gap,
                                                   rounds, ceilings)
        if not missing:
            return LazyResult(known, solution, rounds)
        measured = {key: cost for key, cost in measure(missing).items()
                    if cost.source != "predicted"}
        if not measured:
            # the profiler has said why (no device, time budget spent)
            logger.info("nothing measured; the plan keeps %d kernels costed by prediction",
                        len(missing))
            return LazyResult(known, solution, rounds)
        for key, cost in measured.items():
            logger.debug("kernel %s: optimistic price %.3g ms, measured %.3g ms", key,
                         optimistic[key].seconds * 1e3, cost.seconds * 1e3)
        known.update(measured)
