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

from collections.abc import Sequence

from .kernel_libraries import LIBRARY_KERNELS, build_library_job, library_groups

BUILDS_PER_WORKER = 256


def _build_and_export(mod, target, scratch: str | None, linked: bool) -> str:
    """Worker side: compile one kernel and write it under `scratch`, where the runner loads it
    (a shared library when `linked`, see `export_into`)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    from .metaschedule_setup import export_into

    return export_into(scratch, default_build(mod, target, None), linked)


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
        temporary folder), as shared libraries when `linked` (for a runner on this machine:
        `metaschedule_setup.export_into`), else as archives."""
        from tvm.support.popen_pool import PopenPoolExecutor

        from .metaschedule_setup import builder_worker_settings

        initializer, self.timeout_sec = builder_worker_settings(target, timeout_sec)
        self.scratch, self.linked, self.workers = scratch, linked, max(1, max_workers)
        self._pool = PopenPoolExecutor(
            max_workers=max(1, max_workers), timeout=self.timeout_sec, initializer=initializer,
            maximum_process_uses=BUILDS_PER_WORKER // (LIBRARY_KERNELS if linked else 1))

    def build(self, inputs: Sequence) -> list:
        """One BuilderResult per BuilderInput, in order; a failure or time-out is its error.
        Linked kernels are built up to `LIBRARY_KERNELS` to a library: their artifacts are
        entries of it, which `kernel_libraries.run_kernels` times."""
        if self.linked:
            return self._build_libraries(inputs)
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.support.popen_pool import StatusKind

        results = []
        for outcome in self._pool.map_with_error_catching(
                lambda job: _build_and_export(*job),
                [(i.mod, i.target, self.scratch, self.linked) for i in inputs]):
            if outcome.status == StatusKind.COMPLETE:
                results.append(BuilderResult(outcome.value, None))
            elif outcome.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(
                    None, f"build timed out (killed after {self.timeout_sec:.0f} s)"))
            else:
                results.append(BuilderResult(None, f"build failed: {outcome.value}"))
        return results

    def _build_libraries(self, inputs: Sequence) -> list:
        """BuilderResults of `inputs` built into libraries; the kernels of a library that timed
        out are built again one to a library, so that a slow build fails only itself."""
        groups = library_groups(list(inputs), self.workers)
        built = self._built_groups(groups)
        retried = iter(self._built_groups([[item] for (_, timed_out), group in zip(built, groups)
                                           if timed_out and len(group) > 1 for item in group]))
        results = []
        for (group_results, timed_out), group in zip(built, groups):
            if timed_out and len(group) > 1:
                group_results = [next(retried)[0][0] for _ in group]
            results += group_results
        return results

    def _built_groups(self, groups: list) -> list:
        """Per group of inputs, ([BuilderResult], whether its job timed out)."""
        from tvm.s_tir.meta_schedule.builder import BuilderResult
        from tvm.support.popen_pool import StatusKind

        built = []
        for group, outcome in zip(groups, self._pool.map_with_error_catching(
                lambda job: build_library_job(*job),
                [([i.mod for i in group], group[0].target, self.scratch) for group in groups])):
            if outcome.status == StatusKind.COMPLETE:
                built.append(([BuilderResult(artifact, error)
                               for artifact, error in outcome.value], False))
                continue
            timed_out = outcome.status == StatusKind.TIMEOUT
            error = (f"build timed out (killed after {self.timeout_sec:.0f} s)" if timed_out
                     else f"build failed: {outcome.value}")
            built.append(([BuilderResult(None, error) for _ in group], timed_out))
        return built

    def close(self) -> None:
        self._pool.shutdown()

    def __enter__(self) -> PooledBuilder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
