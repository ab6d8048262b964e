"""What costing hands on: a `KernelCost` per kernel, and the counts a report shows of them.

Both compile paths cost their kernels through one `CostingSession` (costing/session.py), the
same tuning log and the same trial budget, which is what makes their comparison fair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import tvm

from .tuning_log import TuningLog

CostSource = Literal["measured", "tuned", "log", "predicted", "failed"]
Predictor = Callable[[tvm.IRModule], float]


@dataclass(frozen=True)
class KernelCost:
    """Latency of one kernel and where the number came from."""

    seconds: float
    source: CostSource
    trials: int
    error: str | None = None
    # A seed log's schedule measured here beside the defaults (costing/log_seeds.py): "kept" when
    # it was the faster and went into the log, "slower" when not; None when there was none.
    seed_schedule: Literal["kept", "slower"] | None = None
    rechecked: bool = False  # an implausible logged time was measured again (costing/headroom.py)


def default_schedule_costs(kernels: Mapping[str, tvm.IRModule], costs: Mapping[str, KernelCost],
                           tuning_log: TuningLog) -> dict[str, KernelCost]:
    """Costs as they were before any tuning (each kernel's first, default-schedule record).

    A plan chosen from these is the same on every compile, whatever was tuned since, so the
    trial budget it steers is spent once and a re-run finds nothing left to tune.
    """
    result = {}
    for name, cost in costs.items():
        # a failed kernel keeps its prediction: its logged default run is the failure itself
        looked_up = cost.source not in ("predicted", "failed")
        default = tuning_log.default_seconds(kernels[name]) if looked_up else None
        result[name] = cost if default is None else KernelCost(default, "measured", 0, cost.error)
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
    }
