"""Per-kernel-kind time: TIR classification, sums over a module or a plan, ORT profiles."""

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.kernels.kinds import (KINDS, kernel_kind, kind_times, module_kernel_kinds,
                                     ort_kind_times, ort_node_kind, plan_kind_times)
from korch_tvm.pipeline.stock import stock_fusion
from test_weight_packing import conv_block_onnx

from conftest import make_tiny_onnx

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def strided_conv_onnx() -> onnx.ModelProto:
    """A 5x5 stride-2 conv (neither 1x1 nor 3x3) followed by a 2x2 max pool."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 5, 5)).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[2, 2, 2, 2]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "strided",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_conv_kinds_from_tir():
    kinds = module_kernel_kinds(stock_fusion(import_onnx(conv_block_onnx(), None), TARGET))
    assert sorted(kinds.values()) == ["conv1x1", "conv3x3", "conv_depthwise"]
    other = module_kernel_kinds(stock_fusion(import_onnx(strided_conv_onnx(), None), TARGET))
    assert sorted(other.values()) == ["conv_other", "memory"]  # the pool is memory-bound


def test_matmul_and_memory_kinds_and_time_sums():
    fused = stock_fusion(import_onnx(make_tiny_onnx(), None), TARGET)
    kinds = module_kernel_kinds(fused)
    assert "matmul" in kinds.values() and "memory" in kinds.values()
    assert set(kinds.values()) <= set(KINDS)
    kernel_ms = {name: 1.0 for name in kinds}
    totals = kind_times(fused, kernel_ms, calls={next(iter(kinds)): 3})
    assert set(totals) == set(KINDS)
    assert sum(totals.values()) == pytest.approx(len(kinds) + 2)
    # a tuned, weight-prepacked kernel keeps its kind and is found under its original name
    renamed = tvm.IRModule({tvm.ir.GlobalVar(f"{n}_prepacked" if k == "matmul" else n): fused[n]
                            for n, k in kinds.items()})
    assert kind_times(renamed, kernel_ms) == kind_times(fused, kernel_ms)


def test_plan_kind_times_maps_korch_kernels_by_position():
    fused = stock_fusion(import_onnx(conv_block_onnx(), None), TARGET)
    funcs = {n: fused[n] for n in module_kernel_kinds(fused)}
    by_kind = {kernel_kind(f): f for f in funcs.values()}
    module = tvm.IRModule({tvm.ir.GlobalVar("korch_k0"): by_kind["conv1x1"],
                           tvm.ir.GlobalVar("korch_k1_prepacked"): by_kind["conv3x3"]})
    plan = {"kernels": [{"ms": 2.0}, {"ms": 5.0}, {"ms": 1.0}, {"ms": None}]}  # k2: opaque op
    totals = plan_kind_times(module, plan)
    assert totals["conv1x1"] == 2.0 and totals["conv3x3"] == 5.0 and totals["memory"] == 1.0


def test_ort_node_kinds():
    shape = lambda *s: {"float": list(s)}  # noqa: E731
    assert ort_node_kind("Conv", [shape(1, 32, 8, 8), shape(32, 1, 3, 3)]) == "conv_depthwise"
    assert ort_node_kind("FusedConv", [shape(1, 32, 8, 8), shape(64, 32, 1, 1)]) == "conv1x1"
    assert ort_node_kind("Conv", [shape(1, 32, 8, 8), shape(64, 32, 3, 3)]) == "conv3x3"
    assert ort_node_kind("Conv", [shape(1, 3, 8, 8), shape(8, 3, 9, 9)]) == "conv_other"
    assert ort_node_kind("FusedMatMul", []) == "matmul"
    assert ort_node_kind("ReorderInput", [shape(1, 32, 8, 8)]) == "memory"


def test_ort_profile_sums_by_kind(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort")
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(conv_block_onnx().SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    x = np.zeros((1, 16, 14, 14), "float32")
    for _ in range(3):
        session.run(None, {"x": x})
    path = session.end_profiling()
    totals = ort_kind_times(path)
    for kind in ("conv1x1", "conv_depthwise", "conv3x3"):
        assert totals[kind] > 0, kind
    assert totals["matmul"] == 0
    # the same numbers from the parsed list; with every run counted, the warm-up is included
    events = json.load(open(path))
    assert ort_kind_times(events) == totals
    assert sum(ort_kind_times(events, skip_runs=0).values()) >= sum(totals.values()) * 0.5
