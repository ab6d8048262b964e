"""A kernel builder whose worker processes stay up between calls.

MetaSchedule's LocalBuilder starts a fresh worker pool for every `build()` call, and another
one in its constructor to check the build functions. Costing measures kernels in many small
calls (lazy costing's rounds, the groups between time-budget checks), and on a small machine
starting the workers (each imports TVM) can cost more than the builds. Here the pool starts once
per costing session (costing/session.py); each worker is replaced after `BUILDS_PER_WORKER`
builds, which bounds the memory growth LocalBuilder restarts its pools for. Kernels linked for
this machine are built several to a library (kernel_libraries.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .kernel_libraries import LIBRARY_KERNELS, build_library_job, library_groups

BUILDS_PER_WORKER = 256


def _archive_job(mods: list, target, scratch: str | None) -> list:
    """Worker side: [(archive path, None)] of the one kernel in `mods`, written under `scratch`
    for a runner that links it itself (a remote one, `export_into`)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    from .metaschedule_setup import export_into

    (mod,) = mods
    return [(export_into(scratch, default_build(mod, target, None)), None)]


class PooledBuilder:
    """`build([BuilderInput]) -> [BuilderResult]`, like LocalBuilder, on a lasting pool.

    Used for default-schedule measurements only (tuning keeps MetaSchedule's own builder,
    which its search loop calls through TVM's object system). `close()` stops the workers;
    the builder is also a context manager.
    """

    def __init__(self, target, max_workers: int, timeout_sec: float | None = None,
                 scratch: str | None = None, linked: bool = False):
        """Workers for `target`: `max_workers` of them (at least one), a build time-out of
        `timeout_sec` (None: per target), artifacts exported under `scratch` (None: the
        temporary folder), in shared libraries of several kernels when `linked` (for a runner
        on this machine: kernel_libraries.py), else as archives (`export_into`)."""
        from tvm.support.popen_pool import PopenPoolExecutor

        from .metaschedule_setup import builder_worker_settings

        initializer, self.timeout_sec = builder_worker_settings(target, timeout_sec)
        self.scratch, self.linked, self.workers = scratch, linked, max(1, max_workers)
        self._pool = PopenPoolExecutor(
            max_workers=self.workers, timeout=self.timeout_sec, initializer=initializer,
            maximum_process_uses=BUILDS_PER_WORKER // (LIBRARY_KERNELS if linked else 1))

    def build(self, inputs: Sequence) -> list:
        """One BuilderResult per BuilderInput, in order; a failure or time-out is its error.
        Linked kernels are built up to `LIBRARY_KERNELS` to a library: their artifacts are
        entries of it, which `kernel_libraries.run_kernels` times."""
        if self.linked:
            return self._build_libraries(inputs)
        return [result for results, _ in self._built_groups([[i] for i in inputs], _archive_job)
                for result in results]

    def batch(self) -> BuildBatch:
        """A build whose inputs come one kernel's schedules at a time: each full library
        starts building while the caller makes the next schedules (`BuildBatch`)."""
        return BuildBatch(self)

    def _build_libraries(self, inputs: Sequence) -> list:
        """BuilderResults of `inputs` built into libraries."""
        inputs = list(inputs)
        return self._finished(inputs, [self._started(library_groups(inputs, self.workers))])

    def _started(self, groups: list, job=build_library_job) -> tuple[list, Iterator]:
        """(groups, their outcomes to come): each group handed to a worker as
        `job(mods, target, scratch)` (the pool takes them at once; reading an outcome waits
        for it)."""
        return groups, self._pool.map_with_error_catching(
            lambda args: job(*args),
            [([i.mod for i in group], group[0].target, self.scratch) for group in groups])

    def _finished(self, inputs: list, started: list) -> list:
        """The BuilderResults of `inputs`, in order, from their `started` libraries; the
        kernels of a library that timed out are built again one to a library, so that a slow
        build fails only itself."""
        groups, built = [], []
        for started_groups, outcomes in started:
            for group, outcome in zip(started_groups, outcomes):
                groups.append(group)
                built.append(self._result(group, outcome))
        assert [item for group in groups for item in group] == inputs
        again = [[item] for (_, timed_out), group in zip(built, groups)
                 if timed_out and len(group) > 1 for item in group]
        retried = iter(self._built_groups(again, build_library_job) if again else [])
        results = []
        for (group_results, timed_out), group in zip(built, groups):
            if timed_out and len(group) > 1:
                group_results = [next(retried)[0][0] for _ in group]
            results += group_results
        return results

    def _built_groups(self, groups: list, job) -> list:
        """Per group of inputs, built by `job(mods, target, scratch)` in a worker:
        ([BuilderResult], whether the job timed out)."""
        return [self._result(group, outcome)
                for group, outcome in zip(*self._started(groups, job))]

    def _result(self, group: list, outcome) -> tuple[list, bool]:
        """([BuilderResult] of `group`, whether its job timed out) from the job's outcome."""
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.support.popen_pool import StatusKind

        if outcome.status == StatusKind.COMPLETE:
            return [BuilderResult(artifact, error) for artifact, error in outcome.value], False
        timed_out = outcome.status == StatusKind.TIMEOUT
        error = (f"build timed out (killed after {self.timeout_sec:.0f} s)" if timed_out
                 else f"build failed: {outcome.value}")
        return [BuilderResult(None, error) for _ in group], timed_out

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> PooledBuilder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BuildBatch:
    """Inputs added a few at a time (`add`), their `results()` in order at the end.

    On a machine of few cores the caller's scheduling and the workers' builds used to take
    turns; here each full library (`LIBRARY_KERNELS` inputs) is handed to the workers as soon
    as its schedules are made, and what is left at the end is cut among the workers as
    `build` cuts it. Without a linked builder, every input is built at the end."""

    def __init__(self, builder: PooledBuilder):
        self.builder = builder
        self.inputs: list = []
        self.started: list = []  # [(groups, their outcomes to come)]
        self._waiting = 0  # inputs at the end of `inputs` not handed over yet

    def add(self, inputs: Sequence) -> None:
        self.inputs += inputs
        self._waiting += len(inputs)
        if not self.builder.linked:
            return
        while self._waiting >= LIBRARY_KERNELS:
            start = len(self.inputs) - self._waiting
            library = self.inputs[start:start + LIBRARY_KERNELS]
            self.started.append(self.builder._started([library]))
            self._waiting -= LIBRARY_KERNELS

    def results(self) -> list:
        """One BuilderResult per input added, in order."""
        if not self.builder.linked:
            return self.builder.build(self.inputs)
        rest = self.inputs[len(self.inputs) - self._waiting:]
        if rest:
            self.started.append(self.builder._started(library_groups(rest, self.builder.workers)))
        self._waiting = 0
        return self.builder._finished(self.inputs, self.started)
