"""The command line: errors are one line with a non-zero exit, never a traceback."""

import json
import subprocess
import sys

import pytest

from conftest import make_tiny_onnx
from test_weight_packing import conv_block_onnx


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "korch_tvm.tools.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def _assert_one_line_error(result, pattern):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("korch-tvm: error: ")
    assert pattern in lines[0], lines[0]


def test_missing_file(tmp_path):
    _assert_one_line_error(run_cli("compile", tmp_path / "nope.onnx"), "does not exist")


def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_text("definitely not protobuf " * 20)
    _assert_one_line_error(run_cli("compile", path), "model")


def test_truncated_onnx(tmp_path):
    data = make_tiny_onnx().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) * 2 // 3])
    _assert_one_line_error(run_cli("compile", path, "--korch"), "")


def test_bad_target_and_bad_shape(tmp_path):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(make_tiny_onnx().SerializeToString())
    _assert_one_line_error(run_cli("compile", path, "--target", "llvm -mcpu=x"), "target")
    result = run_cli("compile", path, "--input-shape", "x")
    assert result.returncode == 2 and "NAME:DIMS" in result.stderr
    _assert_one_line_error(run_cli("compile", path, "--trials", "8", "--trials-per-kernel", "4"),
                           "not both")
    _assert_one_line_error(run_cli("tune", path, "--tuning-logs", tmp_path / "logs",
                                   "--trials-per-kernel", "-1"), "--trials-per-kernel")


def test_help_documents_every_flag():
    result = run_cli("compile", "--help")
    assert result.returncode == 0
    for flag in ["--target", "--korch", "--tuning-logs", "--trials", "--trials-per-kernel",
                 "--time-budget", "-o",
                 "--report", "--no-verify", "--input-shape", "--rpc-tracker", "--threads",
                 "--layout", "--memory-limit"]:
        assert flag in result.stdout, flag


def _compile_conv_block(tmp_path, *flags):
    """Compile a small conv block with Korch and `flags`: (CLI result, report, model path)."""
    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_block_onnx(8, 10).SerializeToString())
    report_path = tmp_path / "report.json"
    result = run_cli("compile", path, "--korch", *flags, "--report", report_path)
    assert result.returncode == 0, result.stderr
    return result, json.loads(report_path.read_text()), path


def test_layout_flag_reaches_the_compile(tmp_path):
    result, report, path = _compile_conv_block(tmp_path, "--layout", "NHWC")
    assert "layout: NHWC" in result.stdout
    assert report["layout"] == "NHWC" and list(report["layouts"]) == ["NHWC"]
    assert report["verification"]["passed"]
    assert run_cli("compile", path, "--layout", "NCWH").returncode == 2


def test_memory_limit_flag_reaches_the_compile(tmp_path):
    result, report, path = _compile_conv_block(tmp_path, "--memory-limit", "none")
    assert report["memory_limit"] == "none"
    assert "0 piece(s) moved to FuseOps' groups" in result.stdout
    storage = report["plan"]["planned_storage_mb"]
    assert storage["korch"] > 0 and storage["stock"] > 0 and storage["pieces_on_stock_plan"] == 0
    assert run_cli("compile", path, "--memory-limit", "tight").returncode == 2
