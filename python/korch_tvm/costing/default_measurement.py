"""Default-schedule measurement: each new kernel built and run once as the build would run it.

This finds kernels that cannot build or run (cost inf, never a crash) and gives every kernel a
finite fallback before any tuning starts. A seed log's best schedule of the kernel is measured
beside the defaults and kept when faster; a logged time judged implausible is measured again.
Kernels go in groups between which Ctrl-C and the deadline are checked.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

import tvm

from ..backend.schedule_variants import RULE_FORM, named_default_schedules, variant_anchor
from ..errors import error_summary
from ..support.interrupts import aborted, raise_if_stopped
from ..support.pool_spin import wait_for_idle_pool
from .kernel_costs import KernelCost
from .kernel_libraries import run_kernels
from .runners import device_type, run_outcome
from .log_files import RECORD_FILE
from .log_lines import record_seconds
from .tuning_log import TuningLog

logger = logging.getLogger("korch_tvm.profiler")

# Kernels per build-and-run group; the deadline is checked between groups. Each group ends
# with the workers finishing its last libraries, then the runner alone, then the commits: fewer
# groups, fewer such waits (bench/results/compile-time/parallel-codegen/: 128 instead of 64 took
# DenseNet-121's measurement from 0.160-0.164 to 0.158-0.159 s per kernel).
MEASURE_GROUP = 128
# A kernel whose every logged measurement failed is measured again until it has failed this
# often: a one-off failure (a busy machine, an older korch_tvm) is not kept for ever, and a kernel
# that really cannot build costs one retry, not one per compile.
FAILED_ATTEMPTS_KEPT = 2


def retry_failure(tuning_log: TuningLog, name: str, kernel_mod: tvm.IRModule,
                   best: float) -> bool:
    """Whether a kernel logged only as failures gets another measurement (see the constant)."""
    if math.isfinite(best):
        return False
    attempts = tuning_log.record_count(kernel_mod)
    if attempts < FAILED_ATTEMPTS_KEPT:
        logger.info("kernel %s failed %d time(s) before; measuring it again", name, attempts)
        return True
    return False


def default_schedules(kernel_mod: tvm.IRModule, target, forms=None) -> list:
    """[(module to build, trace to record, form name)] for a kernel's default-schedule
    measurement.

    The schedules the build gives a kernel no tuning record covers, so that the measurement is
    of the kernel that will run: on the CPU, cpu_schedule's parallel + vectorized form and, for
    large tiled kernels, its variants named in `forms` (None: all; backend/schedule_variants.py;
    the fastest is kept; `(kernel, None, None)`: the kernel as written, recorded under the
    log's default trace); on CUDA, which cannot build unscheduled TIR, the dlight schedule
    TVM's CUDA pipeline would use. Traces are recorded, so applying the log rebuilds exactly
    the measured kernel. Empty when no dlight rule applies (the kernel is then reported as
    failed, cost inf).
    """
    if target.kind.name != "cuda":
        schedules = named_default_schedules(kernel_mod, target, forms=forms)
        return [(s.mod, s.trace, name) for name, s in schedules] or [(kernel_mod, None, None)]
    from ..backend.cuda import default_schedule

    schedule = default_schedule(kernel_mod, target)
    return [] if schedule is None else [(schedule.mod, schedule.trace, None)]


def measure_and_commit(names, kernels, target, tuning_log, builder, runner, deadline, bar,
                        rechecks, seed_log, form_choices=None):
    """Measure each kernel's schedules (`_schedules_to_measure`) and commit what they show:
    a new kernel's defaults and seed schedule (`_commit_fastest`), a re-checked record's
    re-measurement (`_commit_recheck`).

    `form_choices` (variant anchor -> the form that won there; kept by the caller across
    calls, and filled here): the first kernel of an anchor has every form measured, the
    others after it only the rule's form and that winner (backend/schedule_variants.py)."""
    choices = {} if form_choices is None else form_choices
    anchors = {} if target.kind.name != "llvm" else {
        name: variant_anchor(kernels[name]) for name in names if name not in rechecks}
    first, later = _anchors_first(names, anchors, choices)

    def schedules(name):
        kernel = kernels[name]
        if name in rechecks:
            record = tuning_log.best_record(kernel)
            return [] if record is None else _applied(kernel, record.trace, "recheck")
        trace = seed_log.starting_trace(kernel) if seed_log is not None else None
        chosen = choices.get(anchors.get(name))
        return _schedules_to_measure(kernel, target, trace,
                                     None if chosen is None else {RULE_FORM, chosen})

    def commit(name, outcomes):
        if name in rechecks:
            return _commit_recheck(tuning_log, kernels[name], name, rechecks[name], outcomes)
        fastest = _fastest_form(outcomes)
        if anchors.get(name) is not None and fastest is not None:
            choices.setdefault(anchors[name], fastest)
        return _commit_fastest(tuning_log, kernels[name], name, outcomes)

    costs = _measure_schedules(first, schedules, commit, target, builder, runner, deadline, bar)
    costs.update(_measure_schedules(later, schedules, commit, target, builder, runner, deadline,
                                    bar))
    return costs


def _anchors_first(names, anchors, choices) -> tuple[list, list]:
    """(kernels to measure first: those of no anchor and the first of each anchor not chosen
    yet; the others, which wait for their anchor's choice)."""
    first, later, seen = [], [], set(choices)
    for name in names:
        anchor = anchors.get(name)
        if anchor is None or anchor not in seen:
            first.append(name)
            seen.add(anchor)
        else:
            later.append(name)
    return first, later


def _fastest_form(outcomes) -> str | None:
    """The form of the fastest default schedule that ran, None when none did."""
    ran = [(record_seconds(secs), form) for secs, _, _, role, form in outcomes
           if secs and role == "default" and form is not None]
    return min(ran, key=lambda entry: entry[0])[1] if ran else None


def _schedules_to_measure(kernel_mod: tvm.IRModule, target, seed_trace=None,
                          forms=None) -> list:
    """[(module, trace, role, form)]: the default schedules (those of `forms`, None: all),
    and a seed log's best schedule."""
    schedules = [(module, trace, "default", form)
                 for module, trace, form in default_schedules(kernel_mod, target, forms)]
    if seed_trace is not None:
        schedules += _applied(kernel_mod, seed_trace, "seed")
    return schedules


def _applied(kernel_mod: tvm.IRModule, trace, role: str) -> list:
    """[(the kernel with `trace` applied, trace, role, None)], or [] when it does not apply."""
    try:
        schedule = tvm.s_tir.Schedule(kernel_mod)
        trace.apply_to_schedule(schedule, remove_postproc=False)
    except Exception as err:  # noqa: BLE001 - TVM raises its own error types
        logger.debug("a %s schedule does not apply to its kernel: %s", role,
                     error_summary(str(err)))
        return []
    return [(schedule.mod, trace, role, None)]


def _measure_schedules(names, schedules_of, commit, target, builder, runner, deadline, bar):
    """Build and run each kernel's schedules once; `commit(name, outcomes)` records them.

    Outcomes are [(run seconds or None, error, trace, role, form)]. Kernels go in groups, between
    which Ctrl-C and the deadline are checked; the progress line moves per kernel measured.
    `builder` is a `PooledBuilder`: its batch builds while the next schedules are made.
    """
    from tvm.s_tir import meta_schedule as ms

    costs = {}
    group = MEASURE_GROUP
    for start in range(0, len(names), max(1, group)):
        raise_if_stopped()
        if time.perf_counter() >= deadline:
            break
        chunk = names[start:start + group]
        outcomes = {name: [] for name in chunk}  # name -> [(secs, error, trace, role, form)]
        variants = []
        # the workers build each kernel's schedules while the next kernel's are made
        batch = builder.batch()
        try:
            for name in chunk:  # a kernel its schedules fail on fails alone, not its chunk
                try:
                    made = [(name, *schedule) for schedule in schedules_of(name)]
                except Exception as err:  # noqa: BLE001 - TVM raises its own error types
                    raise_if_stopped()
                    outcomes[name].append((None, "not scheduled: " + error_summary(str(err)),
                                           None, "default", None))
                    continue
                variants += made
                batch.add([ms.builder.BuilderInput(module, target) for _, module, *_ in made])
            built = batch.results()
        except Exception as err:  # noqa: BLE001 - a builder crash fails this chunk only
            raise_if_stopped()
            built = [ms.builder.BuilderResult(None, f"builder crashed: {err}") for _ in variants]
        to_run = []
        for (name, module, trace, role, form), result in zip(variants, built):
            if result.error_msg is not None:
                outcomes[name].append((None, "build failed: " + error_summary(result.error_msg),
                                       trace, role, form))
            else:
                # the arguments of the kernel as built: weights in their packed layout, as
                # MetaSchedule's builder drops the repacking (done once, at compile time)
                args = ms.arg_info.ArgInfo.from_entry_func(module, remove_preproc=True)
                to_run.append((name, trace, role, form, ms.runner.RunnerInput(
                    result.artifact_path, device_type(target), args)))
        left = Counter(name for name, *_ in to_run)
        bar.tick(sum(1 for name in chunk if not left[name]), "measure")  # nothing to run
        if to_run:
            wait_for_idle_pool()  # this process's TVM threads would share the cores
        futures = run_kernels(runner, [entry for *_, entry in to_run]) if to_run else []
        for (name, trace, role, form, _), future in zip(to_run, futures):
            outcomes[name].append((*run_outcome(name, future.result(), runner), trace, role,
                                   form))
            left[name] -= 1
            if not left[name]:
                bar.tick(1, "measure")
        if aborted():  # an aborted run is no failure to record
            raise_if_stopped()
        for name in chunk:
            costs[name] = commit(name, outcomes[name])
    return costs


def _commit_fastest(tuning_log: TuningLog, kernel_mod: tvm.IRModule, name: str,
                    outcomes: list) -> KernelCost:
    """Record a kernel's measured default schedules, fastest first (its first record is then
    its default-schedule cost, `TuningLog.default_seconds`), and a seed schedule after them
    when it beat them all; the cost is the fastest's."""
    ran = sorted(((record_seconds(secs), secs, trace, role)
                  for secs, _, trace, role, _ in outcomes if secs), key=lambda entry: entry[0])
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
    seed_schedule = None if not any(role == "seed" for *_, role, _ in outcomes) else \
        ("kept" if kept else "slower")
    return KernelCost(ran[0][0], "measured", 1, seed_schedule=seed_schedule)


def _commit_recheck(tuning_log: TuningLog, kernel_mod: tvm.IRModule, name: str, logged: float,
                    outcomes: list) -> KernelCost:
    """Record the re-measurement of an implausible best record; set the old record aside when
    the new one is less than half of it (the old was a stalled run). Unmeasurable: as logged."""
    ran = [(record_seconds(secs), secs, trace) for secs, _, trace, *_ in outcomes if secs]
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
