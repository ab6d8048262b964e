"""Pads rewritten before import: zero widths become an Identity, a constant pad of one axis a
Concat with a constant block; every other Pad stays. Rewritten models must compute what the
original computes (ONNX Runtime on both)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.frontend.onnx_pads import rewrite_pads

SHAPE = [1, 2, 5, 3]


def _pad_model(pads, value=None, mode="constant", axes=None, opset=13):
    """X -> Pad -> Exp -> Y (the Exp keeps the Pad's output an inner value)."""
    rank_pads = len(pads) // 2
    out_shape = list(SHAPE)
    for index in range(rank_pads):
        axis = axes[index] if axes is not None else index
        out_shape[axis] += pads[index] + pads[rank_pads + index]
    inits, inputs, attrs = [], ["x"], {"mode": mode}
    if opset < 11:
        attrs["pads"] = pads
        if value is not None:
            attrs["value"] = value
    else:
        inits.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
        inputs.append("pads")
        if value is not None or axes is not None:
            inputs.append("value" if value is not None else "")
            if value is not None:
                inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        if axes is not None:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            inputs.append("axes")
    graph = helper.make_graph(
        [helper.make_node("Pad", inputs, ["padded"], name="pad", **attrs),
         helper.make_node("Exp", ["padded"], ["y"])], "pads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _run(model):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("model, op_type", [
    (_pad_model([0] * 8), "Identity"),
    (_pad_model([0] * 8, mode="reflect"), "Identity"),
    (_pad_model([0, 0, 0, 0, 0, 0, 0, 1], value=1.0), "Concat"),  # EfficientViT's ones column
    (_pad_model([1, 2], value=0.5, axes=[-1], opset=18), "Concat"),
    (_pad_model([0, 0, 2, 0, 0, 0, 0, 0], opset=10), "Concat"),
])
def test_rewritten_pads_compute_the_same(model, op_type):
    rewritten = rewrite_pads(model)
    assert [node.op_type for node in rewritten.graph.node] == [op_type, "Exp"]
    onnx.checker.check_model(rewritten)
    np.testing.assert_array_equal(_run(rewritten), _run(model))


@pytest.mark.parametrize("model", [
    _pad_model([0, 0, 1, 1, 0, 0, 1, 1]),                   # two axes
    _pad_model([0, 0, 0, 1, 0, 0, 0, 1], mode="reflect"),   # not constant
    _pad_model([0, 0, 0, 0, 0, 0, 0, -1]),                  # a crop
])
def test_other_pads_stay(model):
    assert rewrite_pads(model) is model


def test_the_imported_module_holds_a_concat_not_a_tir_pad():
    script = import_onnx(_pad_model([0, 0, 0, 0, 0, 0, 0, 1], value=1.0))["main"].script()
    assert "R.concat" in script and "call_tir" not in script
