"""Whole compiles: stock and Korch paths, the shipped logs, re-runs, the README's pipeline."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS, REPO, host_has_shipped_logs, make_tiny_onnx
from korch_tvm import KorchConfig, compile_model
from korch_tvm.orchestration.memory_plan import STORAGE_SLACK
from korch_tvm.report.text import summary_lines

SHIPPED_LOGS = REPO / "tuning_logs"


@pytest.fixture
def shipped_logs(tmp_path):
    """A private copy of the shipped logs, so tests never write into the repository's."""
    copy = tmp_path / "tuning_logs"
    shutil.copytree(SHIPPED_LOGS, copy)
    return copy


def test_stock_compile_tunes_and_matches_onnxruntime(tmp_path):
    model = make_tiny_onnx(rows=32, cols=64)
    _, report = compile_model(model, korch=False, tuning_logs=str(tmp_path), trials=8)
    assert report["verification"]["reference"] == "onnxruntime"
    assert report["verification"]["max_rel_error"] <= 1e-4
    assert 0 < report["tuning"]["trials_run"] <= 8 + 2   # a MetaSchedule batch may overshoot
    _, again = compile_model(model, korch=False, tuning_logs=str(tmp_path), trials=8)
    assert again["tuning"]["trials_run"] == 0
    assert again["tuning"]["from_log"] == again["tuning"]["kernels"]


def test_korch_second_compile_runs_zero_trials_and_gives_the_same_plan(tmp_path):
    """After a compile that tuned, the second may measure a few kernels (CI: 2 once; see
    docs/tuning-logs.md) but tunes nothing, and from then on the log is settled: the third
    compile measures nothing and plans as the second did."""
    model = make_tiny_onnx(rows=32, cols=64)
    _, first = compile_model(model, korch=True, tuning_logs=str(tmp_path), trials=8)
    _, second = compile_model(model, korch=True, tuning_logs=str(tmp_path), trials=8)
    _, third = compile_model(model, korch=True, tuning_logs=str(tmp_path), trials=8)
    assert first["tuning"]["trials_run"] > 0
    assert second["tuning"]["trials_run"] == 0 and second["tuning"]["measured"] <= 4
    assert third["tuning"]["trials_run"] == 0 and third["tuning"]["measured"] == 0
    assert second["plan"]["kernels"] == third["plan"]["kernels"]       # deterministic
    assert second["plan"]["modelled_ms"] == third["plan"]["modelled_ms"]
    for report in (first, second):
        assert report["verification"]["max_rel_error"] <= 1e-4
        assert report["plan"]["solver_status"] == "optimal"


@pytest.mark.skipif(not host_has_shipped_logs(),
                    reason="the shipped logs are for another CPU (their tag differs from this one)")
@pytest.mark.parametrize("name", ["bert_layer.onnx", "segformer_block.onnx"])
def test_korch_on_bundled_models_from_shipped_logs(name, shipped_logs):
    _, report = compile_model(str(MODELS / name), korch=True, tuning_logs=str(shipped_logs))
    assert report["verification"]["reference"] == "onnxruntime"
    assert report["verification"]["max_rel_error"] <= 1e-4
    tuning = report["tuning"]
    assert tuning["trials_run"] == 0 and tuning["measured"] == 0, tuning   # logs are complete
    plan = report["plan"]
    assert plan["solver_status"] == "optimal"
    # the FuseOps plan is one feasible answer, so the optimum can only be cheaper
    assert plan["modelled_ms"] <= plan["stock_modelled_ms"] * (1 + 1e-9)
    storage = plan["planned_storage_mb"]  # and it needs no more activation storage
    assert storage["korch"] <= storage["stock"] * (1 + STORAGE_SLACK)
    assert report["kernels_scheduled_from_log"].split("/")[0] != "0"


def test_readme_pipeline_example_runs_as_written(tmp_path):
    example = (REPO / "examples" / "korch_pass_pipeline.py").read_text()
    readme = (REPO / "README.md").read_text()
    assert example.split('"""', 2)[2].strip() in readme    # the README shows exactly this code
    (tmp_path / "models").mkdir()
    shutil.copy(MODELS / "bert_layer.onnx", tmp_path / "models")
    result = subprocess.run([sys.executable, str(REPO / "examples" / "korch_pass_pipeline.py")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "(1, 64, 256)"
    assert sorted(os.listdir(tmp_path)) == ["models"]  # its records went to the user cache
    assert (pathlib.Path(os.environ["KORCH_TVM_CACHE_DIR"]) / "tuning_logs").is_dir()


def test_cli_compile_writes_library_and_report(tmp_path, shipped_logs):
    out, report_path = tmp_path / "model.so", tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "korch_tvm.tools.cli", "compile", str(MODELS / "bert_layer.onnx"),
         "--korch", "--tuning-logs", str(shipped_logs), "-o", str(out), "--report",
         str(report_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert re.search(r"verification vs onnxruntime: ok", result.stdout)
    report = json.loads(report_path.read_text())
    assert report["output"] == str(out) and out.stat().st_size > 0
    import numpy as np
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out)), tvm.cpu())
    x = np.zeros((1, 64, 256), "float32")
    assert vm["main"](tvm.runtime.tensor(x)).numpy().shape == (1, 64, 256)


def test_tune_fills_the_log_so_compile_does_no_work(tmp_path):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(make_tiny_onnx(rows=16, cols=48).SerializeToString())
    logs = tmp_path / "logs"
    result = subprocess.run([sys.executable, "-m", "korch_tvm.tools.cli", "tune", str(path),
    "--korch",
                             "--tuning-logs", str(logs), "--trials", "4"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("tuned tiny.onnx")
    assert not list(tmp_path.glob("*.so"))                      # nothing was built
    _, report = compile_model(str(path), korch=True, tuning_logs=str(logs), trials=4)
    assert report["tuning"]["trials_run"] == 0 and report["tuning"]["measured"] == 0
    # every kernel is either in the log or was never chosen by a plan (so never measured)
    tuning = report["tuning"]
    assert tuning["from_log"] + tuning["predicted"] == tuning["kernels"] and tuning["from_log"] > 0


def test_lazy_costing_measures_less_and_plans_as_well_as_costing_everything(tmp_path):
    model = make_tiny_onnx(rows=32, cols=64)

    def korch(logs, margin):
        config = KorchConfig(prune_margin=margin)
        return compile_model(model, korch=True, tuning_logs=str(logs), config=config,
                             verify=False)[1]

    full = korch(tmp_path / "a", float("inf"))
    assert full["tuning"]["predicted"] == 0 and full["plan"]["pruned"] == 0  # all costed
    lazy = korch(tmp_path / "b", 0.5)
    assert 0 < lazy["tuning"]["measured"] < full["tuning"]["measured"]
    # on the very same measurements, the lazy plan is within 3 % of the fully costed one
    same_log = korch(tmp_path / "a", 0.5)
    assert same_log["tuning"]["measured"] == 0
    assert same_log["plan"]["modelled_ms"] <= full["plan"]["modelled_ms"] * 1.03
    print(f"measured {lazy['tuning']['measured']} of {full['tuning']['measured']} kernels")


@pytest.mark.parametrize("korch", [False, True])
def test_trials_per_kernel_scales_the_budget_with_the_kernels_tuned(tmp_path, korch):
    model = make_tiny_onnx(rows=32, cols=64)
    config = KorchConfig(trials_per_kernel=4)
    _, report = compile_model(model, korch=korch, tuning_logs=str(tmp_path), config=config,
                              verify=False)
    tuning = report["tuning"]
    # 4 per kernel of the plan, split by latency share (heavy kernels get more than 4, the
    # lightest may get none), so more than one kernel's 4 in all; MetaSchedule may run fewer
    # than asked (a small kernel's search space runs out, a candidate that fails to build
    # leaves no record) and a batch may overshoot by a couple per kernel
    assert tuning["tuned"] >= 2 and tuning["trials_run"] > 4
    assert tuning["trials_run"] <= 4 * tuning["kernels"] + 2 * tuning["tuned"]
    assert f"trials run {tuning['trials_run']} of budget 4 per kernel" in "\n".join(
        summary_lines(report))
    _, again = compile_model(model, korch=korch, tuning_logs=str(tmp_path), config=config,
                             verify=False)
    assert again["tuning"]["trials_run"] == 0


def test_cli_records_go_to_the_user_cache_and_never_into_the_repository(tmp_path, monkeypatch):
    """`korch-tvm compile` without --tuning-logs keeps its records in the user cache; the
    shipped logs are a read-only seed (of another tag: at most predictions and starting
    points, whatever this CPU's ISA), never written."""
    from korch_tvm.backend.target import parse_target, target_tag
    from korch_tvm.tools.cli import main

    model = tmp_path / "tiny.onnx"
    model.write_bytes(make_tiny_onnx(rows=16, cols=32).SerializeToString())
    monkeypatch.setenv("KORCH_TVM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KORCH_TVM_SEED_LOGS", str(SHIPPED_LOGS))
    monkeypatch.setenv("KORCH_TVM_CPU_TAG", "h4-unshipped-cpu")  # a CPU without shipped logs
    shipped = sorted((path.name, path.stat().st_size, path.stat().st_mtime_ns)
                     for path in SHIPPED_LOGS.rglob("*"))
    assert main(["compile", str(model), "--korch", "-q", "--no-verify"]) == 0
    tag = target_tag(parse_target("llvm"))
    assert tag.startswith("llvm-h4-unshipped-cpu-")
    assert (tmp_path / "cache" / "tuning_logs" / tag / "database_tuning_record.json").stat() \
        .st_size > 0
    assert sorted((path.name, path.stat().st_size, path.stat().st_mtime_ns)
                  for path in SHIPPED_LOGS.rglob("*")) == shipped
    assert main(["compile", str(model), "--korch", "-q", "--no-verify",
                 "--tuning-logs", ""]) == 0          # '' keeps nothing
    assert len(list((tmp_path / "cache" / "tuning_logs").iterdir())) == 1
