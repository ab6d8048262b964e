"""Nodes rewritten before import: a Pad of zero widths becomes an Identity, a constant Pad of
one axis a Concat with a constant block, a Clip with constant bounds comparisons and Wheres
(one Relax clip after import); every other Pad and Clip stays. Rewritten models must compute
what the original computes (ONNX Runtime on both; TVM on the imported clips)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.frontend.onnx_rewrites import rewrite_for_import

SHAPE = [1, 2, 5, 3]


def _one_node_model(node, inits, out_shape, opset):
    """X -> node -> Exp -> Y (the Exp keeps the node's output an inner value)."""
    graph = helper.make_graph(
        [node, helper.make_node("Exp", [node.output[0]], ["y"])], "rewrites",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _pad_model(pads, value=None, mode="constant", axes=None, opset=13):
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
    return _one_node_model(helper.make_node("Pad", inputs, ["padded"], name="pad", **attrs),
                           inits, out_shape, opset)


def _clip_model(low=None, high=None, opset=13):
    """Clip with constant bounds (inputs from opset 11, attributes before)."""
    if opset < 11:
        attrs = {name: value for name, value in (("min", low), ("max", high))
                 if value is not None}
        return _one_node_model(helper.make_node("Clip", ["x"], ["clipped"], **attrs), [],
                               SHAPE, opset)
    inits = [numpy_helper.from_array(np.array(value, np.float32), name)
             for name, value in (("low", low), ("high", high)) if value is not None]
    inputs = ["x", "low" if low is not None else "", "high" if high is not None else ""]
    return _one_node_model(helper.make_node("Clip", inputs, ["clipped"]), inits, SHAPE, opset)


def _run(model, x=None):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    if x is None:
        x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("model, op_type", [
    (_pad_model([0] * 8), "Identity"),
    (_pad_model([0] * 8, mode="reflect"), "Identity"),
    (_pad_model([0, 0, 0, 0, 0, 0, 0, 1], value=1.0), "Concat"),  # EfficientViT's ones column
    (_pad_model([1, 2], value=0.5, axes=[-1], opset=18), "Concat"),
    (_pad_model([0, 0, 2, 0, 0, 0, 0, 0], opset=10), "Concat"),
    (_clip_model(0.0, 6.0), "Less Where Greater Where"),      # ReLU6
    (_clip_model(high=0.5), "Greater Where"),
    (_clip_model(-0.5, float("nan")), "Less Where"),           # a NaN bound is no bound
    (_clip_model(), "Identity"),
    (_clip_model(-0.25, 0.75, opset=10), "Less Where Greater Where"),
])
def test_rewritten_nodes_compute_the_same(model, op_type):
    rewritten = rewrite_for_import(model)
    assert [node.op_type for node in rewritten.graph.node] == op_type.split() + ["Exp"]
    onnx.checker.check_model(rewritten)
    np.testing.assert_array_equal(_run(rewritten), _run(model))


@pytest.mark.parametrize("model", [
    _pad_model([0, 0, 1, 1, 0, 0, 1, 1]),                   # two axes
    _pad_model([0, 0, 0, 1, 0, 0, 0, 1], mode="reflect"),   # not constant
    _pad_model([0, 0, 0, 0, 0, 0, 0, -1]),                  # a crop
    _one_node_model(helper.make_node("Clip", ["x", "low"], ["clipped"]),  # a bound per element
                    [numpy_helper.from_array(np.zeros(SHAPE[-1], np.float32), "low")], SHAPE, 13),
])
def test_other_pads_and_clips_stay(model):
    assert rewrite_for_import(model) is model


def test_the_imported_module_holds_relax_ops_not_tir_calls():
    script = import_onnx(_pad_model([0, 0, 0, 0, 0, 0, 0, 1], value=1.0))["main"].script()
    assert "R.concat" in script and "call_tir" not in script
    script = import_onnx(_clip_model(0.0, 6.0))["main"].script()
    assert script.count("R.clip(x, T.float64(0.0), T.float64(6.0))") == 1
    assert "call_tir" not in script and "isnan" not in script and "R.where" not in script


@pytest.mark.parametrize("low, high, clips", [
    (0.0, 6.0, 1), (None, 0.5, 1), (-0.5, float("nan"), 1), (2.0, 1.0, 2)])  # min > max: max
def test_imported_clips_run_like_onnx_runtime(low, high, clips):
    import tvm
    from tvm import relax

    model = _clip_model(low, high)
    module = import_onnx(model)
    assert module["main"].script().count("R.clip(") == clips
    vm = relax.VirtualMachine(tvm.compile(module, "llvm"), tvm.cpu())
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 4
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _run(model, x), rtol=1e-6)


@pytest.mark.parametrize("model", [_clip_model(0.0, 6.0),
                                   _pad_model([0, 0, 0, 0, 0, 0, 0, 1], value=1.0)])
def test_explain_imports_what_compile_imports(model):
    """`korch-tvm explain` imports through the tracing importer: it must see the same module."""
    import tvm

    from korch_tvm.frontend.onnx_trace import import_onnx_traced

    traced, trace = import_onnx_traced(model)
    assert trace is not None
    tvm.ir.assert_structural_equal(traced, import_onnx(model))


def test_a_module_without_clamps_is_returned_as_it_is():
    from tvm.relax.frontend.onnx import from_onnx

    from korch_tvm.frontend.clamps import clamps_as_clip
    from korch_tvm.frontend.onnx_import import onnx_for_import

    prepared, shapes = onnx_for_import(_pad_model([0] * 8))
    module = from_onnx(prepared, shape_dict=shapes)
    assert clamps_as_clip(module) is module


def test_a_bound_of_higher_rank_stays_a_select():
    """where(x < c, c, x) with c of shape [1, 1, 1, 1, 1] broadcasts x to rank 5: no clip."""
    model = _one_node_model(
        helper.make_node("Clip", ["x", "low"], ["clipped"]),
        [numpy_helper.from_array(np.zeros([1] * 5, np.float32), "low")], [1] + SHAPE, 13)
    script = import_onnx(model)["main"].script()
    assert "R.clip" not in script
