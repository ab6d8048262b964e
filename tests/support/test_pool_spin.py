"""Kernels are not measured beside this process's spinning TVM threads."""

import time

from korch_tvm.support import pool_spin


def test_a_measurement_waits_out_the_spin_after_parallel_work_and_not_otherwise(monkeypatch):
    clock = [100.0]
    slept = []
    monkeypatch.setattr(pool_spin.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(pool_spin.time, "sleep", slept.append)
    monkeypatch.setattr(pool_spin, "_last_parallel_work", float("-inf"))
    assert pool_spin.wait_for_idle_pool() == 0.0 and slept == []   # nothing ran here yet
    pool_spin.note_parallel_work()
    clock[0] += 0.1
    waited = pool_spin.wait_for_idle_pool()
    assert abs(waited - (pool_spin.SPIN_SECONDS - 0.1)) < 1e-9 and slept == [waited]
    clock[0] += pool_spin.SPIN_SECONDS
    assert pool_spin.wait_for_idle_pool() == 0.0 and len(slept) == 1


def test_a_verification_run_notes_its_parallel_work(monkeypatch):
    """One of the two places a compile runs TVM kernels in its own process before it measures
    more (the other, a library timing, below)."""
    import numpy as np
    import tvm
    from tvm import relax

    from korch_tvm.backend.target import parse_target
    from korch_tvm.backend.verify import run_executable

    monkeypatch.setattr(pool_spin, "_last_parallel_work", float("-inf"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    executable = tvm.compile(bb.get(), target="llvm")
    before = time.perf_counter()
    [out] = run_executable(executable, parse_target("llvm"), [np.ones(4, "float32")])
    assert out.tolist() == [2.0] * 4 and pool_spin._last_parallel_work >= before


def test_a_library_timing_notes_its_parallel_work(monkeypatch, tmp_path):
    from korch_tvm.costing.library_costs import LibraryTimes
    from korch_tvm.library import GemmSpec, Implementation

    class Timed(Implementation):
        def measure(self, repeats=7, min_repeat_seconds=2e-3, preprocess=""):
            return 1e-4

    spec = GemmSpec((), 2, 3, 4, False, False, False, False, 0, 1)
    monkeypatch.setattr(pool_spin, "_last_parallel_work", float("-inf"))
    monkeypatch.setattr("korch_tvm.costing.library_costs.SETTLE_SECONDS", 0.0)
    before = time.perf_counter()
    times = LibraryTimes(str(tmp_path))
    assert times.seconds(Timed("openblas.sgemm", "korch_tvm.blas.sgemm", spec)) == (1e-4, True)
    assert pool_spin._last_parallel_work >= before
