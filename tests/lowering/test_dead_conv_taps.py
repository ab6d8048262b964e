"""Convolution taps that read only padding, cut (where they do on every output) or summed over
their live outputs only (where they do on most): the same outputs from less work."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.lowering.conv_tap_sum import LIVE_SHARE_TO_SPLIT, SumLiveConvTaps, live_window
from korch_tvm.lowering.dead_conv_taps import TrimDeadConvTaps, live_tap_range
from korch_tvm.lowering.fission import lower_to_primitives, lowering_stats


def conv_module(in_shape, weight, *, layout, stride=1, padding, dilation, groups=1):
    kernel_layout = "OIHW" if layout == "NCHW" else "HWIO"
    data = relax.Var("x", relax.TensorType(in_shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [data]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(relax.op.nn.conv2d(
                data, relax.const(weight), strides=[stride, stride], padding=padding,
                dilation=dilation if isinstance(dilation, list) else [dilation, dilation],
                groups=groups, data_layout=layout,
                kernel_layout=kernel_layout)))
        builder.emit_func_output(out)
    return builder.get()


def conv_calls(mod) -> list[relax.Call]:
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda expr: calls.append(expr) if isinstance(
        expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d" else None)
    return calls


def conv_weights(mod) -> list[tuple[int, ...]]:
    return [tuple(call.args[1].value.shape) for call in conv_calls(mod)]


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


def test_live_windows_along_one_axis():
    # DeepLabv3's dilation 12 on 16: the outer taps read inputs on four outputs each
    assert [live_window(16, 16, 1, 12, 12, tap) for tap in range(3)] == [(12, 16), (0, 16),
                                                                          (0, 4)]
    # an ordinary 3x3 with padding 1: only the edge outputs lose a tap
    assert [live_window(8, 8, 1, 1, 1, tap) for tap in range(3)] == [(1, 8), (0, 8), (0, 7)]
    # stride 2, dilation 10 on 13: tap 0 reads inputs 0 and 2 from outputs 5 and 6
    assert live_window(13, 7, 2, 10, 10, 0) == (5, 7)
    # a tap that reads only padding
    assert live_window(2, 5, 1, 1, 5, 0) == (0, 0)


def macs(conv: relax.Call) -> int:
    """Multiply-adds of a conv2d: every weight times every output position."""
    outputs = int(np.prod([int(dim) for dim in conv.ty.shape.values]))
    return int(conv.args[1].value.numpy().size) * outputs // 12  # 12 output channels


# (layout, input HxW, kernel, stride, padding, dilation, groups, summed by taps)
TAP_CASES = [
    ("NCHW", (16, 16), 3, 1, [12] * 4, 12, 1, True),  # DeepLabv3's atrous pyramid, dilation 12
    ("NHWC", (16, 16), 3, 1, [12] * 4, 12, 1, True),
    ("NCHW", (10, 16), 3, 1, [9, 12, 9, 12], [9, 12], 2, True),  # per-axis dilation, grouped
    ("NHWC", (13, 13), 3, 2, [10, 10, 10, 10], 10, 1, True),  # strided, odd size
    ("NCHW", (16, 16), 3, 1, [1] * 4, 1, 1, False),  # an ordinary 3x3: almost all live
    ("NCHW", (16, 16), 3, 1, [6] * 4, 6, 1, False),  # 2 of 3 taps on 12 of 16: 0.56 live
]


@pytest.mark.parametrize("layout,size,kernel,stride,padding,dilation,groups,summed", TAP_CASES)
def test_tap_sum_gives_the_same_outputs(layout, size, kernel, stride, padding, dilation, groups,
                                        summed):
    rng = np.random.default_rng(1)
    channels, out_channels = 8, 12
    in_shape = (1, channels, *size) if layout == "NCHW" else (1, *size, channels)
    oihw = rng.standard_normal((out_channels, channels // groups, kernel, kernel), "float32")
    weight = oihw if layout == "NCHW" else np.ascontiguousarray(oihw.transpose(2, 3, 1, 0))
    dilation = dilation if isinstance(dilation, list) else [dilation, dilation]
    mod = conv_module(in_shape, weight, layout=layout, stride=stride, padding=padding,
                      dilation=dilation, groups=groups)
    assert conv_calls(SumLiveConvTaps()(mod)) == conv_calls(mod)  # too few multiply-adds
    split = SumLiveConvTaps(min_dead_macs=0)(mod)
    convs = conv_calls(split)
    if not summed:
        assert split.same_as(mod) or tvm_ffi.structural_equal(split, mod)
        return
    assert len(convs) == kernel * kernel  # every tap is live on some output here
    for call in convs:
        taps = call.args[1].value.shape[2:] if layout == "NCHW" else call.args[1].value.shape[:2]
        assert tuple(taps) == (1, 1) and list(call.attrs.padding) == [0, 0, 0, 0]
    assert sum(map(macs, convs)) < macs(conv_calls(mod)[0]) * LIVE_SHARE_TO_SPLIT
    x = rng.standard_normal(in_shape, "float32")
    np.testing.assert_allclose(run(split, x), run(mod, x), rtol=1e-5, atol=1e-5)


def test_lowering_splits_and_an_infinite_weight_is_left_alone():
    # DeepLabv3's: 566 M multiply-adds, 3/4 dead
    weight = np.ones((256, 960, 3, 3), "float32")
    mod = conv_module((1, 960, 16, 16), weight, layout="NCHW", padding=[12] * 4, dilation=12)
    assert len(conv_calls(lower_to_primitives(mod))) == 9
    # dead multiply-adds: filters x 960 channels x 256 outputs x 9 taps x 3/4 = filters x 1.66 M
    for filters, convs in ((6, 1), (7, 9)):  # 9.95 M: not worth a split; 11.6 M: split
        assert len(conv_calls(SumLiveConvTaps()(conv_module(
            (1, 960, 16, 16), weight[:filters], layout="NCHW", padding=[12] * 4,
            dilation=12)))) == convs
    weight[1, 2, 0, 2] = -np.inf
    infinite = conv_module((1, 960, 16, 16), weight, layout="NCHW", padding=[12] * 4,
                           dilation=12)
    assert len(conv_calls(SumLiveConvTaps(min_dead_macs=0)(infinite))) == 1


def test_the_lowering_report_counts_both_rewrites():
    weight = np.ones((256, 960, 3, 3), "float32")
    builder = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType((1, 960, 16, 16), "float32"))
    with builder.function("main", [data]):
        with builder.dataflow():
            convs = [builder.emit(relax.op.nn.conv2d(
                data, relax.const(weight), padding=[rate] * 4, dilation=[rate, rate]))
                for rate in (1, 12, 24, 36)]  # live, summed, cut to 1x1, cut to 1x1
            out = builder.emit_output(builder.emit(relax.op.concat(convs, axis=1)))
        builder.emit_func_output(out)
    mod = builder.get()
    stats = lowering_stats(mod, lower_to_primitives(mod))
    assert stats["convolutions"] == {"dead_taps_cut": 2, "summed_over_live_taps": 1}
