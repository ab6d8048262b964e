"""Fast-math legalization: same values as TVM's libm-based legalization, no libm call left."""

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.lowering.fast_math import FAST_OPS, legalize_ops
from korch_tvm.pipeline.stock import stock_fusion
from onnx import TensorProto, helper, numpy_helper

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
LIBM_CALLS = ("T.exp(", "T.tanh(", "T.erf(", "T.sigmoid(")
R = relax.op

OPS = {
    "relax.exp": R.exp,
    "relax.sigmoid": R.sigmoid,
    "relax.tanh": R.tanh,
    "relax.erf": R.erf,
    "relax.nn.softmax": lambda x: R.nn.softmax(x, axis=1),
    "relax.nn.log_softmax": lambda x: R.nn.log_softmax(x, axis=-1),
    "relax.nn.gelu": R.nn.gelu,
    "relax.nn.gelu_tanh": R.nn.gelu_tanh,
    "relax.nn.silu": R.nn.silu,
    "relax.nn.selu": R.nn.selu,
    "relax.nn.softplus": lambda x: R.nn.softplus(x, beta=2.0, threshold=10.0),
}


def one_op_module(make_op, dtype="float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 3, 40), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make_op(x))
        bb.emit_func_output(out)
    return bb.get()


def run(mod: tvm.IRModule, data: np.ndarray) -> np.ndarray:
    executable = tvm.compile(mod, target=TARGET)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(data, tvm.cpu())).numpy()


def tir_text(mod: tvm.IRModule) -> str:
    return "\n".join(func.script() for _, func in mod.functions_items()
                     if isinstance(func, tvm.tirx.PrimFunc))


def test_every_fast_op_is_checked_here():
    assert sorted(OPS) == sorted(FAST_OPS)


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_fast_legalization_matches_exact_and_calls_no_libm(op_name):
    data = np.random.default_rng(0).uniform(-12, 12, (4, 3, 40)).astype("float32")
    data[0, 0, :6] = [-100.0, -88.0, 0.0, 1e-4, 88.0, 100.0]
    if op_name == "relax.exp":   # exp overflows float32 above 88.7, identically on both sides
        data = np.minimum(data, 80.0)
    mod = one_op_module(OPS[op_name])
    fast, exact = legalize_ops(True)(mod), legalize_ops(False)(mod)
    assert not any(call in tir_text(fast) for call in LIBM_CALLS), tir_text(fast)
    assert any(call in tir_text(exact) for call in LIBM_CALLS)
    got, want = run(fast, data), run(exact, data)
    scale = np.maximum(np.abs(want), 1.0)   # exp: 3.6e-6 at x=80 without FMA (no mcpu here)
    assert np.max(np.abs(got - want) / scale) < 5e-6


def test_other_dtypes_keep_the_default_legalization():
    mod = one_op_module(R.sigmoid, dtype="float16")
    assert tir_text(legalize_ops(True)(mod)) == tir_text(legalize_ops(False)(mod))


def conv_silu_onnx():
    """Conv 1x1 with bias, then SiLU written as Sigmoid and Mul (as YOLOX exports it)."""
    weight = np.random.default_rng(0).standard_normal((8, 8, 1, 1)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8, 6, 6]) for name in "xy"]
    graph = helper.make_graph(nodes, "conv_silu", io[:1], io[1:], initializer=[
        numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(8, "float32"), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_stock_path_gets_the_same_arithmetic():
    """Conv + SiLU: the stock kernel evaluates sigmoid without libm unless asked to."""
    imported = import_onnx(conv_silu_onnx(), None)
    assert not any(call in tir_text(stock_fusion(imported, TARGET)) for call in LIBM_CALLS)
    assert "T.sigmoid(" in tir_text(stock_fusion(imported, TARGET, fast_math=False))


def power_by(exponent, dtype="float32", shape=()):
    constant = relax.const(np.full(shape, exponent, dtype), dtype)
    return one_op_module(lambda x: R.power(x, constant), dtype)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 4.0])
def test_small_whole_powers_are_multiplications(exponent):
    data = np.random.default_rng(1).uniform(-20, 20, (4, 3, 40)).astype("float32")
    mod = power_by(exponent, shape=(1, 1))
    fast, exact = legalize_ops(True)(mod), legalize_ops(False)(mod)
    assert "T.pow(" not in tir_text(fast) and "T.pow(" in tir_text(exact)
    got, want = run(fast, data), run(exact, data)
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)) < 3e-7
    np.testing.assert_array_equal(got[data == 0], 0.0)


@pytest.mark.parametrize("exponent, dtype, shape", [
    (2.5, "float32", ()),           # not a whole number
    (5.0, "float32", ()),           # a longer chain than worth writing out
    (3.0, "float32", (1, 1, 1, 1)),  # broadcasts x to four dimensions
    (3.0, "float16", ()),
])
def test_other_powers_keep_powf(exponent, dtype, shape):
    mod = power_by(exponent, dtype, shape)
    assert tir_text(legalize_ops(True)(mod)) == tir_text(legalize_ops(False)(mod))
