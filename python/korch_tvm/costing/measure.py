"""Cost every candidate kernel: reuse the tuning log, measure or tune the rest, predict the leftovers.

The stage, per distinct kernel module, in order:
1. a record in the log -> its best time, zero trials (a second compile does no work); a kernel
   whose records are all failures is retried until it has failed `FAILED_ATTEMPTS_KEPT` times,
   and a best time implausibly far above the kernel's floor and prediction is measured again
   first (`headroom.implausible`);
2. otherwise its default schedules are built and run once and the result recorded
   (costing/default_measurement.py), with a seed log's best schedule beside them;
3. whatever `time_budget` left without a measurement gets a cost-model prediction;
4. with `trials > 0`, the budget is split where the time goes and could be saved
   (costing/trial_allocation.py) and MetaSchedule tunes each kernel up to its share; every
   trial lands in the log through its database, and a kernel already tuned that far is not
   tuned again; each kernel's new fastest records are then run against the kernel as written
   and the wrong ones set aside (`set_aside_wrong_records`).

A compile calls these through its `CostingSession` (costing/session.py), which holds the log,
runner, builders and deadline they share.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager

import tvm

from ..backend.cuda import device_present, no_device_reason
from ..backend.target import host_core_count, parse_target
from ..config import trial_budget, tunes
from ..errors import error_summary
from ..kernels.fused import structurally_equal_groups
from ..support.interrupts import raise_if_stopped, stopping_after_batch
from ..support.pool_spin import wait_for_idle_pool
from .default_measurement import FAILED_ATTEMPTS_KEPT, measure_and_commit, retry_failure
from .default_measurement import default_schedules as _default_schedules  # noqa: F401 (tests)
from .headroom import implausible
from .failed_costs import costed_by_prediction
from .kernel_costs import KernelCost, Predictor
from .metaschedule_setup import local_builder, prepare_for_target, search_strategy
from .pooled_builder import PooledBuilder
from .progress import Progress
from .progress import Progress as _Progress  # noqa: F401 (its former name, used by tests)
from .record_check import can_check, first_correct
from .runners import (counting_runner, links_here, local_runner, metaschedule_logger,
                      metaschedule_logs_routed)
from .runners import rpc_runner  # noqa: F401 (imported from here by callers)
from .trial_allocation import (MIN_TRIALS_PER_TASK, allocate_new_trials,  # noqa: F401
                               allocate_trials, trial_allocation, tuned_trials)
from .log_files import RECORD_FILE
from .log_lines import record_seconds
from .tuning_log import TuningLog

logger = logging.getLogger("korch_tvm.profiler")

# Kernels are tuned in groups so the time budget and Ctrl-C are checked between them.
TUNE_GROUP = 4
INITIAL_SECONDS_PER_TRIAL = 0.5  # first guess, replaced by the observed rate
__all__ = ["FAILED_ATTEMPTS_KEPT", "KernelCost", "allocate_new_trials", "allocate_trials",
           "measure_kernels", "profile_kernels", "set_aside_wrong_records", "trial_allocation",
           "tune_kernels"]


def profile_kernels(kernels: Mapping[str, tvm.IRModule], target, tuning_log: TuningLog, *,
                    trials: int, time_budget: float | None = None,
                    weights: Mapping[str, float] | None = None, runner=None, builder=None,
                    predictor: Predictor | None = None, progress: bool | None = None,
                    seed: int = 0, trials_per_kernel: int | None = None,
                    budget_share: tuple[int, int] = (0, 1), seed_log=None,
                    scratch: str | None = None) -> dict[str, KernelCost]:
    """Cost each kernel (`{"main": PrimFunc}` modules); see the module docstring for the order.

    `trials` is the total tuning budget, split by `trial_allocation` in proportion to each
    kernel's share of the model's latency (`weights`: how often it runs, times its
    default-schedule time) times its headroom; `time_budget` (seconds) bounds the whole
    stage; `runner` defaults to this machine, `builder` (for the default-schedule
    measurements) to a pool of this call; `predictor` defaults to the log's cost model. With
    `trials_per_kernel` the budget is that many per kernel that has a share instead.
    `budget_share` (i, n): this call may spend the i-th of n parts of that budget (one layout
    variant of n, layout.activations.trial_part). `progress`, `seed`, `scratch`: as in
    `tune_kernels`; `seed_log`: as in `measure_kernels`.
    """
    from ..layout.activations import trial_part

    started = time.perf_counter()
    costs = measure_kernels(kernels, target, tuning_log, time_budget=time_budget, runner=runner,
                            builder=builder, predictor=predictor, progress=progress,
                            seed_log=seed_log)
    if not tunes(trials, trials_per_kernel):
        return costs
    weights = dict(weights or {})
    shares = {}
    for name, cost in costs.items():
        default = tuning_log.default_seconds(kernels[name]) if cost.source != "predicted" else None
        if default is not None and math.isfinite(default):
            shares[name] = weights.get(name, 1.0) * default
    budget = trial_part(trial_budget(trials, trials_per_kernel, len(shares)), budget_share)
    allocation = trial_allocation(kernels, shares, budget, tuning_log)
    remaining = None if time_budget is None else time_budget - (time.perf_counter() - started)
    tuned = tune_kernels(kernels, allocation, target, tuning_log, time_budget=remaining,
                         runner=runner, progress=progress, seed=seed, scratch=scratch)
    return {**costs, **tuned}


def tune_kernels(kernels: Mapping[str, tvm.IRModule], allocation: Mapping[str, int], target,
                 tuning_log: TuningLog, *, time_budget: float | None = None, runner=None,
                 builder=None, progress: bool | None = None, seed: int = 0,
                 scratch: str | None = None) -> dict[str, KernelCost]:
    """Tune each kernel until the log holds its allocated trials; kernels that far are skipped.

    `allocation`: trials per kernel name (`trial_allocation`, which decides what counts as
    tuned enough, so a second compile with the same budget runs none); `time_budget`: seconds it may
    take; `runner`/`builder`: MetaSchedule's (default: this machine's, the builder exporting
    under `scratch`); `progress`: the progress line (None: when stderr is a terminal); `seed`:
    of the search. Returns costs for the kernels that were tuned now.
    """
    target, deadline = _prepared(target, time_budget)
    todo: dict[int, list[str]] = {}
    allocated = {n: kernels[n] for n in allocation if allocation[n] > 0}
    for name in structurally_equal_groups(allocated):
        spent = tuned_trials(tuning_log, kernels[name])
        if spent < allocation[name]:
            more = -(-(allocation[name] - spent) // MIN_TRIALS_PER_TASK) * MIN_TRIALS_PER_TASK
            todo.setdefault(more, []).append(name)
    if not todo:
        return {}
    if runner is None and not device_present(target):
        logger.warning("%s: the %d kernels keep their predicted costs; nothing is tuned",
                       no_device_reason(target), sum(len(names) for names in todo.values()))
        return {}
    builder = builder or local_builder(target, max_workers=max(1, host_core_count()),
                                       scratch=scratch, linked=links_here(runner, target))
    runner = runner or local_runner(target)
    bar = Progress(sum(per_task * len(names) for per_task, names in todo.items()), progress,
                    unit="trials")
    if bar.enabled:  # the line moves per trial measured
        runner = counting_runner(runner, lambda: bar.tick(1, "tune"))
    costs: dict[str, KernelCost] = {}
    with metaschedule_logs_routed(), stopping_after_batch():
        for per_task, names in sorted(todo.items(), reverse=True):
            costs.update(_tune(names, kernels, target, tuning_log, builder, runner, per_task,
                               deadline, bar, seed))
    bar.close()
    left = sum(len(names) for names in todo.values()) - len(costs)
    if left:  # only the deadline stops _tune short
        logger.warning("time budget reached: %d kernel(s) keep their default schedule; the next "
                       "compile with this budget tunes them", left)
    return costs


def _tune(names, kernels, target, tuning_log, builder, runner, per_task, deadline, bar, seed):
    """MetaSchedule tuning, `per_task` trials each, in groups that the deadline can stop."""
    group = TUNE_GROUP  # also the points where Ctrl-C and the deadline are checked
    seconds_per_trial = INITIAL_SECONDS_PER_TRIAL
    costs = {}
    for start in range(0, len(names), max(1, group)):
        raise_if_stopped()
        chunk = names[start:start + group]
        remaining = deadline - time.perf_counter()
        if remaining < seconds_per_trial * per_task * len(chunk):
            break  # the rest keep their default-schedule measurement
        before = {n: tuning_log.record_count(kernels[n]) for n in chunk}
        began, ticked = time.perf_counter(), bar.done
        errors = _tune_group(chunk, kernels, target, tuning_log, builder, runner, per_task,
                             seed + start)
        done = {n: tuning_log.record_count(kernels[n]) - before[n] for n in chunk}
        for name in chunk:
            tuning_log.add_tuning_attempts(kernels[name], per_task)
            if done[name]:
                set_aside_wrong_records(tuning_log, kernels[name], target, name, before[name])
        if sum(done.values()):
            seconds_per_trial = (time.perf_counter() - began) / sum(done.values())
        for name in chunk:
            best = tuning_log.best_seconds(kernels[name])
            # no record at all (a kernel costed at its library time alone, then a search that
            # found nothing): TVM has no time for it, which the library's may then replace
            costs[name] = (KernelCost(math.inf, "failed", done[name],
                                      errors.get(name) or "tuning left no record")
                           if best is None else
                           KernelCost(best, "tuned", done[name], errors.get(name)))
        # what MetaSchedule did not run of the trials asked (its search ran out) is done too
        bar.skip(max(0, ticked + per_task * len(chunk) - bar.done), "tune")
        bar.tick(0, kernels=len(chunk))
    return costs


def set_aside_wrong_records(tuning_log: TuningLog, kernel_mod: tvm.IRModule, target,
                            name: str = "kernel", since: int = 0) -> int:
    """Check the kernel's records logged from the `since`-th on that beat the earlier ones,
    fastest first, and take the wrong ones out of the log, until one is right (see
    record_check: MetaSchedule keeps the fastest schedule even if it computes something else).
    Records logged before `since` were checked when they were tuned. Returns how many went."""
    if not can_check(target):
        return 0
    wrong, verdicts = first_correct(kernel_mod, tuning_log.ranked_records(kernel_mod, since),
                                    target, name)
    for record, verdict in zip(wrong, verdicts):
        logger.warning("%s: a tuned schedule (%.4g ms) %s; set aside in %s.rejected", name,
                       1e3 * record_seconds(record.run_secs),
                       verdict.describe(), RECORD_FILE)
    tuning_log.set_aside(kernel_mod, wrong, [f"{name}: it {verdict.describe()}"
                                             for verdict in verdicts])
    return len(wrong)


def _tune_group(names, kernels, target, tuning_log, builder, runner, per_task, seed):
    """Run tune_tasks on `names`; if MetaSchedule raises, retry the kernels one by one."""
    from tvm.s_tir import meta_schedule as ms

    def tune(batch) -> None:
        contexts = [
            ms.TuneContext(kernels[n], target=target, space_generator="post-order-apply",
                           search_strategy=search_strategy(), task_name=n, rand_state=seed + i,
                           num_threads=max(1, host_core_count()), logger=metaschedule_logger)
            for i, n in enumerate(batch)
        ]
        wait_for_idle_pool()  # this process's TVM threads would share the runner's cores
        with tempfile.TemporaryDirectory(prefix="korch-tune-") as work_dir:
            ms.tune_tasks(
                tasks=contexts, task_weights=[1.0] * len(batch),
                work_dir=work_dir, max_trials_global=per_task * len(batch),
                max_trials_per_task=per_task, num_trials_per_iter=min(per_task, 32),
                builder=builder, runner=runner, database=tuning_log.database,
                cost_model="xgb" if per_task * len(batch) >= 256 else "random",
                task_scheduler="gradient",
            )

    try:
        tune(names)
        return {}
    except Exception as err:  # noqa: BLE001 - MetaSchedule raises many kinds
        raise_if_stopped()
        if len(names) == 1:
            logger.warning("tuning %s failed; keeping its default schedule: %s", names[0],
                           error_summary(str(err)))
            return {names[0]: "tuning failed: " + error_summary(str(err))}
    errors = {}
    for name in names:
        errors.update(_tune_group([name], kernels, target, tuning_log, builder, runner, per_task,
                                  seed))
    return errors


def measure_kernels(kernels: Mapping[str, tvm.IRModule], target, tuning_log: TuningLog, *,
                    time_budget: float | None = None, runner=None, builder=None,
                    predictor: Predictor | None = None, progress: bool | None = None,
                    seed_log=None, form_choices: dict | None = None) -> dict[str, KernelCost]:
    """Log lookup, else one default-schedule measurement (recorded), else a prediction.

    A logged time implausibly far above the kernel's floor and its prediction is measured
    again before it is used (`implausible`). With `seed_log` (log_seeds.Seed), a kernel it
    holds has the seed's best schedule measured too, and kept when faster than the defaults.
    `time_budget`: seconds the measurements may take; `runner`: where kernels run (default:
    this machine); `builder`: builds the schedules (default: a pool for this call);
    `predictor`: costs what is not measured (default: the log's cost model); `progress`: the
    progress line (None: when stderr is a terminal); `form_choices`: the default schedule's
    form chosen per variant anchor so far, filled by the measurements (a session keeps one
    across calls; default_measurement.measure_and_commit).
    """
    target, deadline = _prepared(target, time_budget)
    distinct = structurally_equal_groups(kernels)  # first name -> names of equal modules
    predict = _Lazy(lambda: predictor or _default_predictor(tuning_log, target))
    costs, pending, rechecks = _from_log(distinct, kernels, tuning_log, target, predict)
    bar = Progress(len(distinct), progress)
    bar.skip(len(costs), "log")
    if (pending or rechecks) and runner is None and not device_present(target):
        logger.warning("%s: %d kernels are costed by prediction", no_device_reason(target),
                       len(pending))
    elif (pending or rechecks) and time.perf_counter() < deadline:  # pools take seconds to start
        linked = links_here(runner, target)
        runner = runner or local_runner(target)
        with _builder_for(target, builder, linked) as measuring, metaschedule_logs_routed(), \
                stopping_after_batch():
            costs.update(measure_and_commit(list(rechecks) + pending, kernels, target,
                                            tuning_log, measuring, runner, deadline, bar,
                                            rechecks, seed_log, form_choices))
            stalled = _implausible_now(pending, costs, kernels, tuning_log, target, predict)
            if stalled:  # measured again at once, so no stalled first run enters the log alone
                bar.total += len(stalled)
                costs.update(measure_and_commit(list(stalled), kernels, target, tuning_log,
                                                measuring, runner, deadline, bar, stalled,
                                                seed_log, form_choices))
    for name, best in rechecks.items():  # not measured again (no device, no time): as logged
        costs.setdefault(name, KernelCost(best, "log", 0))
    leftovers = [name for name in pending if name not in costs]
    if leftovers:
        for name in leftovers:
            costs[name] = KernelCost(_safe_predict(predict(), kernels[name], target),
                                     "predicted", 0)
        bar.skip(len(leftovers), "predict")
    bar.close()
    costs = costed_by_prediction(costs, lambda name: _safe_predict(predict(), kernels[name], target))
    return {name: costs[rep] for rep, names in distinct.items() for name in names}


def _prepared(target, time_budget: float | None):
    """(the parsed target, MetaSchedule made ready for it; the deadline `time_budget` sets)."""
    target = parse_target(target)
    prepare_for_target(target)
    return target, math.inf if time_budget is None else time.perf_counter() + max(0.0, time_budget)


def _from_log(distinct, kernels, tuning_log: TuningLog, target, predict):
    """(costs the log settles, kernels to measure, {kernel to measure again: logged time})."""
    costs: dict[str, KernelCost] = {}
    pending, rechecks = [], {}
    for name in distinct:
        best = tuning_log.best_seconds(kernels[name])
        if best is None or retry_failure(tuning_log, name, kernels[name], best):
            pending.append(name)
        elif implausible(tuning_log, kernels[name], best, target, predict):
            rechecks[name] = best
        else:
            error = None if math.isfinite(best) else "every logged measurement failed"
            costs[name] = KernelCost(best, "log", 0, error)
    return costs, pending, rechecks


def _implausible_now(names, costs, kernels, tuning_log: TuningLog, target,
                     predict) -> dict[str, float]:
    """{kernel of `names` measured just now whose time is implausible (a stalled run): that
    time}. Checked at once rather than by the next compile, which would otherwise measure it
    again and make a warm compile's work depend on this one's luck."""
    return {name: costs[name].seconds for name in names
            if name in costs and costs[name].source == "measured"
            and implausible(tuning_log, kernels[name], costs[name].seconds, target, predict)}


class _Lazy:
    """A value made on first call (the default predictor loads a model)."""

    def __init__(self, make: Callable[[], object]) -> None:
        self._make, self._made = make, None

    def __call__(self):
        if self._made is None:
            self._made = self._make()
        return self._made


@contextmanager
def _builder_for(target, builder=None, linked: bool = False):
    """`builder`, or a PooledBuilder for this call (exporting shared libraries when `linked`)
    that is closed after it."""
    if builder is not None:
        yield builder
        return
    with PooledBuilder(target, max_workers=host_core_count(), linked=linked) as pooled:
        yield pooled


def _default_predictor(tuning_log: TuningLog, target) -> Predictor:
    from .cost_model import default_predictor

    return default_predictor(tuning_log, target)


def _safe_predict(predict: Predictor, kernel_mod: tvm.IRModule, target) -> float:
    """A prediction never fails the stage: fall back to the analytic roofline estimate."""
    from .cost_model import analytic_estimate

    try:
        return float(predict(kernel_mod))
    except Exception as err:  # noqa: BLE001
        logger.warning("cost model failed (%s); using the analytic estimate", error_summary(str(err)))
        return analytic_estimate(kernel_mod, target)
