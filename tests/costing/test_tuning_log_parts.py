"""The tuning log's parts on their own: line checks, the directory's writes, loading and syncing.

`test_tuning_log.py` tests them together, through `TuningLog`; these pin each module's own
contract, with lines taken from a real log and then damaged by hand.
"""

import json
import math
import os

import pytest

from korch_tvm.costing import tuning_log
from korch_tvm.costing.log_files import (REASONS_SUFFIX, RECORD_FILE, REJECTED_SUFFIX,
                                         WORKLOAD_FILE, LogDirectory)
from korch_tvm.costing.log_lines import (LineVerdicts, _parse_record, check_times,
                                         record_refusal, record_seconds)
from korch_tvm.costing.log_reading import load_table, sync_table
from korch_tvm.costing.log_table import _Table
from korch_tvm.costing.trace_policy import Refused
from korch_tvm.errors import EnvironmentFault
from test_tuning_log import TARGET, small_kernels


def _real_lines(tmp_path) -> tuple[list[bytes], list[bytes]]:
    """Workload and record lines of a real log: two kernels, one record each."""
    log = tuning_log.TuningLog(tmp_path / "source", TARGET)
    for seconds, mod in zip((2e-5, 3e-5), list(small_kernels((16,)).values())):
        log.commit_run(mod, [seconds] * 3)
    read = LogDirectory(log.directory).read
    return read(WORKLOAD_FILE).splitlines(), read(RECORD_FILE).splitlines()


def _with_index(record_line: bytes, workload_line: int) -> bytes:
    """The record line, naming another workload line."""
    return b"[%d,%s]" % (workload_line, record_line[record_line.index(b",") + 1:-1])


def test_a_record_time_is_the_median_and_impossible_times_are_refused():
    assert record_seconds([3e-3, 1e-3, 2e-3]) == 2e-3
    assert record_seconds(None) == math.inf and record_seconds([1e10, 1e10]) == math.inf
    with pytest.raises(Refused, match="not all positive and finite"):
        check_times([1e-5, 0.0])
    with pytest.raises(Refused, match=r"its time 1e-09 s is below any kernel's \(1e-08 s\)"):
        check_times([1e-9] * 3)
    check_times(None)  # a failure's record has no samples to judge


def test_record_refusal_tells_malformed_from_refused(tmp_path):
    _, records = _real_lines(tmp_path)
    record = json.loads(records[0])[1]
    assert record_refusal(record) is None
    assert "below any kernel" in record_refusal([record[0], [1e-12], *record[2:]])
    with pytest.raises(ValueError, match="not a list of numbers"):
        record_refusal([record[0], [True], *record[2:]])
    with pytest.raises(ValueError, match=r"not a \[trace, run_secs, target, args_info\]"):
        record_refusal(record[:3])


def test_a_record_of_a_refused_or_missing_workload_is_not_parsed(tmp_path):
    _, records = _real_lines(tmp_path)
    table = _Table()
    table.refused_workloads.add(0)
    with pytest.raises(Refused, match=r"its workload \(line 1\) was refused"):
        _parse_record(records[0], table, LineVerdicts())
    with pytest.raises(ValueError, match="workload index 1 is missing or corrupt"):
        _parse_record(records[1], table, LineVerdicts())


def test_loading_keeps_every_line_number_and_sets_bad_lines_aside(tmp_path):
    workloads, records = _real_lines(tmp_path)
    files = LogDirectory(str(tmp_path / "damaged"))
    # workload line 2 corrupt, so the second kernel moves to line 3; one record names the
    # corrupt line, one is timed impossibly fast, and the last is cut short by a crash
    files.write_whole(WORKLOAD_FILE, b"\n".join([workloads[0], b"{oops", workloads[1]]) + b"\n")
    fast = records[0].replace(b"2e-05", b"1e-12")
    kept = [records[0], _with_index(records[1], 2)]
    files.write_whole(RECORD_FILE, b"\n".join(
        [kept[0], _with_index(records[1], 1), fast, kept[1], records[0][:40]]))

    table = load_table(files, LineVerdicts())
    assert sorted(table.workloads) == [0, 1, 2] and table.canonical == {0: 0, 1: 0, 2: 2}
    assert files.read(WORKLOAD_FILE).splitlines() == [workloads[0], workloads[0], workloads[1]]
    assert files.read(RECORD_FILE).splitlines() == kept
    assert [run.seconds for line in (0, 2) for run in table.records[line]] == [2e-5, 3e-5]
    assert table.record_lines == 2 and table.record_bytes == len(files.read(RECORD_FILE))
    assert files.read(WORKLOAD_FILE + ".corrupt") == b"{oops\n"
    assert files.read(RECORD_FILE + ".corrupt").splitlines() == [
        _with_index(records[1], 1), records[0][:40]]
    assert files.read(RECORD_FILE + REJECTED_SUFFIX) == fast + b"\n"
    reason = files.read(RECORD_FILE + REASONS_SUFFIX).decode()
    assert reason.startswith("record line 3: its time 1e-12 s is below any kernel's")


def test_sync_reads_appended_lines_and_reloads_a_replaced_file(tmp_path):
    workloads, records = _real_lines(tmp_path)
    files = LogDirectory(str(tmp_path / "shared"))
    files.write_whole(WORKLOAD_FILE, b"\n".join(workloads) + b"\n")
    files.write_whole(RECORD_FILE, records[0] + b"\n")
    verdicts = LineVerdicts()
    table = load_table(files, verdicts)
    files.append(RECORD_FILE, records[1] + b"\n")  # another process's write
    assert sync_table(files, table, verdicts) is table and table.size() == 2

    files.replace(RECORD_FILE, [records[1]])  # another process set a record aside
    reloaded = sync_table(files, table, verdicts)
    assert reloaded is not table and reloaded.size() == 1 and list(reloaded.records) == [1]


def test_a_short_write_is_cut_back_and_names_the_file(tmp_path, monkeypatch):
    files = LogDirectory(str(tmp_path / "log"))
    files.write_whole(RECORD_FILE, b"[0,[]]\n")
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:3]))
    with pytest.raises(EnvironmentFault) as info:
        files.write_whole(RECORD_FILE, b"[1,[]]\n")
    monkeypatch.undo()
    assert str(info.value) == (f"cannot write the tuning log {files.path(RECORD_FILE)}: "
                               "short write, 3 of 7 bytes")
    assert files.read(RECORD_FILE) == b"[0,[]]\n"


def test_the_former_name_of_record_seconds_is_gone():
    assert not hasattr(tuning_log, "mean_seconds")
    assert tuning_log.TuningLog.__module__ == "korch_tvm.costing.tuning_log"
