"""Faults of the machine and of the input, as a user meets them: one line, the right exit code
(1 the machine, 2 the input, 3 our bug), and before the long compile wherever they can be."""

import errno
import signal
import subprocess
import sys
import time

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import make_tiny_onnx
from korch_tvm.errors import EnvironmentFault, KorchError
from korch_tvm.support import safe_io
from korch_tvm.tools import cli

UNWRITABLE = "/sys"  # refuses new files even to root (sysfs)


def run_main(capsys, *args):
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    return code, lines, captured.out


def _no_compile(monkeypatch):
    """Make a compile fail loudly, to prove an error came before it."""
    import korch_tvm.pipeline.compile as compile_module

    def compile_model(*args, **kwargs):
        raise AssertionError("the compile started")

    monkeypatch.setattr(compile_module, "compile_model", compile_model)


def _raising(error):
    def command(args):
        raise error

    return command


# ----------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("error, code, fragments", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/out.so"), 1,
     ["'/data/out.so'", "No space left on device"]),
    (PermissionError(errno.EACCES, "Permission denied", "/data/report.json"), 1,
     ["'/data/report.json'", "Permission denied"]),
    (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/log"), 1, ["Read-only file system"]),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/data/records.json"), 1,
     ["Is a directory"]),
    (MemoryError(), 1, ["out of memory"]),
    (EnvironmentFault("disk full while logging"), 1, ["disk full while logging"]),
    (KorchError(""), 2, ["KorchError"]),
    (ValueError("our bug"), 3, ["internal error: ValueError: our bug"]),
])
def test_exit_code_and_one_line_by_kind_of_fault(monkeypatch, capsys, error, code, fragments):
    monkeypatch.setitem(cli.COMMANDS, "compile", _raising(error))
    got, lines, _ = run_main(capsys, "compile", "model.onnx")
    assert got == code and len(lines) == 1, lines
    assert lines[0].startswith("korch-tvm: ") and lines[0].rstrip(": ") != "korch-tvm: error"
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ----------------------------------------------------------------------------- output paths
def test_unwritable_outputs_fail_before_the_compile(tmp_path, monkeypatch, capsys,
                                                    tiny_onnx_path):
    _no_compile(monkeypatch)
    for flag in ("-o", "--report"):
        code, lines, _ = run_main(capsys, "compile", tiny_onnx_path, flag,
                                  f"{UNWRITABLE}/korch-out.so")
        assert code == 1 and len(lines) == 1, lines
        assert lines == [f"korch-tvm: error: {flag}: cannot write '{UNWRITABLE}/korch-out.so': "
                         "Permission denied"]
    code, lines, _ = run_main(capsys, "compile", tiny_onnx_path, "-o", tmp_path)
    assert code == 2 and lines == [f"korch-tvm: error: -o '{tmp_path}' is a directory; give a "
                                   "file name inside it"]


def test_a_full_disk_leaves_the_old_file_whole_and_no_partial_one(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("the previous report\n")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_io.os, "fsync", full_disk)
    with pytest.raises(EnvironmentFault, match=r"cannot write '.*report.json': No space left"):
        safe_io.write_text_atomically(str(target), "x" * 100000)
    assert target.read_text() == "the previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_report_on_a_full_disk_is_exit_1_after_the_compile(tmp_path, monkeypatch, capsys,
                                                           tiny_onnx_path):
    import korch_tvm.pipeline.compile as compile_module

    monkeypatch.setattr(compile_module, "compile_model",
                        lambda *args, **kwargs: (None, {"model": "tiny.onnx"}))
    monkeypatch.setattr(safe_io.os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    report = tmp_path / "out" / "report.json"
    code, lines, _ = run_main(capsys, "compile", tiny_onnx_path, "--report", report, "-q")
    assert code == 1 and len(lines) == 1 and "No space left on device" in lines[0], lines
    assert list(report.parent.iterdir()) == []


# ----------------------------------------------------------------------------- input limits
def test_a_shape_that_cannot_fit_in_memory_is_refused_before_anything_is_built(
        capsys, tiny_onnx_path):
    from korch_tvm.frontend.onnx_import import available_memory_bytes

    if (available_memory_bytes() or 0) > 240 * 2**30:
        pytest.skip("this machine could hold those activations")
    started = time.process_time()
    code, lines, _ = run_main(capsys, "compile", tiny_onnx_path, "--input-shape",
                              "x:1x3x100000x100000")
    assert code == 1 and len(lines) == 1, lines
    assert "x:1x3x100000x100000" in lines[0] and "223.5 GiB" in lines[0], lines[0]
    assert "--input-shape" in lines[0]
    assert time.process_time() - started < 30  # CPU seconds: nothing of that size was built


def test_activation_estimate_counts_inputs_and_the_largest_declared_tensor():
    from korch_tvm.frontend.onnx_import import check_activations_fit

    model = make_tiny_onnx(16, 32)  # float32 input 16x32 (2 KiB) and output 16x32
    check_activations_fit(model, {"x": [16, 32]}, available=3 * 2048)
    with pytest.raises(EnvironmentFault, match="need at least"):
        check_activations_fit(model, {"x": [16, 32]}, available=3 * 2048 - 1)


def _relu_model(opset):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_an_opset_newer_than_supported_is_refused_at_load(tmp_path, capsys):
    newest = onnx.defs.onnx_opset_version()
    path = tmp_path / "future.onnx"
    path.write_bytes(_relu_model(newest + 1).SerializeToString())
    code, lines, _ = run_main(capsys, "compile", path)
    assert code == 2 and len(lines) == 1, lines
    assert f"opset {newest + 1}" in lines[0] and f"opsets 1 to {newest}" in lines[0], lines[0]


def test_the_verifier_opset_check_names_what_onnx_runtime_runs():
    from korch_tvm.backend.verify import import_onnxruntime, onnxruntime_opset_problem

    if import_onnxruntime() is None:
        pytest.skip("onnxruntime is not installed")
    assert onnxruntime_opset_problem(_relu_model(17)) is None
    problem = onnxruntime_opset_problem(_relu_model(99))
    assert problem.startswith("ONNX Runtime ") and "cannot run opset 99" in problem
    assert "it runs opsets up to " in problem and "--no-verify" in problem


def test_a_model_without_operators_compiles_on_the_korch_path():
    from korch_tvm.pipeline.compile import compile_model

    graph = helper.make_graph([], "passthrough",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, report = compile_model(model, korch=True)
    assert report["verification"]["passed"] and report["verification"]["max_abs_error"] == 0
    assert report["korch_note"] == "no operators: built on the stock path"


# ----------------------------------------------------------------------------- CLI extras
def test_version_names_korch_tvm_tvm_and_tvm_ffi():
    result = subprocess.run([sys.executable, "-m", "korch_tvm.tools.cli", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    import tvm_ffi
    from importlib import metadata

    assert result.stdout.strip() == (f"korch_tvm {metadata.version('korch-tvm')}, TVM "
                                     f"{metadata.version('apache-tvm')}, tvm-ffi "
                                     f"{tvm_ffi.__version__}")


def test_measure_warns_on_a_noisy_machine_and_not_on_a_quiet_one(capsys):
    cli.configure_logging(0, False)
    cli._warn_if_noisy({"median": 1.2, "p10": 0.44, "p90": 12.4, "repeat": 20})
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spread 28.2x" in err[0] and "korch-tvm bench" in err[0], err
    cli._warn_if_noisy({"median": 1.0, "p10": 0.95, "p90": 1.3, "repeat": 20})
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- Ctrl-C
_CTRL_C_PROBE = """
import os, signal, subprocess, sys, threading, time
from korch_tvm.support import interrupts
interrupts.install()  # as cli.main does, before TVM starts any thread
import tvm
probe = "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
print("child blocks SIGINT:", subprocess.run([sys.executable, "-c", probe],
                                             capture_output=True, text=True).stdout.strip())
started = time.monotonic()
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    threading.Event().wait(60)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted:", interrupts.pressed(), "within a minute:", time.monotonic() - started < 50)
interrupts.uninstall()
print("child blocks SIGINT after:", subprocess.run([sys.executable, "-c", probe],
                                                   capture_output=True, text=True).stdout.strip())
"""


def test_workers_started_during_a_run_never_see_ctrl_c_and_the_main_thread_still_does():
    """A second Ctrl-C printed tracebacks of builder workers that were importing TVM (and
    could hang the run): during a run SIGINT is blocked for every process started from it,
    and a listener hands it to the main thread's handler, cutting short a wait there."""
    result = subprocess.run([sys.executable, "-c", _CTRL_C_PROBE], capture_output=True,
                            text=True, timeout=300,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["child blocks SIGINT: True",
                                          "interrupted: True within a minute: True",
                                          "child blocks SIGINT after: False"], result.stdout
