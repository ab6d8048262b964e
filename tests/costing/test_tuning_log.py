"""The tuning log: reuse, corrupt lines, concurrent writers, and stock MetaSchedule compatibility."""

import errno
import logging
import math
import os
import subprocess
import sys
import textwrap

import pytest
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from korch_tvm.backend.target import parse_target, target_tag
from korch_tvm.costing.log_stats import log_stats
from korch_tvm.costing.tuning_log import RECORD_FILE, WORKLOAD_FILE, TuningLog

TARGET = parse_target({"kind": "llvm", "mcpu": "generic", "num-cores": 2})


def small_kernels(sizes=(16, 32, 48)) -> dict[str, tvm.IRModule]:
    """One standalone `main` PrimFunc per (op, size): the unit the profiler tunes."""
    kernels = {}
    for size in sizes:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((size, size), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                e = bb.emit(relax.op.exp(x))
                s = bb.emit(relax.op.sum(e, axis=[1]))
                out = bb.emit_output(s)
            bb.emit_func_output(out)
        mod = relax.transform.LegalizeOps()(bb.get())
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc):
                kernels[f"{gv.name_hint}_{size}"] = tvm.IRModule(
                    {"main": func.with_attr("global_symbol", "main")}
                )
    return kernels


def test_records_survive_reopen_and_stock_database_reads_them(tmp_path):
    kernels = small_kernels()
    log = TuningLog(tmp_path, TARGET)
    assert log.directory == os.path.join(tmp_path, target_tag(TARGET))
    for i, (name, mod) in enumerate(kernels.items()):
        assert not log.has_record(mod) and log.best_seconds(mod) is None
        log.commit_run(mod, [1e-5 * (i + 1), 3e-5 * (i + 1)])
        log.commit_run(mod, [1e-6 * (i + 1)])
    log.commit_run(kernels["sum_16"], None)  # a failure does not hide the good records

    again = TuningLog(tmp_path, TARGET)
    for i, mod in enumerate(kernels.values()):
        assert again.record_count(mod) == (3 if mod is kernels["sum_16"] else 2)
        assert again.best_seconds(mod) == pytest.approx(1e-6 * (i + 1), rel=1e-5)
    assert len(again.kernels()) == 6

    stock = ms.database.JSONDatabase(work_dir=again.directory)
    assert len(stock.get_all_tuning_records()) == 13
    position = list(kernels).index("sum_32")
    best = stock.query_tuning_record(kernels["sum_32"], TARGET, "main")
    assert float(best.run_secs[0]) == pytest.approx(1e-6 * (position + 1), rel=1e-5)
    # ... and the MetaSchedule database view answers the same way
    assert again.best_record(kernels["sum_32"]) is not None
    assert len(again.database) == 13

    stats = log_stats(tmp_path)[target_tag(TARGET)]
    assert stats["workloads"] == 6 and stats["records"] == 13 and stats["failed_records"] == 1
    assert stats["warm_timed_records"] == 12  # one or two samples each: the old protocol
    assert stats["best_seconds"]["min"] == pytest.approx(1e-6, rel=1e-5)


def test_default_times_of_many_kernels_catch_up_with_the_files_once(tmp_path, monkeypatch):
    """A seed's calibration looks up every kernel of a log: one look at the files for all of
    them, not one each, with the answers `default_seconds` gives one by one (the first
    successful record; inf when every run failed; None when the log does not hold it)."""
    kernels = list(small_kernels().values())
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels[0], None)
    log.commit_run(kernels[0], [2e-5])  # a retried kernel: its first successful run counts
    log.commit_run(kernels[0], [1e-5])
    log.commit_run(kernels[1], None)
    log.commit_run(kernels[2], [3e-5])
    other = TuningLog(tmp_path, TARGET)
    other.commit_run(kernels[3], [4e-5])  # another writer: seen on catching up
    one_by_one = [log.default_seconds(kernel) for kernel in kernels]
    assert one_by_one[0] == pytest.approx(2e-5, rel=1e-5) and math.isinf(one_by_one[1])
    assert one_by_one[3] == pytest.approx(4e-5, rel=1e-5) and one_by_one[4:] == [None, None]
    looks = []
    original = TuningLog.refresh
    monkeypatch.setattr(TuningLog, "refresh", lambda self: looks.append(1) or original(self))
    assert log.default_seconds_of(kernels) == one_by_one and len(looks) == 1


def test_failed_only_kernel_costs_infinity(tmp_path):
    mod = small_kernels((16,))["sum_16"]
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(mod, None)
    assert log.has_record(mod) and math.isinf(TuningLog(tmp_path, TARGET).best_seconds(mod))


def test_corrupt_lines_are_set_aside_and_good_records_kept(tmp_path, caplog):
    kernels = small_kernels()
    log = TuningLog(tmp_path, TARGET)
    for i, mod in enumerate(kernels.values()):
        log.commit_run(mod, [1e-5 * (i + 1)])
    workload_path = os.path.join(log.directory, WORKLOAD_FILE)
    record_path = os.path.join(log.directory, RECORD_FILE)
    workload_lines = open(workload_path, "rb").read().splitlines()
    record_lines = open(record_path, "rb").read().splitlines()
    # garble workload line 2 (in the middle: its records must go, the others keep numbering),
    # add garbage to the records, and truncate the last record mid-line as a crash would
    workload_lines[1] = b'["123","not base64 at all"]'
    open(workload_path, "wb").write(b"\n".join(workload_lines) + b"\n")
    damaged = record_lines[:-1] + [b"{oops", record_lines[-1][: len(record_lines[-1]) // 2]]
    open(record_path, "wb").write(b"\n".join(damaged))

    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        reopened = TuningLog(tmp_path, TARGET)
    corrupt = sum("a corrupt line" in r.message for r in caplog.records)
    assert corrupt == 4  # 1 workload + 3 records
    names = list(kernels)
    for i, name in enumerate(names):
        expected = None if i in (1, len(names) - 1) else pytest.approx(1e-5 * (i + 1), rel=1e-5)
        assert reopened.best_seconds(kernels[name]) == expected, name
    # the bad bytes are kept aside, verbatim
    corrupt_records = open(record_path + ".corrupt", "rb").read().splitlines()
    assert b"{oops" in corrupt_records and len(corrupt_records) == 3
    assert b"not base64" in open(workload_path + ".corrupt", "rb").read()
    # the cleaned directory is valid for stock MetaSchedule and for new appends
    reopened.commit_run(kernels[names[1]], [7e-6])
    stock = ms.database.JSONDatabase(work_dir=reopened.directory)
    assert len(stock.get_all_tuning_records()) == len(names) - 2 + 1
    assert TuningLog(tmp_path, TARGET).best_seconds(kernels[names[1]]) == pytest.approx(7e-6)


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from test_tuning_log import small_kernels, TARGET
    from korch_tvm.costing.tuning_log import TuningLog
    kernels = list(small_kernels((16, 32)).values())
    log = TuningLog({root!r}, TARGET)
    open({ready!r} + str(os.getpid()), "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.01)
    writer = int(sys.argv[1])
    for i in range(30):
        log.commit_run(kernels[i % len(kernels)], [1e-6 * (1 + writer) * (1 + i)])
    """
)


def test_records_are_read_only_when_used_and_an_unappliable_one_is_set_aside(tmp_path, caplog,
                                                                            monkeypatch):
    """Opening a log checks each record's JSON but replays no trace (slow, per record). A record
    sets a cost only once its trace applies to its kernel: a fake faster record that does not
    apply never becomes the best time; it is set aside once, with its reason, and a later log
    neither sees nor warns about it."""
    import json

    from korch_tvm.costing import tuning_log

    mod = small_kernels((16,))["sum_16"]
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(mod, [3e-4])
    log.commit_run(mod, [2e-4])
    record_path = os.path.join(log.directory, RECORD_FILE)
    lines = open(record_path).read().splitlines()
    fake = json.loads(lines[1])
    assert fake[1][0][0][0][:1] == ["GetSBlock"]
    fake[1][0][0][0][2][0] = "no_such_block"  # allowed, but names no block of this kernel
    fake[1][1] = [1e-4]  # 0.1 ms: would undercut the real best, 0.2 ms
    open(record_path, "w").write(lines[0] + "\n" + lines[1] + "\n" + json.dumps(fake) + "\n")

    reads = []
    real_from_json = tuning_log.TuningRecord.from_json
    monkeypatch.setattr(tuning_log.TuningRecord, "from_json",
                        staticmethod(lambda *args: reads.append(1) or real_from_json(*args)))
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        reopened = TuningLog(tmp_path, TARGET)
        assert reads == [] and reopened.record_count(mod) == 3
        assert reopened.best_seconds(mod) == pytest.approx(2e-4)  # not the fake's 1e-4
    assert len(reads) == 2 and reopened.record_count(mod) == 2
    assert reopened.best_record(mod) is not None and reopened.kernels()[0].best_seconds == \
        pytest.approx(2e-4)
    assert open(record_path + ".rejected").read() == json.dumps(fake) + "\n"
    reasons = open(record_path + ".rejected.reasons").read().splitlines()
    assert len(reasons) == 1 and "does not apply to its kernel" in reasons[0]
    assert caplog.text.count("record line 3 does not apply to its kernel") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        again = TuningLog(tmp_path, TARGET)
        assert again.best_seconds(mod) == pytest.approx(2e-4) and again.record_count(mod) == 2
    assert "set aside" not in caplog.text and "does not apply" not in caplog.text


def test_a_record_this_log_wrote_is_not_replayed_and_reads_back_the_same(tmp_path, monkeypatch):
    """A record the compile itself built and measured needs no replay to be trusted (12 ms a
    record, thousands a cold compile); another log reading the file replays it once and finds
    the same schedule."""
    from korch_tvm.costing import tuning_log

    mod = small_kernels((16,))["sum_16"]
    reads = []
    real_from_json = tuning_log.TuningRecord.from_json
    monkeypatch.setattr(tuning_log.TuningRecord, "from_json",
                        staticmethod(lambda *args: reads.append(1) or real_from_json(*args)))
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(mod, [3e-4])
    log.commit_run(mod, [2e-4])
    assert log.default_seconds(mod) == pytest.approx(3e-4) and log.best_seconds(mod) == \
        pytest.approx(2e-4)
    written = log.best_record(mod)
    assert reads == [] and float(written.run_secs[0]) == pytest.approx(2e-4)
    reopened = TuningLog(tmp_path, TARGET)
    read = reopened.best_record(mod)
    assert reads == [1] and float(read.run_secs[0]) == pytest.approx(2e-4)
    assert str(read.trace.as_json()) == str(written.trace.as_json())


def test_a_record_costs_the_median_of_its_samples_and_implausible_times_are_refused(tmp_path):
    """One stalled sample of three must not set the cost (the mean would make it dozens of
    times the others); a time below 10 ns is no measurement and is refused."""
    kernels = small_kernels((16,))
    mod, other = kernels["sum_16"], kernels["tir_exp_16"]
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(mod, [2.79e-3, 1.5e-5, 1.5e-5])
    assert log.best_seconds(mod) == pytest.approx(1.5e-5)
    log.commit_run(other, [2e-5] * 3)
    record_path = os.path.join(log.directory, RECORD_FILE)
    with open(record_path) as file:
        line = file.read().splitlines()[-1]
    with open(record_path, "a") as file:
        file.write(line.replace("2e-05", "1e-09") + "\n")
    reopened = TuningLog(tmp_path, TARGET)
    assert reopened.best_seconds(other) == pytest.approx(2e-5) and reopened.record_count(other) == 1
    assert "below any kernel" in open(record_path + ".rejected.reasons").read()
    assert log_stats(tmp_path)[target_tag(TARGET)]["best_seconds"]["min"] == pytest.approx(1.5e-5)


def test_a_failed_write_leaves_no_partial_line_and_names_the_file(tmp_path, monkeypatch):
    from korch_tvm.errors import EnvironmentFault

    kernels = small_kernels((16,))
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels["sum_16"], [2e-5] * 3)
    record_path = os.path.join(log.directory, RECORD_FILE)
    before = open(record_path, "rb").read()
    real_write = os.write

    def short_then_full(fd, data):  # half the line reaches the disk, then the disk is full
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_full)
    with pytest.raises(EnvironmentFault) as info:
        log.commit_run(kernels["sum_16"], [1e-5] * 3)
    monkeypatch.undo()
    assert str(info.value) == f"cannot write the tuning log {record_path}: No space left on device"
    assert open(record_path, "rb").read() == before
    assert TuningLog(tmp_path, TARGET).record_count(kernels["sum_16"]) == 1


def test_a_log_file_that_is_a_directory_or_unreadable_is_one_line_naming_it(tmp_path,
                                                                           monkeypatch):
    from korch_tvm.errors import EnvironmentFault, KorchError

    directory = tmp_path / target_tag(TARGET)
    (directory / RECORD_FILE).mkdir(parents=True)
    with pytest.raises(KorchError) as info:
        TuningLog(tmp_path, TARGET)
    assert str(info.value) == (f"tuning log {directory / RECORD_FILE} is a directory; move it "
                               "away to start afresh")
    os.rmdir(directory / RECORD_FILE)
    TuningLog(tmp_path, TARGET).commit_run(small_kernels((16,))["sum_16"], [2e-5] * 3)
    real_open = open

    def unreadable(path, *args, **kwargs):
        if str(path).endswith(WORKLOAD_FILE) and args[:1] == ("rb",):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", unreadable)
    with pytest.raises(EnvironmentFault) as info:
        TuningLog(tmp_path, TARGET)
    assert str(info.value) == (f"cannot read the tuning log {directory / WORKLOAD_FILE}: "
                               "Permission denied")


def mean_of(record) -> float:
    return sum(float(t) for t in record.run_secs) / len(record.run_secs)


def test_two_processes_write_one_log(tmp_path):
    root, go = str(tmp_path / "logs"), str(tmp_path / "go")
    script = _WRITER.format(tests=os.path.dirname(__file__), root=root,
                            ready=str(tmp_path / "ready"), go=go)
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    writers = [subprocess.Popen([sys.executable, "-c", script, str(w)], env=env) for w in (0, 1)]
    while len([p for p in os.listdir(tmp_path) if p.startswith("ready")]) < 2:
        assert all(w.poll() is None for w in writers), "a writer died before starting"
    open(go, "w").close()
    assert [w.wait(timeout=120) for w in writers] == [0, 0]

    log = TuningLog(root, TARGET)
    kernels = list(small_kernels((16, 32)).values())
    assert sum(log.record_count(k) for k in kernels) == 60
    for i, kernel in enumerate(kernels):  # writer 0's first record of kernel i is the fastest
        assert log.best_seconds(kernel) == pytest.approx(1e-6 * (1 + i), rel=1e-5)
    stock = ms.database.JSONDatabase(work_dir=log.directory)
    assert len(stock.get_all_tuning_records()) == 60
    assert not os.path.exists(os.path.join(log.directory, RECORD_FILE + ".corrupt"))


def test_read_only_directory_falls_back_to_memory(tmp_path, caplog, monkeypatch):
    mod = small_kernels((16,))["sum_16"]
    TuningLog(tmp_path, TARGET).commit_run(mod, [2e-6])
    directory = os.path.join(tmp_path, target_tag(TARGET))
    os.chmod(directory, 0o555)
    for name in os.listdir(directory):
        os.chmod(os.path.join(directory, name), 0o444)
    try:
        with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
            with monkeypatch.context() as patch:
                if os.geteuid() == 0:  # root ignores permissions: make the check fail as EROFS
                    def refuse(*args, **kwargs):
                        raise OSError(errno.EROFS, "Read-only file system")
                    patch.setattr(os, "makedirs", refuse)
                log = TuningLog(tmp_path, TARGET)
        assert not log.writable and any("read-only" in r.message for r in caplog.records)
        assert log.best_seconds(mod) == pytest.approx(2e-6)
        other = small_kernels((32,))["sum_32"]
        log.commit_run(other, [3e-6])  # kept in memory, not written
        assert log.best_seconds(other) == pytest.approx(3e-6)
        assert TuningLog(tmp_path, TARGET).best_seconds(other) is None
    finally:
        os.chmod(directory, 0o755)


def test_tuning_attempts_add_up_across_writers_and_warn_once_per_corrupt_line(tmp_path, caplog):
    kernels = list(small_kernels().values())
    first, second = TuningLog(tmp_path, TARGET), TuningLog(tmp_path, TARGET)
    first.add_tuning_attempts(kernels[0], 32)   # creates the attempts file
    assert first.tuning_attempts(kernels[0]) == 32 and first.tuning_attempts(kernels[1]) == 0
    second.add_tuning_attempts(kernels[0], 16)  # another writer, appended after the first read
    second.add_tuning_attempts(kernels[1], 8)
    with open(os.path.join(first.directory, "tuning_attempts.json"), "ab") as handle:
        handle.write(b"not json\n")
    with caplog.at_level(logging.WARNING, logger="korch_tvm"):
        assert first.tuning_attempts(kernels[0]) == 48
        assert first.tuning_attempts(kernels[1]) == 8
        assert TuningLog(tmp_path, TARGET).tuning_attempts(kernels[0]) == 48
    # read once by each of the two logs that looked, not once per lookup
    assert caplog.text.count("tuning_attempts.json line 4 is corrupt") == 2


def test_records_timed_with_warm_caches_are_counted_and_reported(tmp_path, caplog):
    """A CPU record with fewer than three samples was timed the old way (three calls after one
    cache flush); opening such a log says so, since those records read faster than new ones."""
    from korch_tvm.costing.metaschedule_setup import SAMPLES

    kernels = list(small_kernels(sizes=(16,)).values())
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels[0], [2e-6] * SAMPLES)
    log.commit_run(kernels[1], None)  # a failure is no timing
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        assert TuningLog(tmp_path, TARGET).warm_timed_records() == 0
    assert not caplog.records
    log.commit_run(kernels[1], [1e-6])  # one sample: the protocol before 2026-12-01
    log.commit_run(kernels[0], [1e-6, 1e-6])
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        again = TuningLog(tmp_path, TARGET)
        assert again.warm_timed_records() == 2
        again.refresh()
    assert caplog.text.count("2 of 4 records were timed") == 1 and "afresh" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        TuningLog(tmp_path, TARGET)  # said once per log opened (a compile opens one), not
    assert caplog.text.count("2 of 4 records were timed") == 1  # once per process


def test_lines_are_judged_once_per_verdicts_object(tmp_path, monkeypatch):
    """Each log judges its lines through its `verdicts`: logs sharing one (a process's
    compiles, through their sessions) judge a line once; a log of its own judges it again."""
    from korch_tvm.costing import log_lines
    from korch_tvm.costing.log_lines import LineVerdicts

    log = TuningLog(tmp_path, TARGET)
    for index, kernel in enumerate(small_kernels(sizes=(16,)).values()):
        log.commit_run(kernel, [1e-5 * (index + 1)] * 3)
    judged = []
    real = log_lines.check_workload
    monkeypatch.setattr(log_lines, "check_workload", lambda value: judged.append(1) or real(value))
    shared = LineVerdicts()
    first = TuningLog(tmp_path, TARGET, verdicts=shared)
    assert len(judged) == 2 and len(shared) == 2 + 2  # two workload lines, two record lines
    assert TuningLog(tmp_path, TARGET, verdicts=shared).best_seconds(kernel) == \
        first.best_seconds(kernel) == pytest.approx(2e-5)
    assert len(judged) == 2  # the same lines, judged already
    TuningLog(tmp_path, TARGET)
    TuningLog(tmp_path, TARGET)
    assert len(judged) == 2 + 2 + 2  # each log of its own judges them again


def test_a_log_file_linked_outside_its_directory_is_refused(tmp_path):
    from korch_tvm.errors import KorchError

    directory = tmp_path / "logs" / target_tag(TARGET)
    directory.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_text("")
    os.symlink(outside, directory / RECORD_FILE)
    with pytest.raises(KorchError, match="outside"):
        TuningLog(tmp_path / "logs", TARGET).commit_run(small_kernels((16,))["sum_16"], [2e-5])
    assert outside.read_text() == ""


def test_a_write_that_fails_inside_metaschedule_is_raised_as_a_fault_at_the_next_lookup(
        tmp_path, monkeypatch):
    """MetaSchedule turns every error of a database callback into a RuntimeError; the log
    keeps the fault and raises it, as what it was, at the next lookup."""
    from korch_tvm.errors import EnvironmentFault

    mod = small_kernels((16,))["sum_16"]
    log = TuningLog(tmp_path, TARGET)
    workload = log.database.commit_workload(mod)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    record = ms.database.TuningRecord(tvm.s_tir.Schedule(mod).trace, workload, [2e-5] * 3,
                                      TARGET, args)
    with pytest.raises(Exception) as info:
        log.database.commit_tuning_record(record)
    assert not isinstance(info.value, EnvironmentFault)  # what TVM let through
    monkeypatch.undo()
    with pytest.raises(EnvironmentFault, match="cannot write the tuning log .*No space left"):
        log.best_seconds(mod)
    assert log.best_seconds(mod) is None  # raised once; the log stays usable
