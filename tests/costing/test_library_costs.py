"""Library times: the cheaper of TVM and the BLAS, measured once, the file checked on reading."""

import json
import logging
import math
from pathlib import Path

import pytest

from korch_tvm.costing.kernel_costs import (KernelCost, LibraryTime, cheaper_of,
                                            default_schedule_costs, summarize)
from korch_tvm.costing.library_costs import (LIBRARY_TIMES_FILE, LibraryTimes, entry_key,
                                             read_library_times)
from korch_tvm.costing.metaschedule_setup import SAMPLES
from korch_tvm.costing.cache_state import EVICT_FUNCTION
from korch_tvm.library import GemmSpec

SPEC = GemmSpec(batch_shape=(12,), m=197, n=197, k=64, transpose_a=False, transpose_b=True,
                a_batched=True, b_batched=True, a_input=0, b_input=1)
KEY = "openblas.sbgemm batch=12 m=197 n=197 k=64 ta=0 tb=1 ab=1 bb=1"
# three rounds, each of as many cold runs (after TVM's flush) as the runner times of a TVM kernel
COLD_ROUNDS = [(SAMPLES, "cache_flush_cpu_non_first_arg")] * 3


class TimedCall:
    """Stands in for a library Implementation: a fixed time, and how often it was measured."""

    def __init__(self, seconds=1e-3, name="openblas.sbgemm", spec=SPEC):
        self.name, self.spec, self.seconds, self.calls = name, spec, seconds, []

    def measure(self, repeats=7, preprocess=""):
        self.calls.append((repeats, preprocess))
        return self.seconds


def test_library_calls_are_timed_from_the_cache_state_of_the_tvm_kernels(tmp_path):
    call = TimedCall(2e-4)
    assert LibraryTimes(str(tmp_path), "l3").seconds(call) == (2e-4, True)
    assert call.calls == [(SAMPLES, EVICT_FUNCTION)] * 3


def test_entry_key_names_the_call_and_every_shape_field():
    assert entry_key(TimedCall()) == KEY


def test_times_are_measured_once_and_read_back_by_a_second_compile(tmp_path):
    call = TimedCall(2.5e-4)
    first = LibraryTimes(str(tmp_path))
    assert first.seconds(call) == (2.5e-4, True) and first.seconds(call) == (2.5e-4, True)
    assert call.calls == COLD_ROUNDS and first.measured == 1
    saved = json.loads((tmp_path / LIBRARY_TIMES_FILE).read_text())
    assert saved == {"format": 1, "seconds": {KEY: 2.5e-4}}
    second, again = LibraryTimes(str(tmp_path)), TimedCall(9.0)
    assert second.seconds(again) == (2.5e-4, False)
    assert again.calls == [] and second.measured == 0


@pytest.mark.parametrize("text", ["{not json", '["a list"]', '{"format": 7, "seconds": {}}',
                                  ""])
def test_a_corrupt_file_is_refused_in_one_line_and_measured_again(tmp_path, caplog, text):
    (tmp_path / LIBRARY_TIMES_FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger="korch_tvm.library_costs"):
        times = LibraryTimes(str(tmp_path))
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    assert "measuring them again" in caplog.records[0].getMessage()
    call = TimedCall(3e-4)
    assert times.seconds(call) == (3e-4, True) and call.calls == COLD_ROUNDS
    assert read_library_times(str(tmp_path / LIBRARY_TIMES_FILE)) == {KEY: 3e-4}


@pytest.mark.parametrize("key, seconds, reason", [
    (KEY, -1e-3, "not a finite positive"),
    (KEY, 0.0, "not a finite positive"),
    (KEY, float("nan"), "not a finite positive"),
    (KEY, float("inf"), "not a finite positive"),
    (KEY, "1e-3", "is not a number"),
    (KEY, True, "is not a number"),
    (KEY.replace("openblas", "mkl"), 1e-3, "unknown implementation 'mkl.sbgemm'"),
    (KEY + "; rm -rf /", 1e-3, "not a library call"),
])
def test_a_bad_entry_is_refused_and_measured_again(tmp_path, caplog, key, seconds, reason):
    good = "openblas.sgemm batch=1 m=8 n=8 k=8 ta=0 tb=0 ab=0 bb=0"
    (tmp_path / LIBRARY_TIMES_FILE).write_text(json.dumps(
        {"format": 1, "seconds": {key: seconds, good: 1e-5}}))
    with caplog.at_level(logging.WARNING, logger="korch_tvm.library_costs"):
        times = LibraryTimes(str(tmp_path))
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and reason in messages[0] and "refused" in messages[0]
    call = TimedCall(4e-4, name=key.split()[0] if key.startswith("openblas") else
                     "openblas.sbgemm")
    assert times.seconds(call) == (4e-4, True) and call.calls == COLD_ROUNDS  # not the file's
    assert read_library_times(str(tmp_path / LIBRARY_TIMES_FILE)) == {KEY: 4e-4, good: 1e-5}


def test_cheaper_of_takes_the_lower_and_remembers_the_library():
    library = LibraryTime("openblas.sgemm", 1e-3)
    slow = cheaper_of(KernelCost(5e-3, "measured", 1), library)
    assert (slow.seconds, slow.source, slow.implementation) == (1e-3, "measured",
                                                                "openblas.sgemm")
    fast = cheaper_of(KernelCost(5e-4, "tuned", 32), library)
    assert (fast.seconds, fast.implementation, fast.library) == (5e-4, None, library)
    failed = cheaper_of(KernelCost(math.inf, "failed", 1, "crashed"), library)
    assert (failed.seconds, failed.source, failed.error) == (1e-3, "log", None)  # from the file
    timed = cheaper_of(KernelCost(1e-2, "predicted", 0), library._replace(measured_now=True))
    assert (timed.seconds, timed.source) == (1e-3, "measured")
    predicted_faster = cheaper_of(KernelCost(2e-4, "predicted", 0), library)
    assert predicted_faster.implementation is None and predicted_faster.source == "predicted"
    assert cheaper_of(slow, library) == slow and cheaper_of(slow, None) == slow
    assert summarize([slow, fast, failed])["library"] == 2


def test_default_schedule_costs_stay_the_cheaper_of_the_default_and_the_library():
    class Log:
        def default_seconds_of(self, modules):
            return [4e-3 for _ in modules]

    library = LibraryTime("openblas.sgemm", 1e-3)
    tuned_past_library = KernelCost(5e-4, "tuned", 64, library=library)
    costs = default_schedule_costs({"k": object()}, {"k": tuned_past_library}, Log())
    assert (costs["k"].seconds, costs["k"].implementation) == (1e-3, "openblas.sgemm")


def test_library_off_leaves_costs_alone(tmp_path):
    from korch_tvm.config import KorchConfig
    from korch_tvm.costing.session import CostingSession
    from korch_tvm.costing.tuning_log import TuningLog

    config = KorchConfig(library="off", tuning_logs=str(tmp_path))
    session = CostingSession(config, TuningLog(str(tmp_path), config.target), None,
                             str(tmp_path))
    costs = {"k": KernelCost(5e-3, "measured", 1)}
    assert session.library() is None
    assert session.with_library({"k": object()}, costs) == costs
    assert not (tmp_path / config.target.kind.name).exists() or not list(
        tmp_path.rglob(LIBRARY_TIMES_FILE))


def test_a_gemm_kernel_costs_the_blas_time_when_it_is_lower(tmp_path, blas_extension):
    import tvm
    from tvm import te

    from korch_tvm.costing.library_costs import LibraryCosts

    a, b = te.placeholder((64, 48), name="a"), te.placeholder((48, 32), name="b")
    k = te.reduce_axis((0, 48), "k")
    c = te.compute((64, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    gemm = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    library = LibraryCosts(str(tmp_path))
    costs = library.cheaper({"gemm": gemm}, {"gemm": KernelCost(10.0, "measured", 1),
                                             "other": KernelCost(1.0, "measured", 1)})
    assert costs["gemm"].implementation == "openblas.sgemm"
    assert 0 < costs["gemm"].seconds < 10.0 and costs["other"].implementation is None
    assert library.times.measured == 1
    again = LibraryCosts(str(tmp_path)).cheaper({"gemm": gemm}, {"gemm": KernelCost(
        10.0, "measured", 1)})
    assert again["gemm"].seconds == costs["gemm"].seconds


def _gemm_module():
    import tvm
    from tvm import te

    a, b = te.placeholder((64, 48), name="a"), te.placeholder((48, 32), name="b")
    k = te.reduce_axis((0, 48), "k")
    c = te.compute((64, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def _session(tmp_path, library="auto"):
    from korch_tvm.config import KorchConfig
    from korch_tvm.costing.session import CostingSession
    from korch_tvm.costing.tuning_log import TuningLog

    config = KorchConfig(library=library, tuning_logs=str(tmp_path), trials=8)
    log = TuningLog(str(tmp_path), config.target)
    return CostingSession(config, log, None, str(tmp_path)), log


def test_measure_and_tune_both_take_the_cheaper(blas_extension, tmp_path, monkeypatch):
    import korch_tvm.costing.session as session_module

    session, log = _session(tmp_path)
    directory = Path(log.directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = "openblas.sgemm batch=1 m=64 n=32 k=48 ta=0 tb=0 ab=0 bb=0"
    (directory / LIBRARY_TIMES_FILE).write_text(
        json.dumps({"format": 1, "seconds": {key: 2e-4}}))
    kernels = {"gemm": _gemm_module()}
    monkeypatch.setattr(session_module, "measure_kernels",
                        lambda *a, **k: {"gemm": KernelCost(1e-3, "measured", 1)})
    monkeypatch.setattr(session, "runner", lambda: None)
    measured = session.measure(kernels)
    assert (measured["gemm"].seconds, measured["gemm"].implementation) == (2e-4,
                                                                          "openblas.sgemm")
    monkeypatch.setattr(session_module, "trial_allocation", lambda *a: {"gemm": 8})
    monkeypatch.setattr(session_module, "tune_kernels",
                        lambda *a, **k: {"gemm": KernelCost(5e-5, "tuned", 8)})
    tuned = session.tune(kernels, {"gemm": 1.0}, measured)
    assert (tuned["gemm"].seconds, tuned["gemm"].implementation) == (5e-5, None)
    assert tuned["gemm"].library == LibraryTime("openblas.sgemm", 2e-4)
    assert session.library().times.measured == 0     # the file's time, never re-measured


def test_auto_without_the_extension_is_tvm_only_with_one_info_line(tmp_path, monkeypatch,
                                                                   caplog):
    import korch_tvm.library.extension as extension

    missing = (tmp_path / "korch_blas-x.o", tmp_path / "korch_blas-x.so")
    monkeypatch.setattr(extension, "blas_artifacts", lambda directory=None: missing)
    session, _ = _session(tmp_path)
    costs = {"gemm": KernelCost(1e-3, "measured", 1)}
    with caplog.at_level(logging.INFO, logger="korch_tvm"):
        assert session.with_library({"gemm": _gemm_module()}, costs) == costs
        assert session.with_library({"gemm": _gemm_module()}, costs) == costs
        assert session.library_costs({"gemm": _gemm_module()}) == {}
    lines = [r.getMessage() for r in caplog.records if "library" in r.getMessage().lower()]
    assert lines == ["BLAS library kernels unavailable: korch_blas-x.so is not built (run "
                     "`python -m korch_tvm.library.build`)"]


def test_library_kernel_names_are_the_partition_names_of_library_costs():
    from korch_tvm.backend.rewrite import library_kernel_names

    costs = {"a": KernelCost(1e-4, "measured", 1, implementation="openblas.sgemm"),
             "b": KernelCost(1e-4, "measured", 1)}
    assert library_kernel_names([None, "a", "b", "a"], costs) == ["korch_k1", "korch_k3"]


def test_a_time_is_the_least_of_its_rounds(tmp_path):
    call = TimedCall()
    rounds = iter([5e-3, 1e-4, 2e-3])
    call.measure = lambda repeats=7, preprocess="": next(rounds)
    assert LibraryTimes(str(tmp_path)).seconds(call) == (1e-4, True)


def test_a_spent_time_budget_measures_no_library_call(blas_extension, tmp_path, monkeypatch):
    import korch_tvm.costing.session as session_module
    from korch_tvm.config import KorchConfig
    from korch_tvm.costing.session import CostingSession
    from korch_tvm.costing.tuning_log import TuningLog

    call = TimedCall()
    assert LibraryTimes(str(tmp_path)).seconds(call, measure=False) is None and not call.calls
    config = KorchConfig(tuning_logs=str(tmp_path), time_budget=0.0)
    session = CostingSession(config, TuningLog(str(tmp_path), config.target), None,
                             str(tmp_path))
    predicted = {"gemm": KernelCost(1e-3, "predicted", 0)}
    monkeypatch.setattr(session_module, "measure_kernels", lambda *a, **k: predicted)
    assert session.measure({"gemm": _gemm_module()}) == predicted
    assert session.library().times.measured == 0


def test_a_matcher_that_raises_costs_the_kernel_its_library_form_not_the_compile(
        tmp_path, monkeypatch, caplog):
    import tvm
    from tvm import te

    from korch_tvm.costing import library_costs

    def broken(kernel_mod, device):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(library_costs, "implementations_for", broken)
    a = te.placeholder((4,), name="a")
    kernel = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4,), lambda i: a[i])])})
    library = library_costs.LibraryCosts(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="korch_tvm.library_costs"):
        assert library.implementation(kernel) is None
        costs = library.cheaper({"k": kernel}, {"k": KernelCost(1e-3, "measured", 1)})
    assert costs["k"] == KernelCost(1e-3, "measured", 1)
    [line] = [r.getMessage() for r in caplog.records]  # once per kernel, not per question
    assert "library matching failed (TypeError: unsupported operand)" in line
