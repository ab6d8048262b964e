"""Convolution taps that read only padding, cut: the same outputs from a smaller kernel."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.lowering.dead_conv_taps import TrimDeadConvTaps, live_tap_range
from korch_tvm.lowering.fission import lower_to_primitives


def conv_module(in_shape, weight, *, layout, stride=1, padding, dilation, groups=1):
    kernel_layout = "OIHW" if layout == "NCHW" else "HWIO"
    data = relax.Var("x", relax.TensorType(in_shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(relax.op.nn.conv2d(
                data, relax.const(weight), strides=[stride, stride], padding=padding,
                dilation=[dilation, dilation], groups=groups, data_layout=layout,
                kernel_layout=kernel_layout)))
        builder.emit_func_output(out)
    return builder.get()


def conv_weights(mod) -> list[tuple[int, ...]]:
    shapes = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d":
            shapes.append(tuple(expr.args[1].value.shape))

    relax.analysis.post_order_visit(mod["main"], visit)
    return shapes


def run(mod, x):
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


# (layout, input HxW, kernel, stride, padding, dilation, groups, kernel taps kept HxW)
CASES = [
    ("NCHW", (16, 16), 3, 1, [36] * 4, 36, 1, (1, 1)),  # DeepLabv3's atrous pyramid: a 1x1
    ("NHWC", (16, 16), 3, 1, [24] * 4, 24, 1, (1, 1)),
    ("NCHW", (16, 16), 3, 1, [12] * 4, 12, 1, (3, 3)),  # every tap live on some output
    ("NCHW", (8, 20), 3, 1, [10, 10, 10, 10], 10, 4, (1, 3)),  # rows trimmed, columns not
    ("NHWC", (9, 5), 3, 2, [0, 8, 8, 8], 8, 1, (2, 1)),  # strided; padding after only, rows
]


@pytest.mark.parametrize("layout,size,kernel,stride,padding,dilation,groups,kept", CASES)
def test_trimmed_convolution_gives_the_same_outputs(layout, size, kernel, stride, padding,
                                                     dilation, groups, kept):
    rng = np.random.default_rng(0)
    channels, out_channels = 8, 12
    in_shape = (1, channels, *size) if layout == "NCHW" else (1, *size, channels)
    oihw = rng.standard_normal((out_channels, channels // groups, kernel, kernel), "float32")
    weight = oihw if layout == "NCHW" else np.ascontiguousarray(oihw.transpose(2, 3, 1, 0))
    mod = conv_module(in_shape, weight, layout=layout, stride=stride, padding=padding,
                      dilation=dilation, groups=groups)
    trimmed = TrimDeadConvTaps()(mod)
    [shape] = conv_weights(trimmed)
    taps = shape[2:] if layout == "NCHW" else shape[:2]
    assert taps == kept
    x = rng.standard_normal(in_shape, "float32")
    expected = run(mod, x)
    np.testing.assert_allclose(run(trimmed, x), expected, rtol=1e-5, atol=1e-5)
    if kept == (kernel, kernel):
        assert trimmed.same_as(mod) or tvm_ffi.structural_equal(trimmed, mod)


def test_live_taps_along_one_axis():
    # 16 inputs, dilation 24, padding 24: only the centre tap ever reads the input
    assert live_tap_range(16, 16, 3, 1, 24, 24) == (1, 1)
    # dilation 12: the outer taps read inputs 12..15 from outputs 0..3 and 12..15
    assert live_tap_range(16, 16, 3, 1, 12, 12) == (0, 2)
    # padding only after: the last tap is dead, the first is not
    assert live_tap_range(4, 4, 3, 1, 5, 0) == (0, 0)


def test_an_infinite_weight_is_left_alone_and_lowering_trims():
    weight = np.ones((4, 4, 3, 3), "float32")
    mod = conv_module((1, 4, 8, 8), weight, layout="NCHW", padding=[16] * 4, dilation=16)
    assert conv_weights(lower_to_primitives(mod)) == [(4, 4, 1, 1)]
    weight[0, 0, 0, 0] = np.inf  # times a padding zero: NaN in the original, kept so
    infinite = conv_module((1, 4, 8, 8), weight, layout="NCHW", padding=[16] * 4, dilation=16)
    assert conv_weights(TrimDeadConvTaps()(infinite)) == [(4, 4, 3, 3)]
