"""`korch-tvm logs`: merging log directories, the readable table, and `--check`'s refusals."""

import json
import os
import subprocess
import sys

import pytest

from korch_tvm.backend.target import host_cpu_name, parse_target, target_tag
from korch_tvm.costing.log_merge import merge_log_directory
from korch_tvm.costing.tuning_log import RECORD_FILE, TuningLog

sys.path.insert(0, os.path.dirname(__file__))
from test_tuning_log import small_kernels  # noqa: E402

TARGET = parse_target({"kind": "llvm", "mcpu": "generic", "num-cores": 2})


def with_pragma_import(line: str) -> str:
    """A record line of the log with `Annotate(<its first block>, "pragma_import_llvm", IR)`."""
    index, record = json.loads(line)
    block = record[0][0][0][3][0]
    record[0][0].append(["Annotate", [block, json.dumps("module asm \"x\"")],
                         ["pragma_import_llvm"], []])
    record[1] = [1e-7] * 3
    return json.dumps([index, record])


def source_log(root):
    """Three kernels with two records each, one refused record, one corrupt line, attempts."""
    kernels = small_kernels((16, 32))
    names = list(kernels)[:3]
    log = TuningLog(root, TARGET)
    for i, name in enumerate(names):
        log.commit_run(kernels[name], [1e-5 * (i + 1)] * 3)
        log.commit_run(kernels[name], [2e-5 * (i + 1)] * 3)
    log.add_tuning_attempts(kernels[names[0]], 32)
    path = os.path.join(log.directory, RECORD_FILE)
    first = open(path).read().splitlines()[0]
    with open(path, "a") as file:  # appended behind the log's back, as a shared file might be
        file.write(with_pragma_import(first) + "\n{not json\n")
    return kernels, names, log.directory


def test_merging_adds_each_record_once_and_leaves_refused_ones_behind(tmp_path):
    kernels, names, source = source_log(tmp_path / "source")
    source_before = {name: open(os.path.join(source, name), "rb").read()
                     for name in os.listdir(source)}
    destination_log = TuningLog(tmp_path / "destination", TARGET)
    destination_log.commit_run(kernels[names[0]], [1e-5] * 3)  # the same as the source's first
    destination_log.commit_run(kernels[names[0]], [5e-6] * 3)  # and one of its own
    destination = destination_log.directory

    counts = merge_log_directory(source, destination)
    assert counts == {"workloads_added": 2, "records_added": 5, "duplicates": 1, "refused": 1,
                      "corrupt": 1}
    merged = TuningLog(tmp_path / "destination", TARGET)
    assert [merged.record_count(kernels[name]) for name in names] == [3, 2, 2]
    assert merged.best_seconds(kernels[names[0]]) == pytest.approx(5e-6)
    assert merged.best_seconds(kernels[names[2]]) == pytest.approx(3e-5)
    assert merged.tuning_attempts(kernels[names[0]]) == 32
    text = open(os.path.join(destination, RECORD_FILE)).read()
    assert "pragma_import" not in text and not os.path.exists(
        os.path.join(destination, RECORD_FILE + ".rejected"))

    again = merge_log_directory(source, destination)
    assert again == {"workloads_added": 0, "records_added": 0, "duplicates": 6, "refused": 1,
                     "corrupt": 1}
    assert open(os.path.join(destination, RECORD_FILE)).read() == text
    assert TuningLog(tmp_path / "destination", TARGET).tuning_attempts(kernels[names[0]]) == 32
    # the source is only read
    assert {name: open(os.path.join(source, name), "rb").read()
            for name in os.listdir(source)} == source_before


def test_merging_into_a_new_directory_and_into_itself(tmp_path):
    from korch_tvm.errors import KorchError

    kernels, names, source = source_log(tmp_path / "source")
    destination = os.path.join(tmp_path, "fresh", target_tag(TARGET))
    counts = merge_log_directory(source, destination)
    assert counts["workloads_added"] == 3 and counts["records_added"] == 6
    assert TuningLog(tmp_path / "fresh", TARGET).record_count(kernels[names[1]]) == 2
    with pytest.raises(KorchError, match="into itself"):
        merge_log_directory(source, source)
    with pytest.raises(KorchError, match="is not a tuning-log directory"):
        merge_log_directory(str(tmp_path / "nothing"), destination)


def run_logs(capsys, *arguments) -> tuple[int, str, str]:
    from korch_tvm.tools.cli import main

    code = main(["logs", *map(str, arguments)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_stats_are_a_table_per_tag_and_json_on_request(tmp_path, capsys):
    kernels, names, source = source_log(tmp_path)
    code, out, _ = run_logs(capsys, tmp_path)
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["tag", "workloads", "records", "failed"]
    # 3 workloads, 6 records, none failed, 1 refused (the pragma one), none set aside yet,
    # none tuned beyond its default; best times 0.01, 0.02 and 0.03 ms
    assert row.split() == [target_tag(TARGET), "3", "6", "0", "1", "0", "0",
                           "0.01", "0.02", "0.03", "0.06"]
    code, out, _ = run_logs(capsys, tmp_path, "--json")
    stats = json.loads(out)[target_tag(TARGET)]
    assert (stats["records"], stats["refused_records"], stats["corrupt_lines"]) == (6, 1, 1)
    assert stats["best_seconds"]["median"] == pytest.approx(2e-5)


def test_check_sets_aside_refused_records_and_reports_them(tmp_path, capsys):
    kernels, names, source = source_log(tmp_path)
    code, out, err = run_logs(capsys, tmp_path, "--check", "--target",
                              json.dumps({"kind": "llvm", "mcpu": "generic", "num-cores": 2}))
    assert code == 0, err
    assert f"{target_tag(TARGET)}: 1 line(s) refused by the trace policy and set aside" in out
    assert "3 kernels checked; 0 wrong record(s) set aside" in out
    reasons = open(os.path.join(source, RECORD_FILE + ".rejected.reasons")).read()
    assert "pragma_import_llvm" in reasons
    code, out, _ = run_logs(capsys, tmp_path, "--json")
    stats = json.loads(out)[target_tag(TARGET)]
    assert (stats["refused_records"], stats["set_aside_records"]) == (0, 1)


def test_merge_from_the_command_line_twice(tmp_path, capsys):
    kernels, names, source = source_log(tmp_path / "source")
    destination = tmp_path / "destination"
    code, out, _ = run_logs(capsys, destination, "--merge", tmp_path / "source")
    assert code == 0
    assert out.strip() == (f"{target_tag(TARGET)}: 3 workload(s) and 6 record(s) added, "
                           "0 duplicate(s) skipped, 1 refused and 1 corrupt line(s) not copied")
    code, out, _ = run_logs(capsys, destination, "--merge", tmp_path / "source", "--json")
    assert json.loads(out)[target_tag(TARGET)]["duplicates"] == 6
    assert TuningLog(destination, TARGET).record_count(kernels[names[0]]) == 2
    # a CPU named on purpose, not this machine's (whose tag KORCH_TVM_CPU_TAG may replace)
    other = "znver4" if host_cpu_name() != "znver4" else "haswell"
    code, _, err = run_logs(capsys, destination, "--merge", tmp_path / "source", "--target",
                            json.dumps({"kind": "llvm", "mcpu": other, "num-cores": 2}))
    assert code == 2 and f"no tuning log llvm-{other}-2c in" in err
