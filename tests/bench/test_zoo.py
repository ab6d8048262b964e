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
    assert "| resnet18 | classic CNN | ok | 30 / 30 (warm 30 / 30) | 4.00 | 2.00 | 1.00 | 3.00 | 2.00× | 0.50× | 1.50× |" in table
    assert "| 1.50 (0.75×) |" in table and "| inf (a cost was never measured) |" in table
    assert "within 20 % of its measured on 0 of 2" in table
    assert "load 3-4" in table and "shared 2-core machine" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(registry.ZOO)
    assert all(len(re.split(r"(?<!\\)\|", line)) == 17 for line in rows)  # 15 cells each
    assert json.loads((tmp_path / "zoo-0.json").read_text())["counts"]["not run"] == 20
    assert os.path.exists(tmp_path / "zoo-0.png") or not _has_matplotlib()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
