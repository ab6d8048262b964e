"""What costing hands on: a `KernelCost` per kernel, and the counts a report shows of them.

Both compile paths cost their kernels through one `CostingSession` (costing/session.py), the
same tuning log and the same trial budget, which is what makes their comparison fair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import tvm

from .tuning_log import TuningLog

CostSource = Literal["measured", "tuned", "log", "predicted", "failed"]
Predictor = Callable[[tvm.IRModule], float]


class LibraryTime(NamedTuple):
    """A library implementation of a kernel (costing/library_costs.py) and its measured time."""

    implementation: str  # e.g. "openblas.sgemm"
    seconds: float
    measured_now: bool = False  # False: read from library_times.json


@dataclass(frozen=True)
class KernelCost:
    """Latency of one kernel and where the number came from.

    `implementation` names the library call the cost is the time of (None: TVM's kernel);
    `library` is the kernel's library implementation and its time whichever won, so a later
    TVM cost (a default-schedule record, a tuned one) is compared with it again."""

    seconds: float
    source: CostSource
    trials: int
    error: str | None = None
    # A seed log's schedule measured here beside the defaults (costing/log_seeds.py): "kept" when
    # it was the faster and went into the log, "slower" when not; None when there was none.
    seed_schedule: Literal["kept", "slower"] | None = None
    rechecked: bool = False  # an implausible logged time was measured again (costing/headroom.py)
    implementation: str | None = None
    library: LibraryTime | None = None


def cheaper_of(cost: KernelCost, library: LibraryTime | None) -> KernelCost:
    """`cost` (TVM's) or the library's time, whichever is lower, remembering the library.

    A failed TVM kernel takes the library's time; a predicted one only when the library is
    faster than the prediction (the library's time is measured, so the cost then is too:
    "measured" when it was timed now, "log" when read from the file)."""
    if library is None or cost.implementation is not None:  # already the cheaper of the two
        return cost
    if cost.source == "failed" or library.seconds < cost.seconds:
        source = cost.source
        if source in ("predicted", "failed"):
            source = "measured" if library.measured_now else "log"
        return replace(cost, seconds=library.seconds, source=source, error=None,
                       implementation=library.implementation, library=library)
    return replace(cost, library=library)


def default_schedule_costs(kernels: Mapping[str, tvm.IRModule], costs: Mapping[str, KernelCost],
                           tuning_log: TuningLog) -> dict[str, KernelCost]:
    """Costs as they were before any tuning (each kernel's first, default-schedule record).

    A plan chosen from these is the same on every compile, whatever was tuned since, so the
    trial budget it steers is spent once and a re-run finds nothing left to tune.
    """
    # a failed kernel keeps its prediction: its logged default run is the failure itself
    looked_up = [name for name, cost in costs.items()
                 if cost.source not in ("predicted", "failed")]
    defaults = dict(zip(looked_up, tuning_log.default_seconds_of([kernels[name]
                                                                  for name in looked_up])))
    result = {}
    for name, cost in costs.items():
        default = defaults.get(name)
        if default is not None:
            cost = cheaper_of(KernelCost(default, "measured", 0, cost.error), cost.library)
        result[name] = cost
    return result


def merge_summaries(summaries: Iterable[dict]) -> dict:
    """`summarize` counts of several costings (one per layout planned) added up."""
    total = Counter()
    for summary in summaries:
        total.update(summary)
    return {key: total[key] for key in summarize([])}


def summarize(costs: Iterable[KernelCost]) -> dict:
    """Counts by where each cost came from, and the trials that ran."""
    costs = list(costs)
    by_source = Counter(cost.source for cost in costs)
    return {
        "kernels": len(costs),
        "from_log": by_source.get("log", 0),
        "tuned": by_source.get("tuned", 0),
        "measured": by_source.get("measured", 0),
        "predicted": by_source.get("predicted", 0),
        "failed": by_source.get("failed", 0),
        "trials_run": sum(cost.trials for cost in costs if cost.source == "tuned"),
        # seed schedules (costing/log_seeds.py) measured here, and those faster than the defaults
        "seed_schedules_measured": sum(cost.seed_schedule is not None for cost in costs),
        "seed_schedules_kept": sum(cost.seed_schedule == "kept" for cost in costs),
        "rechecked": sum(cost.rechecked for cost in costs),
        # costs that are a library implementation's time (costing/library_costs.py)
        "library": sum(cost.implementation is not None for cost in costs),
    }
