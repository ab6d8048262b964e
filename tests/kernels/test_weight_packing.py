"""Weight pre-packing: layout-free weight parameters, tuning-log reuse, packed constants."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import relax as R

from korch_tvm.backend.rewrite import canonicalize_kernels
from korch_tvm.backend.verify import onnxruntime_outputs
from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.config import KorchConfig
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.kernels.fused import (build_partition_module, canonical_prim_func, distinct_kernels,
                                     kernel_module, structural_key)
from korch_tvm.kernels.weight_packing import (LAYOUT_FREE_ATTR, PREPACK_SUFFIX,
                                              layout_free_indices, mark_layout_free_weights)
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.pipeline.stock import run_stock, stock_fusion

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def conv_block_onnx(channels: int = 16, size: int = 14, seed: int = 0) -> onnx.ModelProto:
    """Conv 1x1 -> ReLU -> depthwise 3x3 -> ReLU -> conv 3x3 -> ReLU, each with a bias."""
    rng = np.random.default_rng(seed)
    c = channels
    arrays = {"w1": (c, c, 1, 1), "b1": (c,), "w2": (c, 1, 3, 3), "b2": (c,),
              "w3": (c, c, 3, 3), "b3": (c,)}
    inits = [numpy_helper.from_array((0.2 * rng.standard_normal(s)).astype("float32"), n)
             for n, s in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c3"], ["y"])]
    shape = [1, c, size, size]
    graph = helper.make_graph(nodes, "conv_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_constant_weights_are_layout_free_in_stock_and_korch_kernels():
    mod = import_onnx(conv_block_onnx(), None)
    fused = prim_funcs(stock_fusion(mod, TARGET))
    assert len(fused) == 3
    for name, func in fused.items():  # (x, weight, bias, out): weight and bias are constants
        assert layout_free_indices(func) == (1, 2), name
        assert LAYOUT_FREE_ATTR in canonical_prim_func(func).attrs  # part of the tuning key
    graph = PrimitiveGraph.from_module(lower_to_primitives(mod))
    candidates = enumerate_candidates(graph, KernelRules())
    kernels = distinct_kernels(graph, candidates)
    marked = [m for m in kernels.modules.values() if layout_free_indices(m["main"])]
    assert marked, "kernels reading a weight must carry layout_free_buffers"
    for module in kernels.modules.values():
        func = module["main"]
        for index in layout_free_indices(func):  # only inputs, never the output buffer
            assert index < len(func.params) - 1
    # the kernels of the rebuilt model carry the same attribute as the standalone ones (same key)
    stock_groups = [c.nodes for c in candidates if c.is_stock]
    rebuilt = canonicalize_kernels(build_partition_module(graph, stock_groups))
    for name, func in prim_funcs(rebuilt).items():
        assert structural_key(kernel_module(func)) in kernels.modules, name


@tvm.script.ir_module
class SharedMatmul:
    @R.function
    def main(x: R.Tensor((8, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        R.func_attr({"num_input": 2})
        with R.dataflow():
            a = R.matmul(x, R.const(np.ones((8, 8), "float32")))
            b = R.matmul(a, w)
            c = R.matmul(b, R.const(np.full((8, 8), 2.0, "float32")))
            R.output(c)
        return c


def test_a_kernel_called_with_and_without_constants_gets_a_copy():
    legalized = relax.transform.LegalizeOps()(SharedMatmul)
    marked = mark_layout_free_weights(legalized)
    funcs = prim_funcs(marked)
    assert layout_free_indices(funcs["matmul"]) == (1,)  # two calls with a constant weight
    (copy,) = [f for n, f in funcs.items() if n != "matmul"]
    assert layout_free_indices(copy) == ()
    tvm.ir.assert_structural_equal(mark_layout_free_weights(marked), marked)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    w = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    outs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy() for m in (legalized, marked)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5)


@pytest.fixture(scope="module")
def tuned_conv_block(tmp_path_factory):
    """The stock path tuned once (a few trials), then compiled again from the same log."""
    model = conv_block_onnx()
    logs = str(tmp_path_factory.mktemp("layout-logs"))
    # NCHW: in NHWC the module also calls the input's and output's transposes
    config = KorchConfig(target=TARGET, trials=12, tuning_logs=logs, progress=False,
                         layout="NCHW")
    first, first_report = run_stock(import_onnx(model, None), config)
    second, second_report = run_stock(import_onnx(model, None), config)
    return model, first, first_report, second, second_report


def test_rerun_finds_every_layout_free_kernel_in_the_log(tuned_conv_block):
    _, first, first_report, second, second_report = tuned_conv_block
    assert first_report["tuning"]["trials_run"] > 0
    assert second_report["tuning"]["trials_run"] == 0
    assert second_report["tuning"]["from_log"] == second_report["tuning"]["kernels"]
    tvm.ir.assert_structural_equal(first, second)


def test_packed_weights_are_constants_of_the_final_module(tuned_conv_block):
    _, module, *_ = tuned_conv_block
    names = prim_funcs(module)
    assert not [n for n in names if n.endswith(PREPACK_SUFFIX)], "no per-call weight transform"
    prepacked = [n for n in names if n.endswith("_prepacked")]
    assert prepacked, "the tuned convolutions should have repacked weights"
    calls = []
    relax.analysis.post_order_visit(
        module["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
        and e.op.same_as(CALL_TIR) else None)
    assert len(calls) == 3  # one call per kernel: nothing computed on weights at run time
    for call in calls:
        args = call.args[1].fields
        assert isinstance(args[0], relax.Var)
        assert all(isinstance(a, tvm.ir.expr.Constant) for a in args[1:])
        if call.args[0].name_hint in prepacked:  # a packed weight has the kernel's own shape
            func = module[call.args[0]]
            assert [int(d) for d in args[1].ty.shape.values] == [int(d) for d in func.params[1].shape]


def test_split_and_folded_module_matches_onnxruntime(tuned_conv_block):
    model, module, *_ = tuned_conv_block
    x = np.random.default_rng(2).standard_normal((1, 16, 14, 14)).astype("float32")
    (expected,) = onnxruntime_outputs(model, {"x": x})
    vm = relax.VirtualMachine(tvm.compile(module, target=TARGET), tvm.cpu())
    actual = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
