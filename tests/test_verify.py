import numpy as np
import pytest

from korch_tvm.errors import KorchError
from korch_tvm.verify import compare, random_inputs


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
