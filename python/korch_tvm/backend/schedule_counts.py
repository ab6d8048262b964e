"""Where the built kernels' schedules came from, counted so that each number says what it counts.

A kernel's schedule comes from one of three places: a MetaSchedule search (this compile's or an
earlier one's, kept in the tuning log); a recorded default schedule (the profiler logs each
kernel's measured default schedule with its trace, so the build re-applies exactly what was
measured); or the default-schedule rule at build time, when no record is usable. Only the first
is a tuned kernel. A compile report once called every kernel with a log record "tuned"
(`kernels_with_tuned_schedule: 16/16` beside "tuned 0" at 0 trials); these counts keep the
three apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import tvm


def schedule_counts(built: tvm.IRModule, kernel_modules: Iterable[tvm.IRModule],
                    tuning_log) -> dict[str, str]:
    """The report's schedule counts: `kernels_scheduled_from_log` over the built module's
    PrimFuncs (a searched or a recorded default schedule applied from the log), and
    `kernels_with_searched_schedule` over the distinct kernels planned (`kernel_modules`)."""
    from .rewrite import scheduled_kernel_count

    from_log, built_total = scheduled_kernel_count(built)
    modules = list(kernel_modules)
    searched = sum(improved_by_search(tuning_log, module) for module in modules)
    return {"kernels_scheduled_from_log": f"{from_log}/{built_total}",
            "kernels_with_searched_schedule": f"{searched}/{len(modules)}"}


def improved_by_search(tuning_log, kernel_mod: tvm.IRModule) -> bool:
    """Whether MetaSchedule has searched this kernel (the log counts the trials it was asked
    for) and its best record beats its default-schedule measurement (the kernel's first
    record), so that the schedule the build applies is a search's. A log written before the
    trial count was kept shows no search."""
    if tuning_log.tuning_attempts(kernel_mod) <= 0:
        return False
    best, default = tuning_log.best_seconds(kernel_mod), tuning_log.default_seconds(kernel_mod)
    return (best is not None and default is not None and math.isfinite(best)
            and best < default)


def split_count(text) -> tuple[int, int] | None:
    """(count, total) of an "a/b" count, None when absent or malformed."""
    try:
        count, total = str(text).split("/")
        return int(count), int(total)
    except ValueError:
        return None
