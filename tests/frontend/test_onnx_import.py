import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import make_tiny_onnx
from korch_tvm.errors import KorchError
from korch_tvm.frontend.onnx_import import (fold_constant_shapes, import_onnx, input_shapes,
                                            load_onnx)


def _shape_computing_model(dynamic_batch: bool = False) -> onnx.ModelProto:
    """x[N,4,6] -> Reshape(x, concat(shape(x)[0:1], [-1])) -> Pad with pads built from a Size.

    This is how raw PyTorch exports compute shapes; TVM's importer rejects it unless folded.
    """
    batch = "N" if dynamic_batch else 2
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target_shape"], axis=0),
        helper.make_node("Reshape", ["x", "target_shape"], ["flat"]),
        helper.make_node("Size", ["batch1"], ["one"]),
        helper.make_node("Unsqueeze", ["one", "axes0"], ["one1"]),
        helper.make_node("Concat", ["zeros2", "one1", "one1"], ["pads"], axis=0),
        helper.make_node("Pad", ["flat", "pads"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([0, 0], np.int64), "zeros2")]
    graph = helper.make_graph(nodes, "shapes",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(mod, x):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_shape_subgraphs_are_folded_and_numerics_kept():
    from tvm.relax.frontend.onnx import from_onnx

    model = _shape_computing_model()
    with pytest.raises(Exception):
        from_onnx(model, shape_dict={"x": [2, 4, 6]})     # the raw export is rejected ...
    folded = fold_constant_shapes(model, {"x": [2, 4, 6]})
    assert {n.op_type for n in folded.graph.node} == {"Reshape", "Pad"}   # ... arithmetic gone
    x = np.random.default_rng(0).standard_normal((2, 4, 6)).astype("float32")
    got = _run(import_onnx(model), x)
    expected = np.pad(x.reshape(2, -1), [(0, 1), (0, 1)])
    np.testing.assert_array_equal(got, expected)


def test_dynamic_input_needs_a_shape_and_override_works():
    model = _shape_computing_model(dynamic_batch=True)
    with pytest.raises(KorchError, match=r"input 'x' has a dynamic shape \(Nx4x6\).*--input-shape"):
        input_shapes(model)
    assert input_shapes(model, {"x": [3, 4, 6]}) == {"x": [3, 4, 6]}
    x = np.ones((3, 4, 6), "float32")
    assert _run(import_onnx(model, {"x": [3, 4, 6]}), x).shape == (4, 25)
    with pytest.raises(KorchError, match="unknown inputs: nope"):
        input_shapes(model, {"x": [3, 4, 6], "nope": [1]})


def test_weights_are_not_duplicated_by_folding():
    model = make_tiny_onnx()
    folded = fold_constant_shapes(model, {"x": [16, 32]})
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in model.graph.node]
    assert len(folded.graph.initializer) == len(model.graph.initializer)


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(KorchError, match="does not exist"):
        load_onnx(tmp_path / "missing.onnx")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a protobuf\n" * 10)
    with pytest.raises(KorchError) as info:
        load_onnx(text)
    assert "\n" not in str(info.value)
    good = make_tiny_onnx().SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(KorchError, match="corrupt or truncated|malformed|not an ONNX"):
        load_onnx(truncated)


def test_unsupported_operator_is_named():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                               helper.make_node("NoSuchOp", ["r"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(KorchError, match="NoSuchOp"):
        import_onnx(model)
