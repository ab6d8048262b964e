"""The profiler: real (tiny) tuning, reuse, broken kernels, time budget, RPC on loopback."""

import logging
import math
import os
import time

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T
from tvm.support.popen_pool import PopenWorker

from korch_tvm.backend.schedule_variants import default_schedules
from korch_tvm.backend.target import parse_target
from korch_tvm.costing.measure import (FAILED_ATTEMPTS_KEPT, KernelCost, profile_kernels,
                                       rpc_runner, tune_kernels, tuned_trials)
from korch_tvm.costing.pooled_builder import PooledBuilder
from korch_tvm.costing.tuning_log import TuningLog

TARGET = parse_target({"kind": "llvm", "num-cores": 2})


def legalized_kernels(size: int = 32) -> dict[str, tvm.IRModule]:
    """matmul and add of `size`x`size` matrices, each a standalone `main` PrimFunc."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((size, size), "float32"))
    w = relax.Var("w", relax.TensorType((size, size), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            m = bb.emit(relax.op.matmul(x, w))
            out = bb.emit_output(bb.emit(relax.op.add(m, w)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return {gv.name_hint: tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
            for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@T.prim_func(s_tir=True)
def _calls_missing_symbol(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            B[vi] = T.call_extern("float32", "korch_no_such_symbol", A[vi])


BROKEN = tvm.IRModule({"main": _calls_missing_symbol.with_attr("global_symbol", "main")})


def test_tiny_tuning_then_rerun_does_zero_trials(tmp_path, capfd, caplog):
    kernels = legalized_kernels()
    log = TuningLog(tmp_path, TARGET)
    start = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="korch_tvm.metaschedule"):
        costs = profile_kernels(kernels, TARGET, log, trials=8, progress=False)
    first_run = time.perf_counter() - start
    assert set(costs) == {"matmul", "add"}
    # the budget is split by default-schedule time; the matmul is the slower kernel
    assert costs["matmul"].source == "tuned" and 0 < costs["matmul"].seconds < 0.1
    assert 4 <= costs["matmul"].trials
    assert sum(c.trials for c in costs.values() if c.source == "tuned") <= 8 + 2  # batch overshoot
    for name, cost in costs.items():
        assert cost.seconds == log.best_seconds(kernels[name])
    # MetaSchedule's chatter went to the korch_tvm.metaschedule logger, not to the terminal
    assert any(r.name == "korch_tvm.metaschedule" for r in caplog.records)
    captured = capfd.readouterr()
    assert "TaskScheduler" not in captured.out + captured.err
    assert "Sending" not in captured.out + captured.err

    again = profile_kernels(kernels, TARGET, TuningLog(tmp_path, TARGET), trials=8, progress=False)
    assert all(c.source == "log" and c.trials == 0 for c in again.values())
    assert {n: c.seconds for n, c in again.items()} == {n: c.seconds for n, c in costs.items()}
    print(f"tuning: {sum(c.trials for c in costs.values())} trials in {first_run:.1f}s")


def test_a_kernel_its_schedules_fail_on_fails_alone(tmp_path, monkeypatch):
    """An error while scheduling one kernel (once: ill-formed TIR from a register tile's
    write-back) failed every kernel of its group of 64: 125 of SegFormer-b0's kernels went
    unmeasured for one bad one. Now only that kernel fails, with the error."""
    from korch_tvm.costing import default_measurement

    kernels = legalized_kernels(16)
    real = default_measurement.named_default_schedules

    def failing_on_matmul(kernel_mod, target, forms=None):
        if kernel_mod is kernels["matmul"]:
            raise tvm.error.InternalError("TIR is ill-formed: buffer x is used")
        return real(kernel_mod, target, forms=forms)

    monkeypatch.setattr(default_measurement, "named_default_schedules", failing_on_matmul)
    costs = profile_kernels(kernels, TARGET, TuningLog(tmp_path, TARGET), trials=0,
                            progress=False)
    assert costs["matmul"].source == "failed"
    assert costs["matmul"].error.startswith("not scheduled: TIR is ill-formed")
    others = [name for name in kernels if name != "matmul"]
    assert others and all(costs[name].source == "measured" for name in others)


def test_broken_kernel_is_costed_as_failed_and_never_crashes(tmp_path, caplog):
    """A kernel that cannot run keeps source "failed" and its error, priced at its prediction
    (costing/failed_costs.py), never infinity."""
    kernels = {"broken": BROKEN, "add": legalized_kernels(16)["add"]}
    log = TuningLog(tmp_path, TARGET)
    with caplog.at_level(logging.WARNING, logger="korch_tvm.profiler"):
        costs = profile_kernels(kernels, TARGET, log, trials=0, progress=False)
    assert costs["broken"].source == "failed" and math.isfinite(costs["broken"].seconds)
    assert costs["broken"].seconds > 0
    assert "run failed" in costs["broken"].error
    assert any("broken" in r.getMessage() for r in caplog.records)
    assert costs["add"].source == "measured" and math.isfinite(costs["add"].seconds)
    # one failure may be a fluke: the next run measures it again. (A kernel that calls a
    # function by name is refused when a log is read, trace_policy.py, so the retries are
    # shown on a kernel the log keeps, whose runs failed.)
    kernel = legalized_kernels(16)["matmul"]
    failing = TuningLog(tmp_path / "failing", TARGET)
    failing.commit_run(kernel, None)
    assert FAILED_ATTEMPTS_KEPT == 2
    retried = profile_kernels({"matmul": kernel}, TARGET, failing, trials=0, progress=False)
    assert retried["matmul"].source == "measured"  # it ran this time
    failing = TuningLog(tmp_path / "settled", TARGET)
    for _ in range(FAILED_ATTEMPTS_KEPT):
        failing.commit_run(kernel, None)
    # then it is settled: a further run, even one asked to tune, does no work for it
    again = profile_kernels({"matmul": kernel}, TARGET, TuningLog(tmp_path / "settled", TARGET),
                            trials=4, progress=False)
    settled = again["matmul"]
    assert (settled.source, settled.trials, settled.error) == \
        ("failed", 0, "every logged measurement failed")
    assert math.isfinite(settled.seconds) and settled.seconds > 0
    assert TuningLog(tmp_path / "settled", TARGET).record_count(kernel) == 2


def test_a_retried_kernel_that_succeeds_keeps_its_measured_default(tmp_path):
    kernel = legalized_kernels(16)["add"]
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernel, None)  # an earlier run failed (say, a busy machine)
    costs = profile_kernels({"add": kernel}, TARGET, log, trials=0, progress=False)
    assert costs["add"].source == "measured" and math.isfinite(costs["add"].seconds)
    assert log.default_seconds(kernel) == pytest.approx(costs["add"].seconds)


def test_zero_trials_measures_default_schedule_once(tmp_path, capsys):
    kernels = legalized_kernels(16)
    kernels["add_again"] = kernels["add"]  # structurally identical: measured once, shared
    log = TuningLog(tmp_path, TARGET)
    costs = profile_kernels(kernels, TARGET, log, trials=0, progress=True)
    assert [c.source for c in costs.values()] == ["measured"] * 3
    assert all(c.trials == 1 and 0 < c.seconds < 0.1 for c in costs.values())
    assert costs["add_again"] is costs["add"]
    # a first run that looked stalled is measured again at once (one more record and tick)
    rechecked = sum(costs[name].rechecked for name in ("add", "matmul"))
    assert f"kernels {2 + rechecked}/{2 + rechecked}" in capsys.readouterr().err
    # recorded as tuning records stock MetaSchedule can use: one per default schedule (these
    # small kernels have no variants), the fastest first
    stock = ms.database.JSONDatabase(work_dir=log.directory)
    schedules = sum(len(default_schedules(kernels[name], TARGET)) for name in ("add", "matmul"))
    assert schedules == 2
    assert len(stock.get_all_tuning_records()) in (schedules + rechecked,  # both runs kept
                                                   schedules)  # or the stalled one set aside
    if not costs["matmul"].rechecked:
        assert log.default_seconds(kernels["matmul"]) == pytest.approx(costs["matmul"].seconds)
    record = stock.query_tuning_record(kernels["matmul"], TARGET, "main")
    samples = [float(s) for s in record.run_secs]
    assert len(samples) == 3  # three cold calls, timed one by one
    assert np.median(samples) == pytest.approx(costs["matmul"].seconds, rel=1e-5)
    again = profile_kernels(kernels, TARGET, TuningLog(tmp_path, TARGET), trials=0, progress=False)
    assert all(c.source == "log" and c.trials == 0 for c in again.values())


def split_trace(kernel: tvm.IRModule, factor: int):
    """A schedule of its own: the first loop split by `factor`."""
    schedule = tvm.s_tir.Schedule(kernel)
    block = schedule.get_child_blocks(schedule.get_sblock("root"))[0]
    schedule.split(schedule.get_loops(block)[0], [None, factor])
    return schedule.trace


def test_a_large_kernel_keeps_its_fastest_default_schedule_and_no_trials_are_counted(tmp_path):
    """A 256x256 matmul has five default schedules (four where the CPU's registers hold no
    taller tile than the rule's, AVX2): all are logged, the fastest first, its cost is the
    fastest's, and none of them counts as a tuning trial."""
    kernel = legalized_kernels(256)["matmul"]
    log = TuningLog(tmp_path, TARGET)
    cost = profile_kernels({"matmul": kernel}, TARGET, log, trials=0, progress=False)["matmul"]
    times = [float(np.median([float(s) for s in record.run_secs]))
             for record in log.database.get_all_tuning_records()]
    forms = len(default_schedules(kernel, TARGET))
    assert len(times) == forms and forms >= 4
    assert cost.seconds == pytest.approx(min(times), rel=1e-5) == pytest.approx(times[0], rel=1e-5)
    assert log.default_seconds(kernel) == pytest.approx(cost.seconds, rel=1e-5)
    assert tuned_trials(log, kernel) == 0
    for record in log.database.get_all_tuning_records():  # a second compile sharing the log
        log.commit_run(kernel, [float(s) for s in record.run_secs], trace=record.trace)
    assert log.record_count(kernel) == 2 * forms and tuned_trials(log, kernel) == 0  # the same
    for factor in (4, 8):  # two records tuned by a korch_tvm that kept no count
        log.commit_run(kernel, [1e-3] * 3, trace=split_trace(kernel, factor))
    assert tuned_trials(log, kernel) == 2
    log.add_tuning_attempts(kernel, 8)  # a round asked 8 trials: the count rules
    assert tuned_trials(log, kernel) == 8


def test_exhausted_time_budget_gives_predictions(tmp_path):
    kernels = legalized_kernels(16)
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels["add"], [3e-6])  # already known: still served from the log
    fixed = {"matmul": 4.5e-5}

    def stand_in(kernel_mod):
        assert tvm_ffi.structural_equal(kernel_mod, kernels["matmul"])
        return fixed["matmul"]

    costs = profile_kernels(kernels, TARGET, log, trials=100, time_budget=0.0,
                            predictor=stand_in, progress=False)
    assert costs["matmul"] == KernelCost(4.5e-5, "predicted", 0)
    assert costs["add"] == KernelCost(pytest.approx(3e-6), "log", 0)
    assert not log.has_record(kernels["matmul"])  # predictions never enter the log
    # without a trained model the default predictor is the analytic roofline
    default = profile_kernels(kernels, TARGET, log, trials=0, time_budget=0.0, progress=False)
    assert default["matmul"].source == "predicted" and 1e-7 < default["matmul"].seconds < 1e-3


@pytest.fixture
def rpc_tracker_with_two_servers():
    from tvm import rpc
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=19190, port_end=19290, silent=True)
    servers = [Server(host="127.0.0.1", port=19300, port_end=19400, key="korch-test",
                      tracker_addr=("127.0.0.1", tracker.port), silent=True) for _ in range(2)]
    session = rpc.connect_tracker("127.0.0.1", tracker.port)
    for _ in range(100):  # wait until both servers registered
        summary = session.summary()
        if sum(q.get("free", 0) for k, q in summary["queue_info"].items() if k == "korch-test") >= 2:
            break
        time.sleep(0.1)
    yield tracker
    for server in servers:
        server.terminate()
    tracker.terminate()


def test_rpc_loopback_matches_local_runner(tmp_path, rpc_tracker_with_two_servers):
    tracker = rpc_tracker_with_two_servers
    kernels = {"matmul": legalized_kernels(16)["matmul"]}  # one kernel keeps this test short
    local_log = TuningLog(tmp_path / "local", TARGET)
    local = profile_kernels(kernels, TARGET, local_log, trials=0, progress=False)
    remote_log = TuningLog(tmp_path / "rpc", TARGET)
    runner = rpc_runner("127.0.0.1", tracker.port, "korch-test", max_workers=2)
    remote = profile_kernels(kernels, TARGET, remote_log, trials=4, runner=runner, progress=False)
    assert all(c.source == "tuned" and math.isfinite(c.seconds) for c in remote.values())
    assert all(remote_log.record_count(kernels[name]) >= 2 for name in kernels)
    # the same workloads were recorded, each time a real run of a microsecond kernel (no ratio
    # of the two: one scheduler slice on a busy 2-core machine is a thousand times its time)
    assert {k.kernel.script() for k in remote_log.kernels()} == \
        {k.kernel.script() for k in local_log.kernels()}
    for name in kernels:
        assert 0 < remote[name].seconds < 0.1 and 0 < local[name].seconds < 0.1


def test_trials_go_where_the_time_goes():
    from korch_tvm.costing.measure import allocate_trials

    shares = {"conv": 6.0, "matmul": 3.0, "add": 0.5, "relu": 0.5}
    allocation = allocate_trials(shares, 64)
    assert allocation == {"conv": 36 + 4, "matmul": 16, "add": 4, "relu": 4}   # 4 left: by rank
    assert sum(allocation.values()) == 64
    assert allocate_trials(shares, 3) == {name: 0 for name in shares}     # below one task's worth
    assert allocate_trials({"a": 1.0, "b": 1.0}, 4) == {"a": 4, "b": 0}    # ties by name
    assert allocate_trials({"a": float("inf"), "b": 1.0}, 8) == {"a": 0, "b": 8}


def test_a_kernel_whose_search_runs_out_is_not_searched_again(tmp_path):
    """A tiny elementwise kernel has only a few distinct schedules: MetaSchedule returns far
    fewer records than the trials asked. The trials asked still count, so a re-run tunes
    nothing (it used to search again on every compile)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, x)))
        bb.emit_func_output(out)
    legal = relax.transform.LegalizeOps()(bb.get())
    kernel = next(tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
                  for _, f in legal.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernel, [1e-6])   # its default-schedule measurement
    first = tune_kernels({"add": kernel}, {"add": 32}, TARGET, log, progress=False)
    records = log.record_count(kernel)
    assert first["add"].source == "tuned" and 1 + first["add"].trials == records
    assert records - 1 < 32 // 2, records   # the search ran out well short of the budget
    assert log.tuning_attempts(kernel) == 32
    again = TuningLog(tmp_path, TARGET)
    assert tune_kernels({"add": kernel}, {"add": 32}, TARGET, again, progress=False) == {}
    assert again.record_count(kernel) == records


def test_tuning_stopped_by_the_time_budget_says_what_is_left(tmp_path, caplog):
    kernels = legalized_kernels(16)
    log = TuningLog(tmp_path, TARGET)
    with caplog.at_level("WARNING", logger="korch_tvm.profiler"):
        tuned = tune_kernels(kernels, dict.fromkeys(kernels, 64), TARGET, log, time_budget=0.0,
                             progress=False)
    assert tuned == {} and log.tuning_attempts(kernels["matmul"]) == 0
    assert f"time budget reached: {len(kernels)} kernel(s) keep their default schedule" \
        in caplog.text


def test_pooled_builder_keeps_its_workers_between_builds(monkeypatch):
    """Costing builds in many small calls; the workers start once, not once per call."""
    started = []
    original = PopenWorker._start
    monkeypatch.setattr(PopenWorker, "_start", lambda self: started.append(1) or original(self))
    inputs = [ms.builder.BuilderInput(mod, TARGET) for mod in legalized_kernels().values()]
    with PooledBuilder(TARGET, max_workers=2) as builder:
        for _ in range(3):
            results = builder.build(inputs)
            assert [r.error_msg for r in results] == [None, None]
            assert all(os.path.exists(r.artifact_path) for r in results)
    assert 1 <= len(started) <= 2


def test_pooled_builder_reports_a_build_past_its_time_out():
    with PooledBuilder(TARGET, max_workers=1, timeout_sec=1e-3) as builder:
        (result,) = builder.build([ms.builder.BuilderInput(legalized_kernels()["matmul"], TARGET)])
    assert result.artifact_path is None and "timed out" in result.error_msg


def test_trials_the_log_holds_count_toward_the_budget():
    """The budget is what the plan's kernels hold in all. The other path tuned `conv` with 40
    trials: the 16 left go, by share, to the kernels still to tune. A compile whose tuning made
    the solver choose new kernels has spent its budget: the same budget runs nothing more, a
    larger one tunes them."""
    from korch_tvm.costing.measure import allocate_new_trials, allocate_trials

    shares = {"conv": 6.0, "matmul": 3.0, "add": 0.5, "relu": 0.5, "tiny": 0.01}
    first = allocate_trials(shares, 56)
    assert first == {"conv": 32, "matmul": 16, "add": 4, "relu": 4, "tiny": 0}
    assert allocate_new_trials(shares, 56, lambda name: 0) == first
    held = {"conv": 40}
    after_other = allocate_new_trials(shares, 56, lambda name: held.get(name, 0))
    assert after_other == {"conv": 0, "matmul": 12, "add": 4, "relu": 0, "tiny": 0}
    # conv held 16 (half its worth): covered, and the others are owed less than is left
    assert allocate_new_trials(shares, 56, lambda name: 16 if name == "conv" else 0) == \
        {**first, "conv": 0}
    # tuned to `first`, then a re-solve swapped `add` (4 trials, now among the model's other
    # kernels) for `fresh`: nothing more at this budget
    tuned = {**first, "fresh": 0}
    swapped = {**{k: v for k, v in shares.items() if k != "add"}, "fresh": 0.6}
    assert not any(allocate_new_trials(swapped, 56, tuned.__getitem__, others=4).values())
    assert allocate_new_trials(swapped, 56, tuned.__getitem__)["fresh"] == 4   # add uncounted
    larger = allocate_new_trials(swapped, 112, tuned.__getitem__, others=4)
    assert larger["fresh"] > 0 and larger["conv"] > 32
    assert sum(larger[k] - tuned[k] for k in larger if larger[k]) <= 112 - sum(tuned.values())


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_moves_per_measurement_with_an_eta_from_the_measurements_so_far():
    import io

    from korch_tvm.costing.measure import _Progress

    clock, stream = FakeClock(), io.StringIO()
    bar = _Progress(10, True, stream=stream, clock=clock)
    bar.skip(4, "log")  # answered by the log: no work, no rate yet
    assert bar.eta_seconds() is None
    assert stream.getvalue().endswith("[korch] log      kernels 4/10  elapsed 0.0s  ETA -- ")
    clock.now += 3.0
    bar.tick(1, "measure")  # one measurement took 3 s; 5 are left
    assert bar.eta_seconds() == pytest.approx(15.0)
    clock.now += 3.0
    bar.tick(1)
    assert bar.line() == "[korch] measure  kernels 6/10  elapsed 6.0s  ETA 12.0s"
    clock.now += 200.0
    bar.tick(1)
    assert bar.line() == "[korch] measure  kernels 7/10  elapsed 3m26s  ETA 3m26s"  # 206 s / 3 x 3
    assert "nan" not in stream.getvalue() and stream.getvalue().count("\r") == 4
    trials = _Progress(64, True, unit="trials", stream=io.StringIO(), clock=clock)
    trials.tick(16, "tune", kernels=1)
    assert trials.line() == "[korch] tune     trials 16/64  kernels 1  elapsed 0.0s  ETA 0.0s"


def test_progress_is_silent_off_a_terminal_unless_asked():
    import io

    from korch_tvm.costing.measure import _Progress

    quiet = io.StringIO()
    bar = _Progress(2, None, stream=quiet)  # a StringIO is no terminal
    bar.tick(1, "measure")
    bar.close()
    assert quiet.getvalue() == "" and not bar.enabled
    asked = io.StringIO()
    _Progress(2, True, stream=asked).tick(1, "measure")
    assert "kernels 1/2" in asked.getvalue()


def test_an_implausible_logged_time_is_measured_again_before_it_is_used(tmp_path, caplog,
                                                                        monkeypatch):
    """A 16x16 add logged at 100000x its time (a stalled run) is measured again: the cost comes
    from the new measurement and the stalled record is set aside. A time measured twice is
    trusted, however slow. The stall is far beyond what a busy machine makes of a
    re-measurement (one under three concurrent loads took 836x), so load cannot fail this."""
    from korch_tvm.costing import measure

    STALL = 100_000
    kernel = legalized_kernels(16)["add"]
    log = TuningLog(tmp_path / "a", TARGET)
    real = profile_kernels({"add": kernel}, TARGET, log, trials=0, progress=False)["add"]
    # Only a stall is implausible here, whatever load the floor and the prediction see now.
    judged = measure.implausible
    monkeypatch.setattr(measure, "implausible", lambda log_, kernel_mod, seconds, *rest:
                        seconds >= STALL / 2 * real.seconds
                        and judged(log_, kernel_mod, seconds, *rest))
    stalled = TuningLog(tmp_path / "b", TARGET)
    stalled.commit_run(kernel, [real.seconds * STALL] * 3,
                       trace=log.best_record(kernel).trace)
    with caplog.at_level(logging.WARNING, logger="korch_tvm.profiler"):
        cost = profile_kernels({"add": kernel}, TARGET, stalled, trials=0, progress=False)["add"]
    assert cost.rechecked and cost.source == "measured"
    assert cost.seconds < real.seconds * STALL / 2  # the re-measurement, not the stalled run
    assert cost.seconds == stalled.best_seconds(kernel) and stalled.record_count(kernel) == 1
    assert "implausible for its size and was measured again" in caplog.text
    again = profile_kernels({"add": kernel}, TARGET, TuningLog(tmp_path / "b", TARGET),
                            trials=0, progress=False)["add"]
    assert again.source == "log" and not again.rechecked
    confirmed = TuningLog(tmp_path / "c", TARGET)
    for _ in range(2):
        confirmed.commit_run(kernel, [real.seconds * STALL] * 3,
                             trace=log.best_record(kernel).trace)
    slow = profile_kernels({"add": kernel}, TARGET, confirmed, trials=0, progress=False)["add"]
    assert slow.source == "log" and slow.seconds == pytest.approx(real.seconds * STALL)


def test_a_fresh_measurement_judged_implausible_is_measured_again_at_once(tmp_path, monkeypatch):
    """A first measurement that looks stalled is re-measured by the same compile, so the next
    compile of the kernel measures nothing (CI once saw a 16x16 kernel logged at 1000x its time,
    and the second compile of a test then measured it again)."""
    from korch_tvm.costing import measure

    kernel = legalized_kernels(16)["add"]
    judged = []  # the first judgement (of the fresh measurement) says "stalled"
    monkeypatch.setattr(measure, "implausible",
                        lambda *args: judged.append(args[2]) or len(judged) == 1)
    log = TuningLog(tmp_path, TARGET)
    cost = profile_kernels({"add": kernel}, TARGET, log, trials=0, progress=False)["add"]
    assert cost.rechecked and cost.source == "measured" and math.isfinite(cost.seconds)
    assert len(judged) == 1
    again = profile_kernels({"add": kernel}, TARGET, TuningLog(tmp_path, TARGET), trials=0,
                            progress=False)["add"]
    assert again.source == "log" and not again.rechecked and len(judged) == 2


def test_kernels_are_measured_only_once_this_process_s_pool_is_idle(tmp_path, monkeypatch):
    """Every runner batch first waits out the spin of this process's TVM threads."""
    from korch_tvm.costing import default_measurement

    events = []
    monkeypatch.setattr(default_measurement, "wait_for_idle_pool",
                        lambda: events.append("wait") or 0.0)

    class Recording:
        def __init__(self, runner):
            self.runner = runner

        def run(self, inputs):
            events.append("run")
            return self.runner.run(inputs)

    from korch_tvm.costing.runners import local_runner

    costs = profile_kernels(legalized_kernels(16), TARGET, TuningLog(tmp_path, TARGET), trials=0,
                            runner=Recording(local_runner(TARGET)), progress=False)
    assert all(cost.source == "measured" for cost in costs.values())
    assert events.count("run") >= 1 and events == ["wait", "run"] * events.count("run")


def test_a_search_that_leaves_a_never_measured_kernel_without_records_costs_it_failed(
        tmp_path, monkeypatch):
    """A kernel costed at its library time alone has no record; a search that then logs none
    leaves TVM without a time for it: failed (the library's time replaces it), never None."""
    import korch_tvm.costing.measure as profiler
    from korch_tvm.costing.kernel_costs import LibraryTime, cheaper_of

    monkeypatch.setattr(profiler, "_tune_group", lambda names, *args: {})
    kernel = legalized_kernels(8)["add"]
    log = TuningLog(str(tmp_path), TARGET)
    (cost,) = tune_kernels({"add": kernel}, {"add": 16}, TARGET, log, progress=False).values()
    assert (cost.seconds, cost.source, cost.error) == (math.inf, "failed",
                                                       "tuning left no record")
    library = LibraryTime("openblas.sgemm", 2e-5)
    assert cheaper_of(cost, library).seconds == 2e-5


def test_kernels_of_one_contraction_measure_only_the_form_that_won_on_the_first(tmp_path):
    """Every form is measured on the first kernel of a contraction; a kernel fusing the same
    contraction (here with a ReLU) has only the rule's form and that winner measured, in the
    same call or, through the caller's `form_choices`, a later one."""
    from test_schedule_variants import matmul_kernel

    from korch_tvm.backend.schedule_variants import RULE_FORM, variant_anchor
    from korch_tvm.costing.measure import measure_kernels

    kernels = {"matmul": matmul_kernel(256, 256, 256),
               "matmul_relu": matmul_kernel(256, 256, 256, relu=True)}
    anchor = variant_anchor(kernels["matmul"])
    log, choices = TuningLog(tmp_path / "one", TARGET), {}
    costs = measure_kernels(kernels, TARGET, log, progress=False, form_choices=choices)
    assert all(cost.source == "measured" for cost in costs.values())
    assert list(choices) == [anchor] and choices[anchor] in ("packed", "wide", "outer", "pair",
                                                         "outer_pair")
    assert log.record_count(kernels["matmul"]) == len(default_schedules(kernels["matmul"], TARGET))
    assert log.record_count(kernels["matmul_relu"]) == (1 if choices[anchor] == RULE_FORM else 2)

    later = TuningLog(tmp_path / "two", TARGET)  # a later call, the choice made: "outer"
    measure_kernels(kernels, TARGET, later, progress=False, form_choices={anchor: "outer"})
    assert [later.record_count(kernel) for kernel in kernels.values()] == [2, 2]
