"""Bilinear resize as a pass along the width and one along the height: TOPI's values, exactly."""

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.lowering.fission import count_operators, lower_to_primitives
from korch_tvm.lowering.separable_resize import MANY_CHANNELS, interpolation_tables

R = relax.op
TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def resize_module(shape, size, layout="NCHW", dtype="float32", **attrs) -> tvm.IRModule:
    attrs = {"method": "linear", "coordinate_transformation_mode": "half_pixel", **attrs}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(R.image.resize2d(x, size, layout=layout, **attrs))
        bb.emit_func_output(out)
    return bb.get()


def run(mod: tvm.IRModule, data: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(data, tvm.cpu())).numpy()


def test_tables_of_an_upsampling_by_sixteen():
    """half_pixel, 16 -> 256: output 0 samples -0.46875 (both neighbours clamp to 0), output 8
    samples 0.03125 (between 0 and 1), the last output 15.46875 (both clamp to 15)."""
    first, second, first_weight, second_weight = interpolation_tables(16, 256, "half_pixel")
    assert (first[0], second[0], first[8], second[8], first[255], second[255]) == (
        0, 0, 0, 1, 15, 15)
    np.testing.assert_allclose([second_weight[0], second_weight[8], second_weight[255]],
                               [0.53125, 0.03125, 0.46875])
    np.testing.assert_allclose(first_weight + second_weight, 1.0)
    assert first.dtype == second.dtype == np.int32


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners",
                                  "asymmetric"])
@pytest.mark.parametrize("layout, shape, size", [
    ("NCHW", (1, 5, 16, 12), (48, 40)),    # up, by different factors per axis
    ("NHWC", (2, 16, 12, 5), (48, 40)),
    ("NCHW", (1, 3, 30, 20), (7, 9)),      # down
    ("NHWC", (1, 1, 1, 8), (16, 16)),      # a 1x1 map spread over 16x16
])
def test_lowered_resize_equals_topi(mode, layout, shape, size):
    mod = resize_module(shape, size, layout, coordinate_transformation_mode=mode)
    lowered = lower_to_primitives(mod)
    counts = count_operators(lowered)
    assert counts["relax.image.resize2d"] == 0
    assert counts["relax.take"] == 4   # both neighbours along each of the two axes
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(run(lowered, data), run(mod, data), rtol=1e-6, atol=1e-6)


def test_an_axis_the_resize_keeps_gets_no_pass():
    """Only the width changes: two takes (its two neighbours), none along the height."""
    lowered = lower_to_primitives(resize_module((1, 4, 10, 6), (10, 24)))
    assert count_operators(lowered)["relax.take"] == 2


@pytest.mark.parametrize("attrs, dtype", [
    ({"method": "nearest_neighbor"}, "float32"),
    ({"method": "cubic"}, "float32"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "float32"),
    ({}, "float16"),
])
def test_other_resizes_stay_one_primitive(attrs, dtype):
    lowered = lower_to_primitives(resize_module((1, 3, 8, 8), (16, 16), dtype=dtype, **attrs))
    assert count_operators(lowered)["relax.image.resize2d"] == 1
    assert count_operators(lowered)["relax.take"] == 0


@pytest.mark.parametrize("layout, shape", [("NCHW", (1, MANY_CHANNELS, 8, 8)),
                                           ("NHWC", (1, 8, 8, MANY_CHANNELS))])
def test_a_resize_of_many_channels_stays_one_primitive(layout, shape):
    """Its kernel can run the vector along the channels, so there is nothing to split."""
    lowered = lower_to_primitives(resize_module(shape, (16, 16), layout))
    assert count_operators(lowered)["relax.image.resize2d"] == 1
