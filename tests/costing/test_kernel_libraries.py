"""Kernels built several to a library and timed from it: errors stay each kernel's own."""

import math
from concurrent.futures import Future

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from korch_tvm.costing.kernel_libraries import (LIBRARY_KERNELS, entry, library_groups,
                                                run_kernels, split_entry)
from korch_tvm.costing.pooled_builder import PooledBuilder
from korch_tvm.costing.runners import local_runner

from test_measure import TARGET, legalized_kernels


@T.prim_func(s_tir=True)
def _gpu_threads_on_a_cpu(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in T.thread_binding(16, thread="threadIdx.x"):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            B[vi] = A[vi]


UNBUILDABLE = tvm.IRModule({"main": _gpu_threads_on_a_cpu.with_attr("global_symbol", "main")})


def test_an_entry_names_its_library_and_symbol():
    assert split_entry(entry("/tmp/a b/kernels.so", "kernel_3")) == ("/tmp/a b/kernels.so",
                                                                      "kernel_3")
    assert split_entry("/tmp/x/kernel.so") is None and split_entry("::kernel_0") is None


def test_kernels_are_cut_into_libraries_one_per_worker_at_least():
    sizes = {n: [len(g) for g in library_groups(list(range(n)), 2)] for n in (0, 1, 3, 9, 17)}
    assert sizes == {0: [], 1: [1], 3: [2, 1], 9: [5, 4], 17: [6, 6, 5]}
    groups = library_groups(list(range(64)), 2)
    assert [len(g) for g in groups] == [LIBRARY_KERNELS] * 8 and sum(groups, []) == list(range(64))


def test_kernels_share_libraries_and_one_that_cannot_build_fails_alone(tmp_path):
    kernels = legalized_kernels(16)
    mods = [kernels["add"], UNBUILDABLE, kernels["matmul"], kernels["add"], kernels["matmul"],
            kernels["add"]]
    with PooledBuilder(TARGET, max_workers=2, scratch=str(tmp_path), linked=True) as builder:
        built = builder.build([ms.builder.BuilderInput(mod, TARGET) for mod in mods])
    assert [r.error_msg is None for r in built] == [True, False, True, True, True, True]
    assert "not implemented" in built[1].error_msg.lower()
    # two libraries of three (one per worker); the first failed as a whole and was built a
    # kernel at a time, so its two good kernels have libraries of their own
    libraries = [split_entry(r.artifact_path)[0] if r.error_msg is None else None for r in built]
    assert len({libraries[0], libraries[2], libraries[3]}) == 3
    assert libraries[3:] == [libraries[3]] * 3

    runner = local_runner(TARGET, cache_state="warm")
    inputs = [ms.runner.RunnerInput(r.artifact_path, "cpu",
                                    ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))
              for r, mod in zip(built, mods) if r.error_msg is None]
    results = [future.result() for future in run_kernels(runner, inputs)]
    assert all(r.error_msg is None and len(r.run_secs) == 3 for r in results)
    assert all(0 < float(s) < 0.1 for r in results for s in r.run_secs)


class _Pool:
    """A runner pool whose jobs of more than one kernel fail, as a crashing library's would."""

    def __init__(self):
        self.jobs = []

    def submit(self, function, *args):
        kernels = args[-1]
        self.jobs.append([symbol for symbol, _ in kernels])
        future = Future()
        if len(kernels) > 1:
            future.set_exception(ChildProcessError("worker died"))
        elif kernels[0][0] == "kernel_1":
            future.set_exception(TimeoutError())
        else:
            future.set_result([([1e-5] * 3, None)])
        return future


def test_a_library_whose_timing_fails_has_its_kernels_timed_one_by_one():
    runner = local_runner(TARGET)
    runner.pool = pool = _Pool()
    info = ms.arg_info.ArgInfo.from_entry_func(legalized_kernels(8)["add"])
    inputs = [ms.runner.RunnerInput(entry("/x/kernels.so", f"kernel_{i}"), "cpu", info)
              for i in range(3)]
    results = [future.result() for future in run_kernels(runner, inputs)]
    assert pool.jobs == [["kernel_0", "kernel_1", "kernel_2"], ["kernel_0"], ["kernel_1"],
                         ["kernel_2"]]
    assert [r.error_msg is None for r in results] == [True, False, True]
    assert "timeout" in results[1].error_msg.lower()
    assert [float(s) for s in results[0].run_secs] == [1e-5] * 3
    assert not any(math.isnan(float(s)) for s in results[2].run_secs)


class _TimingOutPool:
    """A builder pool whose jobs of more than one kernel time out; one kernel builds."""

    def __init__(self):
        self.jobs = []

    def map_with_error_catching(self, function, jobs):
        from tvm.support.popen_pool import MapResult, StatusKind

        for mods, _, _ in jobs:
            self.jobs.append(len(mods))
            yield (MapResult(StatusKind.TIMEOUT, None) if len(mods) > 1 else
                   MapResult(StatusKind.COMPLETE, [(entry(f"/x/{len(self.jobs)}.so", "kernel_0"),
                                                    None)]))


def test_a_library_that_times_out_is_built_again_a_kernel_at_a_time():
    kernels = legalized_kernels(8)
    builder = PooledBuilder(TARGET, max_workers=2, timeout_sec=60, linked=True)
    real, builder._pool = builder._pool, _TimingOutPool()
    try:
        pool = builder._pool
        built = builder.build([ms.builder.BuilderInput(kernels[name], TARGET)
                               for name in ("add", "matmul", "add")])
    finally:
        builder._pool = real
        builder.close()
    # libraries of two and one; the two timed out and were built again one by one
    assert pool.jobs == [2, 1, 1, 1] and all(r.error_msg is None for r in built)
    assert [split_entry(r.artifact_path)[0] for r in built] == ["/x/3.so", "/x/4.so", "/x/2.so"]


class _StartingPool:
    """A builder pool that records when each job is handed over (at the call, as the real
    pool's threads take them) and builds each kernel as its own entry."""

    def __init__(self):
        self.handed = []

    def map_with_error_catching(self, function, jobs):
        from tvm.support.popen_pool import MapResult, StatusKind

        jobs = list(jobs)
        self.handed.append([len(mods) for mods, _, _ in jobs])
        outcomes, start = [], sum(map(sum, self.handed[:-1]))  # kernels handed before
        for mods, _, _ in jobs:
            outcomes.append(MapResult(StatusKind.COMPLETE, [
                (entry(f"/x/{start}.so", f"kernel_{start + i}"), None) for i in range(len(mods))]))
            start += len(mods)
        return iter(outcomes)


def test_a_batch_hands_each_full_library_over_as_its_kernels_come():
    kernels = legalized_kernels(8)
    builder = PooledBuilder(TARGET, max_workers=2, timeout_sec=60, linked=True)
    real, builder._pool = builder._pool, _StartingPool()
    try:
        pool, batch = builder._pool, builder.batch()
        inputs = [ms.builder.BuilderInput(kernels["add"], TARGET)
                  for _ in range(2 * LIBRARY_KERNELS + 3)]
        batch.add(inputs[:5])
        assert pool.handed == []                       # not a library's worth yet
        batch.add(inputs[5:2 * LIBRARY_KERNELS + 1])   # two libraries full, one kernel over
        assert pool.handed == [[LIBRARY_KERNELS], [LIBRARY_KERNELS]]
        batch.add(inputs[2 * LIBRARY_KERNELS + 1:])
        built = batch.results()                        # the three left, cut for two workers
    finally:
        builder._pool = real
        builder.close()
    assert pool.handed == [[LIBRARY_KERNELS], [LIBRARY_KERNELS], [2, 1]]
    # one result per input, in order
    assert [split_entry(r.artifact_path)[1] for r in built] == \
        [f"kernel_{i}" for i in range(len(inputs))]


def test_a_batch_builds_what_build_builds(tmp_path):
    kernels = legalized_kernels(16)
    mods = [kernels["add"], UNBUILDABLE] + [kernels["matmul"]] * LIBRARY_KERNELS
    with PooledBuilder(TARGET, max_workers=2, scratch=str(tmp_path), linked=True) as builder:
        batch = builder.batch()
        for mod in mods:
            batch.add([ms.builder.BuilderInput(mod, TARGET)])
        built = batch.results()
    assert [r.error_msg is None for r in built] == [True, False] + [True] * LIBRARY_KERNELS
    # the first library (8 kernels) held the unbuildable one: its 7 others were built again a
    # kernel at a time; the 2 kernels left at the end were cut into one library per worker
    libraries = [split_entry(r.artifact_path)[0] for r in built if r.error_msg is None]
    assert len(libraries) == len(set(libraries)) == LIBRARY_KERNELS + 1
