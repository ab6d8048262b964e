"""Library kernels on the Korch path: chosen where their (recorded) time is lower, verified,
exported self-contained, never trusted from a corrupt file, and off with library="off".

Times are injected through library_times.json, so what the plan chooses does not depend on
how fast this machine runs a GEMM today.
"""

import json
import logging
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.config import KorchConfig
from korch_tvm.costing.library_costs import LIBRARY_TIMES_FILE
from korch_tvm.pipeline.compile import compile_model

# A deep GEMM beside a small epilogue: the fused TVM kernel (about 12 MFLOP) then costs far more
# than the separate add + relu (6144 elements) on any machine, busy or not, so the recorded
# library time decides the plan. (At depth 128 a stalled measurement of the epilogue once made
# the fused kernel the cheaper plan.)
DEPTH = 1024
GEMM_KEY = f"openblas.sgemm batch=1 m=64 n=96 k={DEPTH} ta=0 tb=0 ab=0 bb=0"
FRESH_RUN = """
import sys, numpy as np, tvm
from tvm import relax
folder = sys.argv[1]
vm = relax.VirtualMachine(tvm.runtime.load_module(folder + "/model.so"), tvm.cpu())
np.save(folder + "/y.npy", vm["main"](tvm.runtime.tensor(np.load(folder + "/x.npy"))).numpy())
print("korch_tvm imported:", any(m.startswith("korch_tvm") for m in sys.modules))
"""


def matmul_model():
    """y = relu(x @ W + b): a plain GEMM with an epilogue TVM would fuse into it."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((DEPTH, 96)).astype("float32"), "W"),
               numpy_helper.from_array(rng.standard_normal(96).astype("float32"), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, DEPTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 96])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def compile_into(logs, library="auto"):
    # memory_limit "none": the GEMM's separate epilogue needs an intermediate the stock
    # fusion does not, which the default storage limit would refuse on a model this small
    config = KorchConfig(tuning_logs=str(logs), library=library, memory_limit="none")
    return compile_model(matmul_model(), korch=True, config=config)


def record_times(logs, seconds: dict):
    """library_times.json, in the log directory a compile into `logs` uses, holding `seconds`."""
    from korch_tvm.backend.target import target_tag

    path = logs / target_tag(KorchConfig().target) / LIBRARY_TIMES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "seconds": seconds}))
    return path


def implementations(report):
    return [kernel["implementation"] for kernel in report["plan"]["kernels"]]


def test_a_cheaper_library_gemm_is_chosen_verified_exported_and_reused(
        blas_extension, tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    path = record_times(logs, {GEMM_KEY: 1e-7})
    executable, report = compile_into(logs)
    assert implementations(report) == ["openblas.sgemm", "tvm"]   # GEMM, then add + relu
    assert report["plan"]["library_kernels"] == 1
    # the GEMM's BLAS time is under any price its TVM kernel could have: that is not measured
    from korch_tvm.costing.tuning_log import TuningLog
    from korch_tvm.kernels.fused import structural_key

    logged = {structural_key(kernel.kernel)
              for kernel in TuningLog(str(logs), KorchConfig().target).kernels()}
    assert report["plan"]["kernels"][1]["key"] in logged
    assert report["plan"]["kernels"][0]["key"] not in logged
    assert report["library_calls"] == ["korch_tvm.blas.sgemm"]
    assert report["verification"]["passed"] and report["verification"]["reference"] == \
        "onnxruntime"
    executable.export_library(str(tmp_path / "model.so"))        # the user's own call
    x = np.random.default_rng(3).standard_normal((64, DEPTH)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", FRESH_RUN, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "korch_tvm imported: False" in done.stdout
    weights = {w.name: numpy_helper.to_array(w) for w in matmul_model().graph.initializer}
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               np.maximum(x @ weights["W"] + weights["b"], 0), rtol=1e-4,
                               atol=1e-4)
    # a second compile reads the times: nothing is measured, the plan is the same
    before = path.read_text()

    def no_measuring(*args, **kwargs):
        raise AssertionError("a library time was measured again")

    monkeypatch.setattr("korch_tvm.library.implementations.Implementation.measure",
                        no_measuring)
    _, again = compile_into(logs)
    assert [k["key"] for k in again["plan"]["kernels"]] == \
        [k["key"] for k in report["plan"]["kernels"]]
    assert implementations(again) == implementations(report)
    assert path.read_text() == before


def test_library_off_builds_tvm_kernels_only(blas_extension, tmp_path):
    logs = tmp_path / "logs"
    record_times(logs, {GEMM_KEY: 1e-7})
    _, report = compile_into(logs, library="off")
    assert set(implementations(report)) == {"tvm"} and report["plan"]["library_kernels"] == 0
    assert report["library_calls"] == [] and report["verification"]["passed"]


@pytest.mark.parametrize("content", ['{"format": 1, "seconds": {"%s": -1.0}}' % GEMM_KEY,
                                     '{"format": 1, "seconds": {'])
def test_a_corrupt_time_is_refused_in_one_line_and_measured_again(
        blas_extension, tmp_path, caplog, content):
    logs = tmp_path / "logs"
    path = record_times(logs, {})
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="korch_tvm.library_costs"):
        _, report = compile_into(logs)
    refusals = [r.getMessage() for r in caplog.records if r.name == "korch_tvm.library_costs"]
    assert len(refusals) == 1 and str(path) in refusals[0] and "again" in refusals[0]
    seconds = json.loads(path.read_text())["seconds"][GEMM_KEY]
    assert math.isfinite(seconds) and seconds > 0          # measured here, not the file's
    assert report["verification"]["passed"]


def test_a_library_cost_calibrates_no_tvm_kernel():
    """A BLAS time would make every TVM kernel sharing its matmul look cheap (and measured)."""
    from korch_tvm.costing.kernel_costs import KernelCost
    from korch_tvm.pipeline.korch_costs import _library_apart

    anchors = {"gemm": {3}, "gemm_add": {3}, "fused_tvm": {3}, "add": {"memory-bound"}}
    known = {"gemm": KernelCost(1e-4, "measured", 1, implementation="openblas.sgemm"),
             "gemm_add": KernelCost(1e-3, "measured", 1)}
    apart = _library_apart(anchors, known)
    assert apart["gemm"] == {("library", "gemm")}
    assert {key: apart[key] for key in ("gemm_add", "fused_tvm", "add")} == \
        {"gemm_add": {3}, "fused_tvm": {3}, "add": {"memory-bound"}}


CONV_KEYS = [f"openblas.sconv2d{steps} layout=nchw n=1 c=8 h=12 w=12 k=16 r=3 s=3 p=12 q=12 "
             "stride=1,1 pad=1,1 dilation=1,1 groups=1"
             for steps in ("", "+bias_m", "+bias_m+relu")]


def conv_model():
    """y = relu(conv3x3(x, W, b)): a convolution whose bias and activation the call applies."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype("float32"), "W"),
               numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "b")]
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])],
        initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_cheaper_library_convolution_is_chosen_verified_and_runs_exported(
        blas_extension, tmp_path):
    import onnxruntime

    logs = tmp_path / "logs"
    record_times(logs, {key: 1e-7 for key in CONV_KEYS})
    config = KorchConfig(tuning_logs=str(logs), library="auto", memory_limit="none")
    executable, report = compile_model(conv_model(), korch=True, config=config)
    assert implementations(report) == ["openblas.sconv2d+bias_m+relu"]  # bias, relu inside
    assert report["library_calls"] == ["korch_tvm.blas.sconv2d"]
    assert report["verification"]["passed"]
    assert report["verification"]["max_rel_error"] <= 1e-5
    executable.export_library(str(tmp_path / "model.so"))
    x = np.random.default_rng(4).standard_normal((1, 8, 12, 12)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", FRESH_RUN, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    session = onnxruntime.InferenceSession(conv_model().SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), session.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
