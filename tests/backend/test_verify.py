import numpy as np
import pytest

from korch_tvm.backend.verify import compare, random_inputs
from korch_tvm.errors import KorchError


def test_random_inputs_are_seeded_and_typed():
    a = random_inputs({"x": [2, 3], "ids": [4]}, {"x": "float32", "ids": "int64"}, seed=3)
    b = random_inputs({"x": [2, 3], "ids": [4]}, {"x": "float32", "ids": "int64"}, seed=3)
    assert a["x"].dtype == np.float32 and a["ids"].dtype == np.int64
    np.testing.assert_array_equal(a["x"], b["x"])
    assert set(np.unique(a["ids"])) <= {0, 1}
    assert not np.array_equal(a["x"], random_inputs({"x": [2, 3]}, {}, seed=4)["x"])


def test_errors_are_relative_to_each_outputs_scale():
    expected = [np.array([100.0, -200.0], "float32"), np.array([1.0, 2.0], "float32")]
    actual = [np.array([100.01, -200.0], "float32"), np.array([1.0, 2.001], "float32")]
    result = compare(actual, expected, "onnxruntime", tolerance=1e-4)
    assert result.max_abs_error == pytest.approx(0.01, rel=1e-3)
    assert result.max_rel_error == pytest.approx(0.001 / 2.0, rel=1e-2)   # second output worst
    assert result.worst_output == 1
    assert not result.passed
    assert compare(actual, expected, "onnxruntime", tolerance=1e-3).passed


def test_nan_where_reference_is_finite_fails():
    result = compare([np.array([np.nan, 1.0])], [np.array([0.0, 1.0])], "ref")
    assert result.max_rel_error == float("inf") and not result.passed


def test_shape_or_count_mismatch_is_an_error():
    with pytest.raises(KorchError, match="shape"):
        compare([np.zeros((2, 3))], [np.zeros((3, 2))], "ref")
    with pytest.raises(KorchError, match="outputs"):
        compare([np.zeros(2)], [np.zeros(2), np.zeros(2)], "ref")


def test_tolerance_follows_each_outputs_dtype():
    from korch_tvm.backend.verify import DEFAULT_TOLERANCE, tolerance_for

    assert tolerance_for("float32") == DEFAULT_TOLERANCE == 1e-4
    assert tolerance_for("float16") == 2.0 ** -6
    assert tolerance_for("bfloat16") == 2.0 ** -3
    assert tolerance_for("int64") == DEFAULT_TOLERANCE
    assert tolerance_for("float32", floor=2e-3) == 2e-3  # CUDA's fast-math floor
    half = [np.array([1.0, 0.5], "float16")]
    off = [np.array([1.0 + 2 ** -8, 0.5], "float16")]  # 4 float16 ULPs at the scale
    by_dtype = compare(off, half, "ref", tolerance=None)
    assert by_dtype.passed and by_dtype.tolerance == 2.0 ** -6
    assert not compare(off, half, "ref", tolerance=1e-4).passed  # a given tolerance wins
    single = [np.array([1.0, 0.5], "float32")]
    assert not compare([x.astype("float32") for x in off], single, "ref", tolerance=None).passed


def float16_onnx(rows=4, depth=16, cols=8):
    """MatMul + Add + Softmax in float16, reductions long enough for float16 rounding."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((depth, cols)) / 4).astype("float16"),
                                       "W"),
               numpy_helper.from_array(rng.standard_normal(cols).astype("float16"), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [rows, depth])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [rows, cols])],
        initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("korch", [False, True])
def test_a_float16_model_compiles_and_verifies_with_the_defaults(korch):
    """Both paths differ from ONNX Runtime by a few float16 ULPs (TVM accumulates in float16);
    the fixed float32 tolerance 1e-4 failed every float16 model."""
    from korch_tvm.pipeline.compile import compile_model

    _, report = compile_model(float16_onnx(), korch=korch)
    verification = report["verification"]
    assert verification["reference"] == "onnxruntime" and verification["passed"], verification
    assert verification["tolerance"] == 2.0 ** -6
    assert 1e-4 < verification["max_rel_error"] < 2.0 ** -6  # beyond float32's, within float16's


def test_a_verification_failure_says_what_to_do():
    from korch_tvm.pipeline.compile import compile_model

    with pytest.raises(KorchError) as failure:
        compile_model(float16_onnx(), korch=False, verify_tolerance=1e-6)
    message = str(failure.value)
    assert "\n" not in message and "above the tolerance 1e-06" in message
    assert "raise --verify-tolerance" in message and "--exact-math" in message
    assert "report it with the model" in message
