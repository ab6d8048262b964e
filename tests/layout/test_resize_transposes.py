"""A transpose after an upsampling resize is moved onto the resize's smaller input."""

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.layout.activations import convert_layout
from korch_tvm.layout.resize_transposes import transpose_before_upsampling

from test_activations import run_module

SMALL, LARGE = 8, 32


def conv_then_resize(size: int, then_relu: bool = False) -> tvm.IRModule:
    """conv (NCHW, 4 -> 5 channels, 8x8) -> bilinear resize to `size` x `size` [-> relu]."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 4, SMALL, SMALL), "float32"))
    weight = relax.const(rng.standard_normal((5, 4, 3, 3)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, weight, padding=1))
            y = builder.emit(relax.op.image.resize2d(
                y, (size, size), method="linear", coordinate_transformation_mode="half_pixel"))
            if then_relu:
                y = builder.emit(relax.op.nn.relu(y))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def resize_layouts(mod) -> list[tuple[str, tuple[int, ...]]]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(
        (str(e.attrs.layout), tuple(int(d) for d in e.ty.shape.values)))
        if isinstance(e, relax.Call) and e.op.name == "relax.image.resize2d" else None)
    return found


def transposed_shapes(mod) -> list[tuple[int, ...]]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(
        tuple(int(d) for d in e.ty.shape.values))
        if isinstance(e, relax.Call) and e.op.name == "relax.permute_dims"
        and not isinstance(e.args[0], tvm.ir.expr.Constant) else None)
    return found


def test_the_model_output_is_transposed_before_it_is_upsampled():
    mod = conv_then_resize(LARGE)
    nhwc = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(mod)
    assert resize_layouts(nhwc) == [("NHWC", (1, LARGE, LARGE, 5))]
    assert (1, 5, LARGE, LARGE) in transposed_shapes(nhwc)
    moved = transpose_before_upsampling(nhwc)
    assert resize_layouts(moved) == [("NCHW", (1, 5, LARGE, LARGE))]
    assert transposed_shapes(moved) == [(1, SMALL, SMALL, 4), (1, 5, SMALL, SMALL)]
    x = np.random.default_rng(1).standard_normal((1, 4, SMALL, SMALL)).astype("float32")
    np.testing.assert_allclose(run_module(moved, x), run_module(mod, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [4, SMALL])
def test_a_resize_to_no_more_elements_keeps_its_transpose_after_it(size):
    nhwc = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(
        conv_then_resize(size))
    tvm.ir.assert_structural_equal(transpose_before_upsampling(nhwc), nhwc)


def test_convert_layout_moves_it():
    mod = conv_then_resize(LARGE)
    converted = convert_layout(mod, "NHWC")
    assert resize_layouts(converted) == [("NCHW", (1, 5, LARGE, LARGE))]
    x = np.random.default_rng(2).standard_normal((1, 4, SMALL, SMALL)).astype("float32")
    np.testing.assert_allclose(run_module(converted, x), run_module(mod, x), rtol=1e-5,
                               atol=1e-5)


def test_a_resize_with_an_operator_before_the_transpose_is_left_alone():
    """The transpose must read the resize itself: a relu in between stays in NHWC with it."""
    nhwc = convert_layout(conv_then_resize(LARGE, then_relu=True), "NHWC")
    assert resize_layouts(nhwc) == [("NHWC", (1, LARGE, LARGE, 5))]
