"""How a trial budget is split over kernels: by where the time goes and could be saved.

Each kernel's share is its latency share times its headroom above its floor (costing/headroom.py);
trials go in multiples of `MIN_TRIALS_PER_TASK`, and what the log already covers moves to the
kernels that still need tuning, so a second compile with the same budget runs no trial.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import tvm

from ..backend.target import parse_target
from .default_measurement import default_schedules
from .headroom import kernel_headrooms
from .tuning_log import TuningLog

MIN_TRIALS_PER_TASK = 4


def allocate_trials(shares: Mapping[str, float], budget: int,
                    minimum: int = MIN_TRIALS_PER_TASK) -> dict[str, int]:
    """Split `budget` trials in proportion to each kernel's share of the latency.

    Shares are rounded down to multiples of `minimum`; a kernel whose share is worth fewer than
    `minimum` trials gets none at first (a few random trials rarely beat the default schedule),
    then what is left goes `minimum` at a time to the next kernels by share. Never more than
    `budget` in total; deterministic (ties broken by name).
    """
    usable = {name: share for name, share in shares.items()
              if math.isfinite(share) and share > 0}
    allocation = {name: 0 for name in shares}
    total = sum(usable.values())
    if budget < minimum or total <= 0:
        return allocation
    ranked = sorted(usable, key=lambda name: (-usable[name], name))
    for name in ranked:
        allocation[name] = int(budget * usable[name] / total) // minimum * minimum
    left = budget - sum(allocation.values())
    for name in ranked:
        if left < minimum:
            break
        if allocation[name] == 0:
            allocation[name] = minimum
            left -= minimum
    return allocation


def allocate_new_trials(shares: Mapping[str, float], budget: int, spent: Callable[[str], int],
                        minimum: int = MIN_TRIALS_PER_TASK) -> dict[str, int]:
    """`allocate_trials`, with the trials of kernels the log already covers moved to the rest.

    A kernel covers its allocation when it holds at least half of it in tuning records (the
    test `tune_kernels` applies; `spent(name)` is what it holds, asked only of kernels with
    an allocation), e.g. tuned by the other compile path, which shares most kernels. Those
    allocations are added, by share, to the kernels that still need tuning, so a compile runs
    its whole budget where it can. The additions only ever raise an allocation, so once a
    compile has tuned every kernel so allocated, the next compile with the same budget finds
    each one covered again and runs no trial; a kernel whose share earned no trials earns none
    from what is moved.
    """
    first = allocate_trials(shares, budget, minimum)
    covered = {name for name, trials in first.items()
               if trials == 0 or spent(name) * 2 >= trials}
    moved = allocate_trials({name: share for name, share in shares.items() if name not in covered},
                            sum(first[name] for name in covered), minimum)
    return {name: trials + moved.get(name, 0) for name, trials in first.items()}


def trial_allocation(kernels: Mapping[str, tvm.IRModule], shares: Mapping[str, float],
                     budget: int, tuning_log: TuningLog) -> dict[str, int]:
    """`allocate_new_trials` against what `tuning_log` holds for each kernel, each latency share
    weighted by how far the kernel's default schedule is from its floor (costing/headroom.py)."""
    defaults = {name: tuning_log.default_seconds(kernels[name]) for name in shares}
    headrooms = kernel_headrooms(kernels, {name: seconds for name, seconds in defaults.items()
                                           if seconds is not None})
    savings = {name: share * headrooms.get(name, 1.0) for name, share in shares.items()}
    return allocate_new_trials(savings, budget,
                               lambda name: tuned_trials(tuning_log, kernels[name]))


def tuned_trials(tuning_log: TuningLog, kernel_mod: tvm.IRModule) -> int:
    """Trials already spent on a kernel: the trials asked of MetaSchedule, which are at least
    the records they produced (its search may run out of candidates first); for a kernel the
    log has no such count of (tuned by a korch_tvm from before the count, or never), its distinct
    schedules beyond the default ones (two compiles sharing a log may both measure a default
    schedule: counted as trials, they left a shared log's kernels untuned). Deriving those
    schedules takes ~0.2 s per kernel, which a warm compile with a trial budget would pay for
    every planned kernel."""
    attempts = tuning_log.tuning_attempts(kernel_mod)
    if attempts:
        return attempts
    defaults = max(1, len(default_schedules(kernel_mod, parse_target(tuning_log.target))))
    return max(tuning_log.schedule_count(kernel_mod) - defaults, 0)
