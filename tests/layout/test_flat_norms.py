"""A normalization over a flattened whole tensor is computed on the tensor as it is."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import convert_layout
from korch_tvm.layout.flat_norms import unflatten_whole_norms
from korch_tvm.lowering.constant_folding import fold_constants

from test_activations import activation_transposes, run_module

SHAPE = (1, 8, 6, 6)


def group_norm_onnx(groups: int = 1, between: str | None = None) -> onnx.ModelProto:
    """conv -> GroupNorm as PyTorch exports it (Reshape to [1, groups, -1],
    InstanceNormalization, Reshape back, per-channel Mul and Add) -> conv; `between` puts one
    more unary operator after the instance norm."""
    rng = np.random.default_rng(0)
    c = SHAPE[1]

    def const(name, array):
        return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)

    inits = [const("w1", rng.standard_normal((c, c, 3, 3))),
             const("w2", rng.standard_normal((c, c, 1, 1))),
             const("scale", rng.uniform(0.5, 2, groups)),
             const("bias", rng.standard_normal(groups)),
             const("gamma", rng.standard_normal((c, 1, 1))),
             const("beta", rng.standard_normal((c, 1, 1))),
             numpy_helper.from_array(np.array([1, groups, -1], dtype=np.int64), "flat"),
             numpy_helper.from_array(np.array(SHAPE, dtype=np.int64), "back")]
    normalized = "normed"
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["y", "flat"], ["flattened"]),
             helper.make_node("InstanceNormalization", ["flattened", "scale", "bias"], ["normed"],
                              epsilon=1e-5)]
    if between:
        nodes.append(helper.make_node(between, ["normed"], ["between"]))
        normalized = "between"
    nodes += [helper.make_node("Reshape", [normalized, "back"], ["unflat"]),
              helper.make_node("Mul", ["unflat", "gamma"], ["scaled"]),
              helper.make_node("Add", ["scaled", "beta"], ["shifted"]),
              helper.make_node("Conv", ["shifted", "w2"], ["out"])]
    graph = helper.make_graph(nodes, "group_norm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, SHAPE)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def reshapes(mod) -> int:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and e.op.name == "relax.reshape" else None)
    return len(found)


def test_one_group_norm_reduces_over_the_tensor_without_reshapes():
    mod = fold_constants(import_onnx(group_norm_onnx(), None))
    assert reshapes(mod) == 2
    unflattened = unflatten_whole_norms(mod)
    assert reshapes(unflattened) == 0
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    expected = run_module(mod, x)
    np.testing.assert_allclose(run_module(unflattened, x), expected, rtol=1e-5, atol=1e-5)


def test_in_nhwc_the_norm_needs_no_transposes():
    """Flattened, the norm read the NHWC tensor through a transpose to NCHW and wrote one back:
    now the only transposes are at the model's input and output."""
    mod = import_onnx(group_norm_onnx(), None)
    converted = convert_layout(mod, "NHWC")
    assert activation_transposes(converted) == 2 and reshapes(converted) == 0
    x = np.random.default_rng(2).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(run_module(converted, x), run_module(mod, x), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("groups,between", [(2, None), (1, "Softmax")])
def test_other_reshapes_are_left_as_they_are(groups, between):
    """Two groups split the channels (the reshape is not order-free), and a softmax over the
    flattened axis is no elementwise step: both keep their reshapes."""
    mod = fold_constants(import_onnx(group_norm_onnx(groups, between), None))
    tvm.ir.assert_structural_equal(unflatten_whole_norms(mod), mod)
