"""Glue between the compile paths and the profiler: open the log, cost kernels, summarise.

Both the stock and the Korch path cost their kernels here, through the same tuning log and the
same trial budget, which is what makes their comparison fair.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import tvm

from ..backend.cuda import device_present
from ..backend.target import parse_target
from ..config import KorchConfig
from ..kernels.fused import structural_key
from ..layout.activations import layout_trial_share
from .log_seeds import Seed, seed_log
from .measure import (KernelCost, local_runner, measure_kernels, profile_kernels, rpc_runner,
                      trial_allocation, tune_kernels)
from .tuning_log import TuningLog


@dataclass(frozen=True)
class Costing:
    costs: dict[str, KernelCost]  # name -> cost, for every kernel passed in
    summary: dict  # JSON-friendly counts for the report
    tuning_log: TuningLog


def open_tuning_log(config: KorchConfig) -> tuple[TuningLog, Seed | None]:
    """The configured log, or a throw-away one when the user keeps no logs, seeded when it is
    empty (costing/log_seeds.py), and the foreign seed it uses for predictions and starting
    points."""
    root = config.tuning_logs or tempfile.mkdtemp(prefix="korch-tvm-log-")
    tuning_log = TuningLog(root, config.target)
    return tuning_log, seed_log(tuning_log)


def configured_runner(config: KorchConfig):
    """MetaSchedule's RPC runner when a tracker is configured, else None (local runner)."""
    if not config.rpc_tracker:
        return None
    host, _, port = config.rpc_tracker.rpartition(":")
    if not host or not port.isdigit() or not config.rpc_key:
        from ..errors import KorchError

        raise KorchError("--rpc-tracker takes HOST:PORT and needs --rpc-key")
    return rpc_runner(host, int(port), config.rpc_key)


def cost_kernels(kernels: Mapping[str, tvm.IRModule], config: KorchConfig,
                 weights: Mapping[str, float] | None = None,
                 tuning_log: TuningLog | None = None) -> Costing:
    """Cost every kernel (the profiler costs each distinct structure once) within this
    layout's part of the trial budget (`layout_trial_share`)."""
    seed = None
    if tuning_log is None:
        tuning_log, seed = open_tuning_log(config)
    costs = profile_kernels(kernels, config.target, tuning_log, trials=config.trials,
                            trials_per_kernel=config.trials_per_kernel,
                            budget_share=layout_trial_share(),
                            time_budget=config.time_budget, weights=weights,
                            runner=configured_runner(config), progress=config.progress,
                            seed=config.seed, seed_log=seed)
    distinct = {structural_key(kernels[name]): costs[name] for name in kernels}
    return Costing(costs, summarize(distinct.values()), tuning_log)


def shared_runner(config: KorchConfig):
    """One runner for several `measure_costs` calls, so its worker pool starts once (None
    where nothing can run: the calls then predict)."""
    runner = configured_runner(config)
    if runner is None and device_present(parse_target(config.target)):
        runner = local_runner(parse_target(config.target))
    return runner


def measure_costs(kernels: Mapping[str, tvm.IRModule], config: KorchConfig,
                  tuning_log: TuningLog, predictor=None, runner=None,
                  builder=None, seed: Seed | None = None) -> dict[str, KernelCost]:
    """Every kernel's best known cost: from the log, one default measurement (and the seed's
    schedule), or a prediction."""
    return measure_kernels(kernels, config.target, tuning_log, time_budget=config.time_budget,
                           runner=runner or configured_runner(config), builder=builder,
                           predictor=predictor, progress=config.progress, seed_log=seed)


def default_schedule_costs(kernels: Mapping[str, tvm.IRModule], costs: Mapping[str, KernelCost],
                           tuning_log: TuningLog) -> dict[str, KernelCost]:
    """Costs as they were before any tuning (each kernel's first, default-schedule record).

    A plan chosen from these is the same on every compile, whatever was tuned since, so the
    trial budget it steers is spent once and a re-run finds nothing left to tune.
    """
    result = {}
    for name, cost in costs.items():
        default = tuning_log.default_seconds(kernels[name]) if cost.source != "predicted" else None
        result[name] = cost if default is None else KernelCost(default, "measured", 0, cost.error)
    return result


def tune_costs(kernels: Mapping[str, tvm.IRModule], shares: Mapping[str, float],
               costs: Mapping[str, KernelCost], config: KorchConfig,
               tuning_log: TuningLog) -> dict[str, KernelCost]:
    """Spend the trial budget on `kernels` by their latency `shares`; return the updated costs."""
    tunable = sum(1 for share in shares.values() if math.isfinite(share) and share > 0)
    allocation = trial_allocation(kernels, shares, config.trial_budget(tunable), tuning_log)
    tuned = tune_kernels(kernels, allocation, config.target, tuning_log,
                         time_budget=config.time_budget, runner=configured_runner(config),
                         progress=config.progress, seed=config.seed)
    return {**costs, **tuned}


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
