"""Cost every candidate kernel: reuse the tuning log, measure or tune the rest, predict the leftovers.

The stage, per distinct kernel module, in order:
1. a record in the log -> its best time, zero trials (a second compile does no work); a kernel
   whose records are all failures is retried until it has failed `FAILED_ATTEMPTS_KEPT` times,
   and a best time implausibly far above the kernel's floor and prediction is measured again
   first (`headroom.implausible`);
2. otherwise its default schedule (the one the build gives untuned kernels) is built and run
   once and the result recorded: this finds kernels that cannot build or run (cost inf, never
   a crash) and gives every kernel a finite fallback before any tuning starts; a seed log of
   another CPU (costing/log_seeds.py) adds its best schedule of the kernel, kept when it is faster;
3. whatever `time_budget` left without a measurement gets a cost-model prediction;
4. with `trials > 0`, the budget is split where the time goes and could be saved (each
   kernel's latency share times its headroom above the floor, `trial_allocation`) and
   MetaSchedule tunes each kernel up to its share; every trial lands in the log through its
   database, and a kernel already tuned that far is not tuned again: its share goes to the
   kernels that are not (`allocate_new_trials`); each kernel's new fastest records are then
   run against the kernel as written and the wrong ones set aside (`set_aside_wrong_records`).
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import tvm

from ..backend.cpu_schedule import default_schedules as cpu_default_schedules
from ..backend.cuda import device_present, no_device_reason
from ..backend.target import host_core_count, parse_target
from ..config import trial_budget, tunes
from ..errors import error_summary
from ..kernels.fused import structurally_equal_groups
from ..support.interrupts import is_plain
from ..support.interrupts import note as note_ctrl_c
from .headroom import implausible, kernel_headrooms
from .metaschedule_setup import (SAMPLES, evaluator_config, evaluator_for_target, local_builder,
                                 prepare_for_target, search_strategy, skip_gpu_tensor_intrin)
from .pooled_builder import PooledBuilder
from .record_check import can_check, first_correct
from .tuning_log import RECORD_FILE, TuningLog
from .tuning_log import mean_seconds as record_seconds

logger = logging.getLogger("korch_tvm.profiler")
metaschedule_logger = logging.getLogger("korch_tvm.metaschedule")
# A library must not print through logging's last-resort handler: MetaSchedule's chatter reaches
# the terminal only if the application configures a handler for it (or for the root logger).
metaschedule_logger.addHandler(logging.NullHandler())

MIN_TRIALS_PER_TASK = 4
# With a time budget, kernels are measured/tuned in groups so the budget is checked between them.
MEASURE_GROUP = 64
TUNE_GROUP = 4
INITIAL_SECONDS_PER_TRIAL = 0.5  # first guess, replaced by the observed rate
DEFAULT_RUNNER_TIMEOUT = 30.0  # MetaSchedule's LocalRunner default, when a runner does not say
# A kernel whose every logged measurement failed is measured again until it has failed this
# often: a one-off failure (a busy machine, an older korch_tvm) is not kept for ever, and a kernel
# that really cannot build costs one retry, not one per compile.
FAILED_ATTEMPTS_KEPT = 2

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


def rpc_runner(tracker_host: str, tracker_port: int, key: str, *, cache_flush: bool = True,
               max_workers: int = 1, session_timeout_sec: int = 60):
    """MetaSchedule's RPCRunner: measure on devices registered with an RPC tracker under `key`."""
    from tvm.s_tir import meta_schedule as ms

    skip_gpu_tensor_intrin()
    config = ms.runner.RPCConfig(tracker_host=tracker_host, tracker_port=int(tracker_port),
                                 tracker_key=key, session_timeout_sec=session_timeout_sec)
    return ms.runner.RPCRunner(
        rpc_config=config, max_workers=max_workers, initializer=skip_gpu_tensor_intrin,
        evaluator_config=evaluator_config(enable_cpu_cache_flush=cache_flush),
    )


def local_runner(target, *, cache_flush: bool | None = None):
    """The default runner: this machine, cold caches on the CPU (as kernels run inside a model)."""
    from tvm.s_tir import meta_schedule as ms

    if target.kind.name != "llvm":
        cache_flush = False  # a GPU has no CPU cache to flush; the GPU settings time it warm
    return ms.runner.LocalRunner(evaluator_config=evaluator_for_target(target,
                                                                       cache_flush=cache_flush))


@contextmanager
def metaschedule_logs_routed() -> None:
    """Send everything MetaSchedule logs (`tvm.s_tir.meta_schedule.*`) to korch_tvm.metaschedule."""
    source = logging.getLogger("tvm.s_tir.meta_schedule")

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # Logger.handle() skips the level check that Logger.log() does, so do it here.
            if metaschedule_logger.isEnabledFor(record.levelno):
                metaschedule_logger.handle(record)

    handler, propagate, level = Forward(), source.propagate, source.level
    source.addHandler(handler)
    source.propagate = False
    source.setLevel(logging.DEBUG if metaschedule_logger.isEnabledFor(logging.DEBUG) else logging.INFO)
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.propagate, source.level = propagate, level


_CTRL_C = threading.Event()  # stop requested (first Ctrl-C)
_ABORT = threading.Event()  # stop at once (second Ctrl-C): the batch in flight is not recorded


@contextmanager
def _ctrl_c_kept():
    """Stop cleanly on Ctrl-C while MetaSchedule runs: after the current batch, records kept.

    MetaSchedule calls Python (builder, runner) from C++. Raising KeyboardInterrupt inside such
    a callback comes back as a plain RuntimeError, and under load it crashed TVM's worker pools
    (a segfault instead of exit 130). So the first Ctrl-C only asks to stop: the batch in flight
    finishes, its records are written, and the next check (`_raise_if_interrupted`, between
    batches) raises KeyboardInterrupt. A second Ctrl-C stops at once.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not is_plain(previous):
        yield
        return

    def remember(signum, frame):
        note_ctrl_c()
        if _CTRL_C.is_set():
            _ABORT.set()
            raise KeyboardInterrupt
        _CTRL_C.set()
        logger.warning("stopping after the current batch; its records are kept "
                       "(Ctrl-C again to stop at once)")

    _CTRL_C.clear()
    _ABORT.clear()
    signal.signal(signal.SIGINT, remember)
    try:
        yield
        _raise_if_interrupted()
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_if_interrupted() -> None:
    if _CTRL_C.is_set():
        _quiet_pool_teardown()
        raise KeyboardInterrupt


def _quiet_pool_teardown() -> None:
    """After Ctrl-C, TVM's worker pools get collected on their own threads, and their __del__
    prints 'cannot join current thread' as a raw traceback; send that to the debug log."""
    previous = sys.unraisablehook
    if getattr(previous, "korch_quiet", False):
        return

    def hook(unraisable):
        if "PopenPool" in repr(unraisable.object):
            logger.debug("ignored while stopping worker pools: %s", unraisable.exc_value)
            return
        previous(unraisable)

    hook.korch_quiet = True
    sys.unraisablehook = hook


class _Progress:
    """One self-overwriting stderr line: work done of `total`, trials, elapsed time and an ETA.

    It moves once per measurement (`tick`); what the log answers is counted at once (`skip`)
    and left out of the rate, so the ETA is the time the measurements so far took, per
    measurement, times the ones left ("ETA --" before the first). `unit` names what is counted:
    kernels when measuring, trials when tuning. Off when stderr is no terminal, unless asked.
    """

    def __init__(self, total: int, enabled: bool | None, *, unit: str = "kernels",
                 stream=None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream or sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.total, self.unit, self.clock = total, unit, clock
        self.done = self.worked = self.trials = self.kernels = 0
        self.start = clock()
        self.stage = ""

    def skip(self, count: int, stage: str) -> None:
        """`count` units settled without work (log lookups, predictions)."""
        self.done += count
        self.stage = stage
        self._draw()

    def tick(self, count: int = 1, stage: str | None = None, *, kernels: int = 0) -> None:
        """`count` units measured; `kernels` finished (when the unit is trials)."""
        self.done += count
        self.worked += count
        self.kernels += kernels
        self.stage = stage or self.stage
        self._draw()

    def eta_seconds(self) -> float | None:
        """Seconds left at the rate of the work so far; None before any work is done."""
        if not self.worked:
            return None
        return (self.clock() - self.start) / self.worked * max(0, self.total - self.done)

    def line(self) -> str:
        elapsed = self.clock() - self.start
        kernels = f"  kernels {self.kernels}" if self.unit != "kernels" else ""
        return (f"[korch] {self.stage:8s} {self.unit} {self.done}/{self.total}{kernels}  "
                f"elapsed {_duration(elapsed)}  ETA {_duration(self.eta_seconds())}")

    def _draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + " ")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no file behind it, or closed
        return False


def _duration(seconds: float | None) -> str:
    """12.3s, 4m05s, 1h02m; "--" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "--"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def profile_kernels(
    kernels: Mapping[str, tvm.IRModule],
    target,
    tuning_log: TuningLog,
    *,
    trials: int,
    time_budget: float | None = None,
    weights: Mapping[str, float] | None = None,
    runner=None,
    builder=None,
    predictor: Predictor | None = None,
    progress: bool | None = None,
    seed: int = 0,
    trials_per_kernel: int | None = None,
    budget_share: tuple[int, int] = (0, 1),
    seed_log=None,
) -> dict[str, KernelCost]:
    """Cost each kernel (`{"main": PrimFunc}` modules); see the module docstring for the order.

    `trials` is the total tuning budget, split by `trial_allocation` in proportion to each
    kernel's share of the model's latency (`weights`: how often it runs, times its
    default-schedule time) times its headroom; `time_budget` (seconds) bounds the whole
    stage; `runner`/`builder` default to this machine; `predictor` defaults to the log's cost
    model. With `trials_per_kernel` the budget is that many per kernel that has a share
    instead. `budget_share` (i, n): this call may spend the i-th of n parts of that budget
    (one layout variant of n, data_layout.trial_part). `seed_log`: see `measure_kernels`.
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
                         runner=runner, builder=builder, progress=progress, seed=seed)
    return {**costs, **tuned}


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
    defaults = max(1, len(_default_schedules(kernel_mod, parse_target(tuning_log.target))))
    return max(tuning_log.schedule_count(kernel_mod) - defaults, 0)


def tune_kernels(
    kernels: Mapping[str, tvm.IRModule],
    allocation: Mapping[str, int],
    target,
    tuning_log: TuningLog,
    *,
    time_budget: float | None = None,
    runner=None,
    builder=None,
    progress: bool | None = None,
    seed: int = 0,
) -> dict[str, KernelCost]:
    """Tune each kernel up to its allocated trials; kernels already tuned that far are skipped.

    A kernel counts as done once it holds at least half its allocation in tuning records, so a
    second compile with the same budget runs zero trials, and a much larger budget tunes more.
    Returns costs for the kernels that were tuned now.
    """
    target = parse_target(target)
    prepare_for_target(target)
    deadline = math.inf if time_budget is None else time.perf_counter() + max(0.0, time_budget)
    todo: dict[int, list[str]] = {}
    allocated = {n: kernels[n] for n in allocation if allocation[n] > 0}
    for name in structurally_equal_groups(allocated):
        spent = tuned_trials(tuning_log, kernels[name])
        if spent * 2 < allocation[name]:
            more = -(-(allocation[name] - spent) // MIN_TRIALS_PER_TASK) * MIN_TRIALS_PER_TASK
            todo.setdefault(more, []).append(name)
    if not todo:
        return {}
    if runner is None and not device_present(target):
        logger.warning("%s: the %d kernels keep their predicted costs; nothing is tuned",
                       no_device_reason(target), sum(len(names) for names in todo.values()))
        return {}
    runner = runner or local_runner(target)
    builder = builder or local_builder(target, max_workers=max(1, host_core_count()))
    bar = _Progress(sum(per_task * len(names) for per_task, names in todo.items()), progress,
                    unit="trials")
    if bar.enabled:  # the line moves per trial measured
        runner = _counting_runner(runner, lambda: bar.tick(1, "tune"))
    costs: dict[str, KernelCost] = {}
    with metaschedule_logs_routed(), _ctrl_c_kept():
        for per_task, names in sorted(todo.items(), reverse=True):
            costs.update(_tune(names, kernels, target, tuning_log, builder, runner, per_task,
                               deadline, bar, seed))
    bar.close()
    left = sum(len(names) for names in todo.values()) - len(costs)
    if left:  # only the deadline stops _tune short
        logger.warning("time budget reached: %d kernel(s) keep their default schedule; the next "
                       "compile with this budget tunes them", left)
    return costs


def measure_kernels(
    kernels: Mapping[str, tvm.IRModule],
    target,
    tuning_log: TuningLog,
    *,
    time_budget: float | None = None,
    runner=None,
    builder=None,
    predictor: Predictor | None = None,
    progress: bool | None = None,
    seed_log=None,
) -> dict[str, KernelCost]:
    """Log lookup, else one default-schedule measurement (recorded), else a prediction.

    A logged time implausibly far above the kernel's floor and its prediction is measured
    again before it is used (`implausible`). With `seed_log` (log_seeds.Seed), a kernel it
    holds has the seed's best schedule measured too, and kept when faster than the defaults.
    """
    target = parse_target(target)
    prepare_for_target(target)
    deadline = math.inf if time_budget is None else time.perf_counter() + max(0.0, time_budget)
    distinct = structurally_equal_groups(kernels)  # first name -> names of equal modules
    predict = _Lazy(lambda: predictor or _default_predictor(tuning_log, target))
    costs: dict[str, KernelCost] = {}
    pending, rechecks = [], {}
    for name in distinct:
        best = tuning_log.best_seconds(kernels[name])
        if best is None or _retry_failure(tuning_log, name, kernels[name], best):
            pending.append(name)
        elif implausible(tuning_log, kernels[name], best, target, predict):
            rechecks[name] = best
        else:
            error = None if math.isfinite(best) else "every logged measurement failed"
            costs[name] = KernelCost(best, "log", 0, error)
    bar = _Progress(len(distinct), progress)
    bar.skip(len(costs), "log")
    if (pending or rechecks) and runner is None and not device_present(target):
        logger.warning("%s: %d kernels are costed by prediction", no_device_reason(target),
                       len(pending))
    elif (pending or rechecks) and time.perf_counter() < deadline:  # pools take seconds to start
        runner = runner or local_runner(target)
        with _builder_for(target, builder) as measuring, metaschedule_logs_routed(), \
                _ctrl_c_kept():
            costs.update(_measure_and_commit(list(rechecks) + pending, kernels, target,
                                             tuning_log, measuring, runner, deadline, bar,
                                             rechecks, seed_log))
    for name, best in rechecks.items():  # not measured again (no device, no time): as logged
        costs.setdefault(name, KernelCost(best, "log", 0))
    leftovers = [name for name in pending if name not in costs]
    if leftovers:
        for name in leftovers:
            costs[name] = KernelCost(_safe_predict(predict(), kernels[name], target),
                                     "predicted", 0)
        bar.skip(len(leftovers), "predict")
    bar.close()
    return {name: costs[rep] for rep, names in distinct.items() for name in names}


class _Lazy:
    """A value made on first call (the default predictor loads a model)."""

    def __init__(self, make: Callable[[], object]) -> None:
        self._make, self._made = make, None

    def __call__(self):
        if self._made is None:
            self._made = self._make()
        return self._made


@contextmanager
def _builder_for(target, builder=None):
    """`builder`, or a PooledBuilder for this call that is closed after it."""
    if builder is not None:
        yield builder
        return
    with PooledBuilder(target, max_workers=host_core_count()) as pooled:
        yield pooled


def _retry_failure(tuning_log: TuningLog, name: str, kernel_mod: tvm.IRModule,
                   best: float) -> bool:
    """Whether a kernel logged only as failures gets another measurement (see the constant)."""
    if math.isfinite(best):
        return False
    attempts = tuning_log.record_count(kernel_mod)
    if attempts < FAILED_ATTEMPTS_KEPT:
        logger.info("kernel %s failed %d time(s) before; measuring it again", name, attempts)
        return True
    return False


def _default_schedules(kernel_mod: tvm.IRModule, target) -> list:
    """[(module to build, trace to record)] for a kernel's default-schedule measurement.

    The schedules the build gives a kernel no tuning record covers, so that the measurement is
    of the kernel that will run: on the CPU, cpu_schedule's parallel + vectorized form and, for
    large tiled kernels, its variants (the fastest is kept; `(kernel, None)`: the kernel as
    written, recorded under the log's default trace); on CUDA, which cannot build unscheduled
    TIR, the dlight schedule TVM's CUDA pipeline would use. Traces are recorded, so applying
    the log rebuilds exactly the measured kernel. Empty when no dlight rule applies (the kernel
    is then reported as failed, cost inf).
    """
    if target.kind.name != "cuda":
        schedules = cpu_default_schedules(kernel_mod, target)
        return [(s.mod, s.trace) for s in schedules] or [(kernel_mod, None)]
    from ..backend.cuda import default_schedule

    schedule = default_schedule(kernel_mod, target)
    return [] if schedule is None else [(schedule.mod, schedule.trace)]


def _device_type(target) -> str:
    return "cuda" if target.kind.name == "cuda" else "cpu"


def _measure_and_commit(names, kernels, target, tuning_log, builder, runner, deadline, bar,
                        rechecks, seed_log):
    """Measure each kernel's schedules (`_schedules_to_measure`) and commit what they show:
    a new kernel's defaults and seed schedule (`_commit_fastest`), a re-checked record's
    re-measurement (`_commit_recheck`)."""
    def schedules(name):
        kernel = kernels[name]
        if name in rechecks:
            record = tuning_log.best_record(kernel)
            return [] if record is None else _applied(kernel, record.trace, "recheck")
        trace = seed_log.starting_trace(kernel) if seed_log is not None else None
        return _schedules_to_measure(kernel, target, trace)

    def commit(name, outcomes):
        if name in rechecks:
            return _commit_recheck(tuning_log, kernels[name], name, rechecks[name], outcomes)
        return _commit_fastest(tuning_log, kernels[name], name, outcomes)

    return _measure_schedules(names, schedules, commit, target, builder, runner, deadline, bar)


def _schedules_to_measure(kernel_mod: tvm.IRModule, target, seed_trace=None) -> list:
    """[(module, trace, role)]: the default schedules, and a seed log's best schedule."""
    schedules = [(module, trace, "default")
                 for module, trace in _default_schedules(kernel_mod, target)]
    if seed_trace is not None:
        schedules += _applied(kernel_mod, seed_trace, "seed")
    return schedules


def _applied(kernel_mod: tvm.IRModule, trace, role: str) -> list:
    """[(the kernel with `trace` applied, trace, role)], or [] when it does not apply."""
    try:
        schedule = tvm.s_tir.Schedule(kernel_mod)
        trace.apply_to_schedule(schedule, remove_postproc=False)
    except Exception as err:  # noqa: BLE001 - TVM raises its own error types
        logger.debug("a %s schedule does not apply to its kernel: %s", role,
                     error_summary(str(err)))
        return []
    return [(schedule.mod, trace, role)]


def _measure_schedules(names, schedules_of, commit, target, builder, runner, deadline, bar):
    """Build and run each kernel's schedules once; `commit(name, outcomes)` records them.

    Outcomes are [(run seconds or None, error, trace, role)]. Kernels go in groups, between
    which Ctrl-C and the deadline are checked; the progress line moves per kernel measured.
    """
    from tvm.s_tir import meta_schedule as ms

    costs = {}
    group = MEASURE_GROUP
    for start in range(0, len(names), max(1, group)):
        _raise_if_interrupted()
        if time.perf_counter() >= deadline:
            break
        chunk = names[start:start + group]
        try:
            variants = [(name, *schedule) for name in chunk for schedule in schedules_of(name)]
            built = builder.build([ms.builder.BuilderInput(module, target)
                                   for _, module, _, _ in variants])
        except Exception as err:  # noqa: BLE001 - a builder crash fails this chunk only
            _raise_if_interrupted()
            variants = [(name, None, None, "default") for name in chunk]
            built = [ms.builder.BuilderResult(None, f"builder crashed: {err}") for _ in chunk]
        outcomes = {name: [] for name in chunk}  # name -> [(secs or None, error, trace, role)]
        to_run = []
        for (name, module, trace, role), result in zip(variants, built):
            if result.error_msg is not None:
                outcomes[name].append((None, "build failed: " + error_summary(result.error_msg),
                                       trace, role))
            else:
                # the arguments of the kernel as built: weights in their packed layout, as
                # MetaSchedule's builder drops the repacking (done once, at compile time)
                args = ms.arg_info.ArgInfo.from_entry_func(module, remove_preproc=True)
                to_run.append((name, trace, role, ms.runner.RunnerInput(
                    result.artifact_path, _device_type(target), args)))
        left = Counter(name for name, *_ in to_run)
        bar.tick(sum(1 for name in chunk if not left[name]), "measure")  # nothing to run
        futures = runner.run([entry for *_, entry in to_run]) if to_run else []
        for (name, trace, role, _), future in zip(to_run, futures):
            outcomes[name].append((*_run_outcome(name, future.result(), runner), trace, role))
            left[name] -= 1
            if not left[name]:
                bar.tick(1, "measure")
        if _ABORT.is_set():  # an aborted run is no failure to record
            _raise_if_interrupted()
        for name in chunk:
            costs[name] = commit(name, outcomes[name])
    return costs


def _run_outcome(name: str, outcome, runner) -> tuple[list[float] | None, str | None]:
    """(run seconds, None) or (None, error) of one runner result."""
    if outcome.error_msg is not None and _timed_out(outcome.error_msg):
        # Slow, not broken: a lower bound keeps it usable where nothing else covers its
        # primitives, makes the solver avoid it elsewhere, and draws the trials to it.
        logger.warning("kernel %s timed out in the runner; costed at its time-out "
                       "(%.0f s, a lower bound)", name, _timeout_seconds(runner))
        return [_timeout_seconds(runner)] * SAMPLES, None  # as many samples as a run gives
    if outcome.error_msg is not None or not outcome.run_secs:
        return None, "run failed: " + error_summary(outcome.error_msg or "no time")
    return [float(s) for s in outcome.run_secs], None


def _commit_fastest(tuning_log: TuningLog, kernel_mod: tvm.IRModule, name: str,
                    outcomes: list) -> KernelCost:
    """Record a kernel's measured default schedules, fastest first (its first record is then
    its default-schedule cost, `TuningLog.default_seconds`), and a seed schedule after them
    when it beat them all; the cost is the fastest's."""
    ran = sorted(((record_seconds(secs), secs, trace, role)
                  for secs, _, trace, role in outcomes if secs), key=lambda entry: entry[0])
    defaults = [entry for entry in ran if entry[3] == "default"]
    seeded = [entry for entry in ran if entry[3] == "seed"]
    if not ran:
        error = outcomes[0][1] if outcomes else "no default GPU schedule"
        tuning_log.commit_run(kernel_mod, None, trace=outcomes[0][2] if outcomes else None)
        logger.warning("kernel %s cannot be costed: %s", name, error)
        return KernelCost(math.inf, "failed", 1, error)
    for _, secs, trace, _ in defaults:
        tuning_log.commit_run(kernel_mod, secs, trace=trace)
    kept = bool(seeded) and (not defaults or seeded[0][0] < defaults[0][0])
    if kept:
        tuning_log.commit_run(kernel_mod, seeded[0][1], trace=seeded[0][2])
    seed_schedule = None if not any(role == "seed" for *_, role in outcomes) else \
        ("kept" if kept else "slower")
    return KernelCost(ran[0][0], "measured", 1, seed_schedule=seed_schedule)


def _commit_recheck(tuning_log: TuningLog, kernel_mod: tvm.IRModule, name: str, logged: float,
                    outcomes: list) -> KernelCost:
    """Record the re-measurement of an implausible best record; set the old record aside when
    the new one is less than half of it (the old was a stalled run). Unmeasurable: as logged."""
    ran = [(record_seconds(secs), secs, trace) for secs, _, trace, _ in outcomes if secs]
    if not ran:
        return KernelCost(logged, "log", 0)
    seconds, secs, trace = ran[0]
    old = tuning_log.best_record(kernel_mod)
    tuning_log.commit_run(kernel_mod, secs, trace=trace)
    if seconds * 2 < logged and old is not None:
        tuning_log.set_aside(kernel_mod, [old])
        logger.warning("kernel %s: its logged %.4g ms is implausible for its size and was "
                       "measured again at %.4g ms; the old record is set aside in %s.rejected",
                       name, logged * 1e3, seconds * 1e3, RECORD_FILE)
    best = tuning_log.best_seconds(kernel_mod)
    return KernelCost(best, "measured", 1, rechecked=True)


def _timed_out(error_message: str) -> bool:
    return "timeout" in error_message.lower() or "timed out" in error_message.lower()


def _timeout_seconds(runner) -> float:
    """The runner's time-out: the least a kernel that hit it can cost."""
    return float(getattr(runner, "timeout_sec", None) or DEFAULT_RUNNER_TIMEOUT)


def _counting_runner_classes():
    """A runner that calls `on_result` once per measurement MetaSchedule collects (made on
    first use: MetaSchedule's Python classes import slowly)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture

    @derived_object
    class CountedFuture(PyRunnerFuture):
        def __init__(self, future, on_result) -> None:
            super().__init__()
            self.future, self.on_result, self.counted = future, on_result, False

        def done(self) -> bool:
            return self.future.done()

        def result(self):
            result = self.future.result()
            if not self.counted:
                self.counted = True
                self.on_result()
            return result

    @derived_object
    class CountingRunner(PyRunner):
        def __init__(self, runner, on_result) -> None:
            super().__init__()
            self.runner, self.on_result = runner, on_result

        def run(self, runner_inputs):
            return [CountedFuture(future, self.on_result)
                    for future in self.runner.run(runner_inputs)]

    return CountingRunner


def _counting_runner(runner, on_result):
    return _counting_runner_classes()(runner, on_result)


def _tune(names, kernels, target, tuning_log, builder, runner, per_task, deadline, bar, seed):
    """MetaSchedule tuning, `per_task` trials each, in groups that the deadline can stop."""
    group = TUNE_GROUP  # also the points where Ctrl-C and the deadline are checked
    seconds_per_trial = INITIAL_SECONDS_PER_TRIAL
    costs = {}
    for start in range(0, len(names), max(1, group)):
        _raise_if_interrupted()
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
            costs[name] = KernelCost(best, "tuned", done[name], errors.get(name))
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
        _raise_if_interrupted()
        if len(names) == 1:
            logger.warning("tuning %s failed; keeping its default schedule: %s", names[0],
                           error_summary(str(err)))
            return {names[0]: "tuning failed: " + error_summary(str(err))}
    errors = {}
    for name in names:
        errors.update(_tune_group([name], kernels, target, tuning_log, builder, runner, per_task,
                                  seed))
    return errors


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
