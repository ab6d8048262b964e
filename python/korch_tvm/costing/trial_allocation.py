"""How a trial budget is split over kernels: by where the time goes and could be saved.

Each kernel's share is its latency share times its headroom above its floor (costing/headroom.py);
trials go in multiples of `MIN_TRIALS_PER_TASK`. The budget is what a plan's kernels should hold
in all: trials the log already holds for them count, whichever compile ran them, so a second
compile with the same budget runs no trial even where tuning made it choose other kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import tvm

from ..backend.target import parse_target
from ..kernels.keys import structurally_equal_groups
from .default_measurement import default_schedules
from .headroom import kernel_headrooms
from .tuning_log import TuningLog

MIN_TRIALS_PER_TASK = 4


def allocate_trials(shares: Mapping[str, float], budget: int,
                    minimum: int = MIN_TRIALS_PER_TASK) -> dict[str, int]:
    """Split `budget` trials in proportion to each kernel's share of the latency.

    Shares are rounded down to multiples of `minimum`; a kernel whose share is worth fewer than
    `minimum` trials gets none at first (a few random trials rarely beat the default schedule),
    then what is left goes `minimum` at a time to the next kernels by share, those without
    trials first. Never more than `budget` in total, less only by under `minimum` where a kernel
    is left without trials; deterministic (ties broken by name).
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
    for name in [n for n in ranked if allocation[n] == 0] + ranked:
        if left < minimum:
            break
        allocation[name] += minimum
        left -= minimum
    return allocation


def allocate_new_trials(shares: Mapping[str, float], budget: int, spent: Callable[[str], int],
                        minimum: int = MIN_TRIALS_PER_TASK, others: int = 0) -> dict[str, int]:
    """How many trials each kernel should hold once this compile has tuned (`tune_kernels`
    runs the difference); 0 for a kernel it leaves alone.

    `allocate_trials` says what each kernel's share is worth; a kernel holding at least half
    of that (`spent(name)`: trials the log holds for it, asked only of kernels worth some) is
    covered. The others are tuned up to their worth, but in all only by what the budget has
    left over what the log already holds for these kernels and the model's `others` (trials it
    holds for its kernels worth none here: those a plan could choose instead). A compile whose
    tuning made the solver choose other kernels has spent its budget on this model, so the next
    compile with that budget runs no trial; a much larger budget tunes more. Where the log holds
    another compile path's trials for some kernels, those count too, and the rest is split by
    share among the kernels still to tune.
    """
    worth = allocate_trials(shares, budget, minimum)
    if not any(worth.values()):
        return worth
    held = {name: spent(name) for name, trials in worth.items() if trials}
    owed = {name: trials - held[name] for name, trials in worth.items()
            if trials and held[name] * 2 < trials}
    left = budget - sum(held.values()) - others
    if left < minimum or not owed:
        return dict.fromkeys(shares, 0)
    if sum(owed.values()) > left:
        owed = {name: trials for name, trials in
                allocate_trials({name: shares[name] for name in owed}, left, minimum).items()
                if trials}
    return {name: held[name] + owed[name] if name in owed else 0 for name in shares}


def trial_allocation(kernels: Mapping[str, tvm.IRModule], shares: Mapping[str, float],
                     budget: int, tuning_log: TuningLog) -> dict[str, int]:
    """`allocate_new_trials` against what `tuning_log` holds for each kernel, each latency share
    weighted by how far the kernel's default schedule is from its floor (costing/headroom.py).

    `kernels` may name more than `shares` does: the model's other candidate kernels, whose
    trials count toward the budget too. Structurally equal kernels are one kernel, their shares
    added (tune_kernels tunes them once)."""
    if budget < MIN_TRIALS_PER_TASK:
        return dict.fromkeys(shares, 0)
    groups = structurally_equal_groups(kernels)
    first_of = {name: first for first, names in groups.items() for name in names}
    defaults = {name: tuning_log.default_seconds(kernels[name]) for name in shares}
    headrooms = kernel_headrooms(kernels, {name: seconds for name, seconds in defaults.items()
                                           if seconds is not None})
    savings: dict[str, float] = {}
    for name, share in shares.items():
        first = first_of[name]
        savings[first] = savings.get(first, 0.0) + share * headrooms.get(name, 1.0)
    worth = allocate_trials(savings, budget)
    others = sum(tuning_log.tuning_attempts(kernels[first]) for first in groups
                 if not worth.get(first))   # the count alone: deriving it costs ~0.2 s a kernel
    allocation = allocate_new_trials(savings, budget,
                                     lambda name: tuned_trials(tuning_log, kernels[name]),
                                     others=others)
    return {name: allocation[first_of[name]] for name in shares}


def tuned_trials(tuning_log: TuningLog, kernel_mod: tvm.IRModule) -> int:
    """Trials already spent on a kernel: the trials asked of MetaSchedule, which are at least
    the records they produced (its search may run out of candidates first); for a kernel the
    log has no such count of (tuned by a korch_tvm from before the count, or never), its distinct
    schedules beyond the default ones (two compiles sharing a log may both measure a default
    schedule: counted as trials, they left a shared log's kernels untuned). Deriving those
    schedules takes ~0.2 s per kernel, so only a kernel with more than one schedule pays it."""
    attempts = tuning_log.tuning_attempts(kernel_mod)
    if attempts:
        return attempts
    schedules = tuning_log.schedule_count(kernel_mod)
    if schedules <= 1:   # at most its default schedule: no trials
        return 0
    defaults = max(1, len(default_schedules(kernel_mod, parse_target(tuning_log.target))))
    return max(schedules - defaults, 0)
