"""The costing session: one log, runner, builder pool, time budget and scratch folder a compile."""

import gc
import os
import time

import tvm
from tvm.s_tir import meta_schedule as ms

from korch_tvm.config import KorchConfig
from korch_tvm.costing.kernel_libraries import split_entry
from korch_tvm.costing.pooled_builder import PooledBuilder
from korch_tvm.costing.runners import links_here, local_runner, rpc_runner
from korch_tvm.costing.session import CostingSession, open_tuning_log

from test_measure import TARGET, legalized_kernels


def test_the_session_holds_one_time_budget_that_parts_cannot_exceed(tmp_path):
    with CostingSession.open(KorchConfig(tuning_logs=str(tmp_path), time_budget=100.0)) as session:
        assert 99.0 < session.seconds_left() <= 100.0
        assert session.seconds_left(3.0) == 3.0  # a layout's part, within the whole
        session.deadline = time.perf_counter() + 1.0
        assert session.seconds_left(3.0) <= 1.0  # the whole, when less is left of it
    with CostingSession.open(KorchConfig(tuning_logs=str(tmp_path))) as session:
        assert session.seconds_left() is None and session.seconds_left(2.0) == 2.0
        assert session.tuning_log.directory.startswith(str(tmp_path))


def test_a_throw_away_log_and_the_builders_artifacts_go_with_the_session(tmp_path):
    """No TMPDIR is set for the process: the pooled builder exports into the session's scratch
    folder, which is removed, with the throw-away log in it, when the session closes."""
    environment = dict(os.environ)
    with CostingSession.open(KorchConfig(tuning_logs=None, target=TARGET)) as session:
        scratch = session.scratch
        assert session.tuning_log.directory.startswith(scratch)
        kernel = legalized_kernels(8)["add"]
        built = session.builder().build([ms.builder.BuilderInput(kernel, TARGET)])
        assert built[0].error_msg is None, built[0].error_msg
        assert built[0].artifact_path.startswith(scratch + os.sep)
        # linked by the builder for this machine's runner, in a library (kernel_libraries.py)
        library, symbol = split_entry(built[0].artifact_path)
        assert os.path.basename(library) == "kernels.so" and symbol == "kernel_0"
        assert session.builder() is session.builder()  # one pool for the session
        assert dict(os.environ) == environment
    assert not os.path.exists(scratch) and session._builder is None


def test_a_throw_away_log_that_outlives_its_session_is_removed_with_it(tmp_path):
    """The Korch pass opens its log outside the session (the plan keeps using it): with no
    logs kept, its temporary folder goes when the last reference to the log does, not never."""
    tuning_log, seed = open_tuning_log(KorchConfig(tuning_logs=None, target=TARGET),
                                    scratch=str(tmp_path))
    root = os.path.dirname(tuning_log.directory)
    assert os.path.dirname(root) == str(tmp_path) and os.path.isdir(tuning_log.directory)
    with CostingSession.open(KorchConfig(tuning_logs=None, target=TARGET), tuning_log) as session:
        session.tuning_log.commit_run(legalized_kernels(8)["add"], [1e-5, 1e-5, 1e-5])
    assert os.path.isdir(tuning_log.directory) and tuning_log.best_seconds(
        legalized_kernels(8)["add"]) == 1e-5
    database = tuning_log.database  # what ApplyTuningLog holds: it keeps the log
    del tuning_log, seed, session
    gc.collect()
    assert len(database) == 1 and os.path.isdir(root)
    del database
    gc.collect()
    assert os.listdir(tmp_path) == []
    kept, _ = open_tuning_log(KorchConfig(tuning_logs=str(tmp_path / "kept"), target=TARGET))
    del kept
    gc.collect()
    assert os.path.isdir(tmp_path / "kept")  # a log the user keeps stays


def test_measuring_twice_through_one_session_measures_once(tmp_path):
    kernels = legalized_kernels(8)
    with CostingSession.open(KorchConfig(tuning_logs=str(tmp_path), target=TARGET,
                                         progress=False)) as session:
        first = session.measure(kernels)
        again = session.measure(kernels)
    assert {cost.source for cost in first.values()} == {"measured"}
    assert {cost.source for cost in again.values()} == {"log"}
    assert {name: cost.seconds for name, cost in again.items()} == \
        {name: session.tuning_log.best_seconds(kernels[name]) for name in kernels}


def test_the_cost_model_is_loaded_once_per_session_and_only_when_asked(tmp_path, monkeypatch):
    from korch_tvm.costing import session as session_module

    loads = []

    def load(tuning_log, target):
        loads.append(tuning_log.directory)
        return lambda kernel_mod: 2e-6

    monkeypatch.setattr(session_module, "default_predictor", load)
    kernels = legalized_kernels(8)
    with CostingSession.open(KorchConfig(tuning_logs=str(tmp_path), target=TARGET)) as session:
        assert loads == []  # opening a session loads nothing
        assert [session.predict(kernel) for kernel in kernels.values()] == [2e-6, 2e-6]
        assert session.predict(kernels["add"]) == 2e-6
    assert loads == [session.tuning_log.directory]


def test_a_kernel_linked_by_the_builder_loads_and_computes_without_the_runner_linking_it(tmp_path):
    """The runner on this machine loads the builder's shared library as it is, one library for
    several kernels (kernel_libraries.py); a remote runner is sent the archive (linked there
    by its own toolchain)."""
    import numpy as np

    kernels = legalized_kernels(8)
    with PooledBuilder(TARGET, max_workers=1, scratch=str(tmp_path), linked=True) as builder:
        linked = builder.build([ms.builder.BuilderInput(kernels[name], TARGET)
                                for name in ("add", "matmul")])
    with PooledBuilder(TARGET, max_workers=1, scratch=str(tmp_path)) as builder:
        (archived,) = builder.build([ms.builder.BuilderInput(kernels["add"], TARGET)])
    assert archived.artifact_path.endswith(".tar")
    (path, add), (same_path, matmul) = (split_entry(r.artifact_path) for r in linked)
    assert path == same_path and path.endswith(".so") and add != matmul
    library = tvm.runtime.load_module(path)
    a, b = (np.random.default_rng(seed).random((8, 8), dtype="float32") for seed in (0, 1))
    for symbol, expected in ((add, a + b), (matmul, a @ b)):
        out = tvm.runtime.tensor(np.zeros((8, 8), "float32"))
        library[symbol](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    assert links_here(None, TARGET) and links_here(local_runner(TARGET), TARGET)
    assert not links_here(rpc_runner("127.0.0.1", 9190, "remote"), TARGET)
    assert not links_here(None, tvm.target.Target("cuda"))


def test_builder_workers_pools_do_not_spin_beside_the_runner(monkeypatch):
    """The builders finish right before the runner times their kernels on the same cores:
    their TVM pools sleep at once (spin count 0) on every target; this process's and so the
    runner's keep TVM's default."""
    import os

    from tvm.support.popen_pool import PopenPoolExecutor

    from korch_tvm.costing.metaschedule_setup import builder_worker_settings

    monkeypatch.delenv("TVM_THREAD_POOL_SPIN_COUNT", raising=False)
    for target in (TARGET, tvm.target.Target("cuda")):
        initializer, _ = builder_worker_settings(target)
        pool = PopenPoolExecutor(max_workers=1, initializer=initializer)
        try:
            # a lambda travels by value and reads the worker's environment
            spin = pool.submit(lambda: __import__("os").environ.get(
                "TVM_THREAD_POOL_SPIN_COUNT")).result()
        finally:
            pool.shutdown()
        assert spin == "0", target
    assert "TVM_THREAD_POOL_SPIN_COUNT" not in os.environ  # nor the runner's, started from it
