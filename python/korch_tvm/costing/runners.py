"""Runners and their results: where kernels run, and what a measurement's outcome means.

A runner here is MetaSchedule's (`LocalRunner` on this machine, `RPCRunner` on devices behind a
tracker), optionally wrapped to count what it measures for the progress line. MetaSchedule's own
log lines are routed into `korch_tvm.metaschedule`, silent unless the application shows them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..backend.target import configure_threads
from ..errors import KorchError, error_summary
from .cache_state import run_evaluator
from .metaschedule_setup import (SAMPLES, evaluator_config, evaluator_for_target,
                                 skip_gpu_tensor_intrin)
from .measure_inputs import alloc_in_range_arguments, rpc_alloc_in_range_arguments

logger = logging.getLogger("korch_tvm.profiler")
metaschedule_logger = logging.getLogger("korch_tvm.metaschedule")
# A library must not print through logging's last-resort handler: MetaSchedule's chatter reaches
# the terminal only if the application configures a handler for it (or for the root logger).
metaschedule_logger.addHandler(logging.NullHandler())

DEFAULT_RUNNER_TIMEOUT = 30.0  # MetaSchedule's LocalRunner default, when a runner does not say


def rpc_runner(tracker_host: str, tracker_port: int, key: str, *, cache_flush: bool = True,
               max_workers: int = 1, session_timeout_sec: int = 60):
    """MetaSchedule's RPCRunner: measure on devices registered with the RPC tracker at
    `tracker_host`:`tracker_port` under `key`, with cold CPU caches unless `cache_flush` is
    False, on `max_workers` devices at a time, each session cut after `session_timeout_sec`."""
    from tvm.s_tir import meta_schedule as ms

    skip_gpu_tensor_intrin()
    config = ms.runner.RPCConfig(tracker_host=tracker_host, tracker_port=int(tracker_port),
                                 tracker_key=key, session_timeout_sec=session_timeout_sec)
    return ms.runner.RPCRunner(
        rpc_config=config, max_workers=max_workers, initializer=skip_gpu_tensor_intrin,
        evaluator_config=evaluator_config(enable_cpu_cache_flush=cache_flush),
        f_alloc_argument=rpc_alloc_in_range_arguments,  # indices in range
    )


def local_runner(target, *, cache_state: str = "cold", threads: int | None = None):
    """The default runner for `target`: this machine, each CPU kernel timed from `cache_state`
    ("cold", "l3": costing/cache_state.py; "warm": no step between calls), a GPU's warm (it
    has no CPU cache); its worker runs kernels on `threads` threads (None: as TVM sizes its
    pool there)."""
    from tvm.s_tir import meta_schedule as ms

    cpu = target.kind.name == "llvm"
    initializer = None if threads is None else functools.partial(configure_threads, threads)
    return ms.runner.LocalRunner(
        evaluator_config=evaluator_for_target(target, cache_flush=cpu and cache_state == "cold"),
        f_alloc_argument=alloc_in_range_arguments,  # indices in range
        f_run_evaluator=run_evaluator if cpu and cache_state == "l3" else None,
        initializer=initializer)


def runner_cache_state(runner) -> str:
    """The cache state `runner` (a `local_runner`) times CPU kernels from."""
    if getattr(runner, "f_run_evaluator", None) is run_evaluator:
        return "l3"
    return "cold" if runner.evaluator_config.enable_cpu_cache_flush else "warm"


def configured_runner(config):
    """MetaSchedule's RPC runner when `config.rpc_tracker` ("HOST:PORT", with `config.rpc_key`)
    is set, else None (the caller then runs on this machine)."""
    if not config.rpc_tracker:
        return None
    host, _, port = config.rpc_tracker.rpartition(":")
    if not host or not port.isdigit() or not config.rpc_key:
        raise KorchError("--rpc-tracker takes HOST:PORT and needs --rpc-key")
    return rpc_runner(host, int(port), config.rpc_key)


@contextmanager
def metaschedule_logs_routed() -> Iterator[None]:
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


def links_here(runner, target) -> bool:
    """Whether kernels for `runner` are best linked by the builders (`export_into`): it is this
    machine's CPU runner (None: the one made when needed), not a remote or GPU one."""
    from tvm.s_tir import meta_schedule as ms

    return target.kind.name == "llvm" and (runner is None
                                           or isinstance(runner, ms.runner.LocalRunner))


def device_type(target) -> str:
    """The device type a RunnerInput names for `target`."""
    return "cuda" if target.kind.name == "cuda" else "cpu"


def run_outcome(name: str, outcome, runner) -> tuple[list[float] | None, str | None]:
    """(run seconds, None) or (None, error) of one runner result."""
    if outcome.error_msg is not None and timed_out(outcome.error_msg):
        # Slow, not broken: a lower bound keeps it usable where nothing else covers its
        # primitives, makes the solver avoid it elsewhere, and draws the trials to it.
        logger.warning("kernel %s timed out in the runner; costed at its time-out "
                       "(%.0f s, a lower bound)", name, timeout_seconds(runner))
        return [timeout_seconds(runner)] * SAMPLES, None  # as many samples as a run gives
    if outcome.error_msg is not None or not outcome.run_secs:
        return None, "run failed: " + error_summary(outcome.error_msg or "no time")
    return [float(s) for s in outcome.run_secs], None


def timed_out(error_message: str) -> bool:
    """Whether a runner's error says the kernel ran past its time-out."""
    return "timeout" in error_message.lower() or "timed out" in error_message.lower()


def timeout_seconds(runner) -> float:
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


def counting_runner(runner, on_result):
    """`runner`, calling `on_result()` once per measurement collected from it."""
    return _counting_runner_classes()(runner, on_result)
