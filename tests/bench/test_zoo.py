"""The model zoo's table and its aggregation (no model is built or compiled here: the builders
need the benchmark-model venv, and a bench run takes minutes)."""

import ast
import json
import os
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import run_zoo  # noqa: E402
from bench.zoo import registry  # noqa: E402


def test_the_zoo_covers_every_category_with_twenty_models():
    assert len(registry.ZOO) >= 20
    categories = {entry.category for entry in registry.ZOO}
    assert categories == {registry.CLASSIC, registry.DEPTHWISE, registry.CONVNEXT, registry.VIT,
                          registry.WINDOWED, registry.HYBRID, registry.TEXT, registry.DETECTION,
                          registry.SEGMENTATION}
    for entry in registry.ZOO:
        assert entry.inputs and entry.outputs, entry.name
        assert all(dim > 0 for spec in entry.inputs for dim in spec.shape), entry.name
        if entry.category == registry.TEXT:
            assert [(i.name, i.dtype) for i in entry.inputs] == [
                ("input_ids", "int64"), ("attention_mask", "int64")]
        else:
            assert all(spec.dtype == "float32" and spec.shape[-1] <= 320
                       for spec in entry.inputs), entry.name


def test_every_builder_the_table_names_exists():
    # builders.py imports torch, which the project venv lacks: read its function names instead.
    tree = ast.parse((REPO / "bench" / "zoo" / "builders.py").read_text())
    public = {node.name for node in tree.body
              if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}
    assert {entry.builder for entry in registry.ZOO} <= public


def test_failure_reason_keeps_the_cli_line_and_the_innermost_error(tmp_path):
    log = tmp_path / "m.log"
    log.write_text("[bench] compile stock (cold, trials 0) ...\n"
                   "korch-tvm: error: compile worker failed (exit 1):\n"
                   "  File \"x.py\", line 3, in <module>\n"
                   "ImportError: cannot import name 'y' from 'z'\n")
    reason = run_zoo.failure_reason(str(log), 1)
    assert reason == ("korch-tvm: error: compile worker failed (exit 1): <- "
                      "ImportError: cannot import name 'y' from 'z'")
    assert run_zoo.failure_reason(str(log), -9).startswith("killed by signal 9 <- ")
    log.write_text("")
    assert run_zoo.failure_reason(str(log), 3) == "exit 3 with no error line (see the log)"


def _bench_result(stock, korch, ort, openvino=None):
    def stats(values):
        ordered = sorted(values)
        return {"median": ordered[len(ordered) // 2], "p10": ordered[0], "p90": ordered[-1]}

    def ratio(base, new):
        return {"ratio": sorted(b / n for b, n in zip(base, new))[len(base) // 2],
                "p10": 0.9, "p90": 1.1, "verdict": "faster"}

    phase = {"compile_seconds": 30.0, "trials_run": 0,
             "verification": {"max_rel_error": 2e-6}}
    result = {
        "date": "2026-12-01 22:00:00 UTC", "threads": 2, "target_tag": "llvm-test-2c",
        "machine": {"cpu": "test cpu", "cores": 2}, "tvm_version": "0.27",
        "onnxruntime_version": "1.32.0",
        "latency_ms": {"stock": stats(stock), "korch": stats(korch),
                       "onnxruntime": stats(ort)},
        "ratios": {"korch_vs_stock": ratio(stock, korch),
                   "korch_vs_onnxruntime": ratio(ort, korch)},
        "compile": {"stock": {"cold": phase, "warm": phase}, "korch": {"cold": phase,
                                                                       "warm": phase}},
        "korch_plan": {"modelled_ms": 1.5, "kernels_chosen": 9},
        "load_before": 3.0, "load_after": 4.0, "zoo_code": {"source": "working tree at abc"},
    }
    if openvino:  # as korch-tvm bench writes it when OpenVINO is installed
        result["latency_ms"]["openvino"] = stats(openvino)
        result["ratios"]["korch_vs_openvino"] = ratio(openvino, korch)
        result["openvino"] = {"version": "2026.4", "settings": {"threads": 2}}
    return result


def test_aggregate_has_a_row_for_every_model_and_geomeans_only_what_ran(tmp_path):
    per_model = tmp_path / "zoo-0"
    per_model.mkdir()
    (per_model / "resnet18.json").write_text(json.dumps(
        _bench_result([4.0, 4.0, 4.0], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0])))
    unmeasured = _bench_result([8.0, 8.0, 8.0], [2.0, 2.0, 2.0], [4.0, 4.0, 4.0])
    unmeasured["korch_plan"]["modelled_ms"] = float("inf")
    # a --no-warm row: cold compiles only, verified afterwards by verify_kept.py
    for path in ("stock", "korch"):
        unmeasured["compile"][path] = {"cold": {"compile_seconds": 20.0, "trials_run": 0,
                                                "verification": None}}
    unmeasured["zoo_verification"] = {"korch": {"max_rel_error": 3e-7, "passed": True}}
    unmeasured["zoo_library"] = {"library_kernels": 2, "kernels": 9, "functions": ["k.gemm"]}
    (per_model / "deit_tiny.json").write_text(json.dumps(unmeasured))
    (per_model / "bert_2layer.failed.json").write_text(json.dumps(
        {"model": "bert_2layer", "reason": "korch-tvm: error: output 0 differs | a"}))
    manifest = {name: {"status": "ok"} for name in registry.BY_NAME}
    manifest["swin_tiny"] = {"status": "export failed", "reason": "RuntimeError: no export"}
    args = type("Args", (), {"out": str(tmp_path), "note": "load 3-4"})()

    summary = run_zoo.aggregate(str(per_model), 0, manifest, args)

    assert [row["model"] for row in summary["models"]] == [e.name for e in registry.ZOO]
    status = {row["model"]: row["status"] for row in summary["models"]}
    assert status["resnet18"] == status["deit_tiny"] == "ok"
    assert status["bert_2layer"] == "failed" and status["swin_tiny"] == "export failed"
    assert status["resnet50"] == "not run"
    assert summary["geomean"]["korch_vs_stock"] == pytest.approx((2.0 * 4.0) ** 0.5)
    assert summary["geomean"]["korch_vs_ort"] == pytest.approx((0.5 * 2.0) ** 0.5)
    assert summary["geomean"]["korch_vs_openvino"] == pytest.approx(1.5)  # one row timed it
    assert summary["versions"]["openvino"] == "2026.4"
    assert summary["modelled_within_20_percent"] == 0  # 0.75x and an infinite plan
    assert summary["counts"]["ok"] == 2 and summary["counts"]["failed"] == 1
    table = (tmp_path / "zoo-0.md").read_text()
    assert "| bert_2layer | BERT-style encoder | failed |" in table
    assert table.count("korch-tvm: error: output 0 differs \\| a |") == 1  # '|' escaped
    assert "RuntimeError: no export" in table
    assert "| resnet18 | classic CNN | ok | 30 / 30 (warm 30 / 30) | 4.00 | 2.00 | 1.00 | 3.00 | 2.00× (0.90–1.10) | 0.50× (0.90–1.10) | 1.50× (0.90–1.10) |" in table
    assert "| deit_tiny | ViT / DeiT attention | ok | 20 / 20 | 8.00 |" in table
    assert "| 3.0e-07 | 2 of 9 | 3.0 / 4.0 | |" in table
    deit = next(row for row in summary["models"] if row["model"] == "deit_tiny")
    assert deit["timed_libraries"] == "cold" and deit["verification_passed"] is True
    assert "each verified against ONNX Runtime in a fresh process" in table
    assert "- no model below 0.8x ONNX Runtime: **missed** (1 of 2 below (lowest 0.50x): " \
           "resnet18)" in table
    assert "- Korch >= 1.0x ONNX Runtime, geomean: **met** (1.00x)" in table
    assert "- Korch >= 0.9x OpenVINO, geomean: **met** (1.50x)" in table
    assert "Lowest Korch/ORT: resnet18 0.50×, deit_tiny 2.00×" in table
    assert "| 1.50 (0.75×) |" in table and "| inf (a cost was never measured) |" in table
    assert "within 20 % of its measured on 0 of 2" in table
    assert "load 3-4" in table and "shared 2-core machine" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(registry.ZOO)
    assert all(len(re.split(r"(?<!\\)\|", line)) == 18 for line in rows)  # 16 cells each
    assert json.loads((tmp_path / "zoo-0.json").read_text())["counts"]["not run"] == 20
    assert os.path.exists(tmp_path / "zoo-0.png") or not _has_matplotlib()


def test_a_tuned_pass_is_held_to_the_tuned_targets(tmp_path):
    """With a trial budget the table states the tuned targets (against OpenVINO) and the
    tuning each compile spent within its time budget."""
    per_model = tmp_path / "zoo-5000"
    per_model.mkdir()
    for name, openvino in (("resnet18", [2.4] * 3), ("deit_tiny", [1.6] * 3)):
        result = _bench_result([4.0] * 3, [2.0] * 3, [3.0] * 3, openvino)
        result["time_budget"] = 600.0
        result["compile"]["korch"]["cold"] = {**result["compile"]["korch"]["cold"],
                                              "stage_seconds": {"measurement": 95.0,
                                                                "tuning": 410.0}}
        (per_model / f"{name}.json").write_text(json.dumps(result))
    manifest = {name: {"status": "ok"} for name in registry.BY_NAME}
    args = type("Args", (), {"out": str(tmp_path), "note": ""})()

    summary = run_zoo.aggregate(str(per_model), 5000, manifest, args)

    assert summary["geomean"]["korch_vs_openvino"] == pytest.approx((1.2 * 0.8) ** 0.5)
    table = (tmp_path / "zoo-5000.md").read_text()
    assert "- Korch >= 1.15x OpenVINO, geomean: **missed** (0.98x, 15 % short)" in table
    assert "- no model below 0.9x OpenVINO: **missed** (1 of 2 below (lowest 0.80x): " \
           "deit_tiny)" in table
    assert "resnet18 505 (30) of 600" in table
    assert "not measured by a 0-trial pass" not in table


def test_category_order_runs_one_model_of_each_category_first():
    names = [entry.name for entry in registry.ZOO]
    ordered = run_zoo.by_category(names)
    assert sorted(ordered) == sorted(names)
    categories = len({entry.category for entry in registry.ZOO})
    first = [registry.BY_NAME[name].category for name in ordered[:categories]]
    assert len(set(first)) == categories
    assert ordered[0] == "resnet18" and ordered[categories] == "resnet50"
    assert run_zoo.by_category(["resnet50", "deit_tiny", "resnet18"]) == [
        "resnet18", "deit_tiny", "resnet50"]


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _onnx_model(path, op):
    """A one-node float32 model y = op(x), x of shape 2x3."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


def _library(model, path):
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    tvm.compile(from_onnx(model), target="llvm").export_library(str(path))
    return str(path)


def test_verify_kept_passes_the_right_library_and_fails_a_wrong_or_missing_one(tmp_path):
    sys.path.insert(0, str(REPO / "bench" / "zoo"))
    import verify_kept

    relu = _onnx_model(tmp_path / "relu.onnx", "Relu")
    right = _library(relu, tmp_path / "relu.so")
    wrong = _library(_onnx_model(tmp_path / "neg.onnx", "Neg"), tmp_path / "neg.so")
    out = tmp_path / "verification.json"

    code = verify_kept.main([str(tmp_path / "relu.onnx"), str(out), f"stock={right}"])
    assert code == 0
    assert json.loads(out.read_text())["stock"]["passed"] is True
    assert json.loads(out.read_text())["stock"]["max_rel_error"] == 0.0

    code = verify_kept.main([str(tmp_path / "relu.onnx"), str(out), f"stock={right}",
                             f"korch={wrong}", f"other={tmp_path / 'absent.so'}"])
    results = json.loads(out.read_text())
    assert code == 1
    assert results["stock"]["passed"] is True
    assert results["korch"]["passed"] is False and results["korch"]["max_rel_error"] > 0.5
    assert results["other"]["passed"] is False and "absent.so" in results["other"]["error"]


def test_a_timed_out_bench_ends_the_workers_it_started(tmp_path):
    import time

    pidfile = tmp_path / "worker.pid"
    command = ["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
    reason = run_zoo.run_logged(command, str(tmp_path / "m.log"), 1, "w")
    assert reason == "timed out after 1 s (see m.log)"
    worker = int(pidfile.read_text())
    for _ in range(40):  # the orphaned worker is killed, then reaped by init
        stat = pathlib.Path(f"/proc/{worker}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"worker {worker} still running after the timeout")
    assert run_zoo.run_logged(["bash", "-c", "echo 'Error: x'; exit 3"],
                              str(tmp_path / "e.log"), 5, "w") == "Error: x"


def test_the_benched_commit_gets_a_venv_of_its_own_that_sees_the_project_packages(tmp_path):
    import subprocess

    python = run_zoo.child_venv(str(tmp_path / "env"))
    probe = ("import sys, numpy, tvm_ffi; from korch_tvm.library.compile_extension import "
             "library_dir; print(sys.prefix); print(library_dir())")
    lines = subprocess.run([python, "-c", probe], check=True, capture_output=True,
                           text=True).stdout.split()
    assert lines == [str(tmp_path / "env"), str(tmp_path / "env" / "share" / "korch_tvm" /
                                                "library")]
    assert run_zoo.child_venv(str(tmp_path / "env")) == python  # made once, then reused


def test_the_noise_note_follows_the_recorded_load():
    from bench.zoo.report import noise_note

    quiet = [{"load": [0.8, 1.6]}, {"load": [1.1, None]}]
    assert noise_note(quiet).startswith("The machine was otherwise near idle (1-minute load "
                                        "average 0.8-1.6")
    shared = quiet + [{"load": [9.5, 4.0]}]
    assert noise_note(shared).startswith("Timings come from a shared 2-core machine")
    assert "0.8-9.5" in noise_note(shared) and "not recorded" in noise_note([{}])
