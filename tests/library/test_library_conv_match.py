"""Convolution kernels as library calls: every form the matcher accepts (layouts, strides,
dilations, groups, paddings, epilogues) is read with the right geometry and the library call
computes what TVM's fused kernel computes; forms it must not accept are left to TVM."""

import numpy as np
import pytest
import tvm
from tvm import relax, te

from korch_tvm.costing.library_costs import entry_key, entry_problem
from korch_tvm.library import ConvSpec, UseLibraryGemm, implementations_for, match_conv, match_gemm
from test_library_epilogue import fused_module, kernels, rel_err, run

R = relax.op
NHWC = dict(data_layout="NHWC", kernel_layout="HWIO")

CASES = {  # name: (input shapes, body, expected spec fields, the steps matched)
    "3x3_bias_relu": (
        [(1, 8, 12, 12), (16, 8, 3, 3), (1, 16, 1, 1)],
        lambda x, w, b: R.nn.relu(R.add(R.nn.conv2d(x, w, padding=1), b)),
        dict(nhwc=False, c=8, k=16, r=3, p=12, q=12, stride=(1, 1), pad=(1, 1), groups=1),
        ["bias_m", "relu"]),
    "stem_7x7_stride_2": (
        [(1, 3, 32, 32), (8, 3, 7, 7)], lambda x, w: R.nn.conv2d(x, w, strides=2, padding=3),
        dict(nhwc=False, c=3, k=8, r=7, p=16, q=16, stride=(2, 2), pad=(3, 3)), []),
    "nhwc_dilated_asymmetric_bias": (
        [(2, 15, 14, 6), (3, 3, 6, 10), (1, 1, 1, 10)],
        lambda x, w, b: R.add(R.nn.conv2d(x, w, strides=(2, 1), padding=(2, 0, 1, 1),
                                          dilation=2, **NHWC), b),
        dict(nhwc=True, n=2, c=6, k=10, p=7, q=11, stride=(2, 1), pad=(2, 0), dilation=(2, 2)),
        ["bias_n"]),
    "grouped_residual": (
        [(1, 8, 10, 10), (12, 2, 3, 3), (1, 12, 10, 10)],
        lambda x, w, r: R.add(R.nn.conv2d(x, w, padding=1, groups=4), r),
        dict(nhwc=False, c=8, k=12, groups=4), ["residual"]),
    "depthwise_relu6": (
        [(1, 6, 9, 9), (6, 1, 3, 3)],
        lambda x, w: R.clip(R.nn.conv2d(x, w, padding=1, groups=6), 0.0, 6.0),
        dict(nhwc=False, c=6, k=6, groups=6), ["clip:0.0:6.0"]),
    "pointwise_strided": (
        [(1, 16, 8, 8), (24, 16, 1, 1)], lambda x, w: R.nn.conv2d(x, w, strides=2),
        dict(nhwc=False, c=16, k=24, r=1, s=1, p=4, q=4, stride=(2, 2), pad=(0, 0)), []),
    "nhwc_grouped_3x3": (
        [(1, 7, 7, 8), (3, 3, 2, 8)], lambda x, w: R.nn.conv2d(x, w, padding=1, groups=4, **NHWC),
        dict(nhwc=True, c=8, k=8, groups=4), []),
    "nhwc_narrow_groups_bias_relu": (
        [(1, 9, 9, 16), (3, 3, 8, 16), (1, 1, 1, 16)],
        lambda x, w, b: R.nn.relu(R.add(R.nn.conv2d(x, w, padding=1, groups=2, **NHWC), b)),
        dict(nhwc=True, c=16, k=16, groups=2), ["bias_n", "relu"]),
}
# The routine each form is computed by where it is not im2col + GEMM: groups of 8 output
# channels, in NHWC, have the extension's direct kernel.
ROUTINES = {"nhwc_narrow_groups_bias_relu": "korch.sgconv2d"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_convolution_form_is_matched_and_computes_tvm_s_result(blas_extension, name):
    shapes, body, fields, steps = CASES[name]
    mod = fused_module(shapes, body)
    [kernel] = [k for k in kernels(mod) if match_conv(k) is not None]
    spec = match_conv(kernel)
    assert {field: getattr(spec, field) for field in fields} == fields
    assert [step.token() for step in spec.epilogue] == steps
    assert match_gemm(kernel) is None
    [implementation] = implementations_for(kernel)
    assert implementation.name == "+".join([ROUTINES.get(name, "openblas.sconv2d")] + steps)
    assert entry_problem(entry_key(implementation), 1e-4) is None
    library = UseLibraryGemm()(mod)
    assert not kernels(library), "the whole fused kernel became the library call"
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s, dtype="float32") for s in shapes]
    assert rel_err(run(library, arrays), run(mod, arrays)) <= 1e-5


def test_a_bias_along_a_spatial_axis_is_no_convolution_epilogue():
    mod = fused_module([(1, 4, 6, 6), (5, 4, 3, 3), (1, 1, 1, 6)],
                       lambda x, w, b: R.add(R.nn.conv2d(x, w, padding=1), b))
    fused = [k for k in kernels(mod) if "conv2d" in k["main"].script()]
    assert fused and all(match_conv(k) is None for k in fused)


def conv_reading(pad_value):
    """A 3x3 NCHW convolution (padding 1) whose padding block stores `pad_value(x, n, c, h, w)`
    inside the image."""
    x = te.placeholder((1, 4, 6, 6), name="x")
    w = te.placeholder((5, 4, 3, 3), name="w")
    padded = te.compute((1, 4, 8, 8), lambda n, c, h, v: tvm.tirx.if_then_else(
        tvm.tirx.all(h >= 1, h < 7, v >= 1, v < 7), pad_value(x, n, c, h - 1, v - 1),
        tvm.tirx.const(0.0, "float32")), name="pad_temp")
    rc, ry, rx = (te.reduce_axis((0, e), name) for e, name in ((4, "rc"), (3, "ry"), (3, "rx")))
    y = te.compute((1, 5, 6, 6), lambda n, k, h, v: te.sum(
        padded[n, rc, h + ry, v + rx] * w[k, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
    return tvm.IRModule({"main": te.create_prim_func([x, w, y])})


def test_the_padding_block_must_copy_the_input():
    spec = match_conv(conv_reading(lambda x, *i: x[i]))
    assert isinstance(spec, ConvSpec) and spec.pad == (1, 1) and spec.k == 5
    relu_first = conv_reading(lambda x, *i: tvm.tirx.max(x[i], tvm.tirx.const(0.0, "float32")))
    assert match_conv(relu_first) is None
    shifted = conv_reading(lambda x, n, c, h, v: x[n, c, h, v - 1 + 1])  # still the copy
    assert match_conv(shifted) is not None


def test_a_padding_condition_that_is_not_the_image_is_refused():
    x = te.placeholder((1, 4, 6, 6), name="x")
    w = te.placeholder((5, 4, 3, 3), name="w")
    wrong = te.compute((1, 4, 8, 8), lambda n, c, h, v: tvm.tirx.if_then_else(
        tvm.tirx.all(h >= 2, h < 7, v >= 1, v < 7), x[n, c, h - 1, v - 1],   # drops a row
        tvm.tirx.const(0.0, "float32")), name="pad_temp")
    rc, ry, rx = (te.reduce_axis((0, e), name) for e, name in ((4, "rc"), (3, "ry"), (3, "rx")))
    y = te.compute((1, 5, 6, 6), lambda n, k, h, v: te.sum(
        wrong[n, rc, h + ry, v + rx] * w[k, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
    assert match_conv(tvm.IRModule({"main": te.create_prim_func([x, w, y])})) is None


def test_a_convolution_of_dynamic_size_is_left_to_tvm():
    n = tvm.tirx.Var("n", "int64")
    h = tvm.tirx.Var("h", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 4, h, 8), "float32"))
    w = relax.Var("w", relax.TensorType((6, 4, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(R.nn.conv2d(x, w, padding=1))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    convs = [k for k in kernels(mod) if "conv2d" in k["main"].script()]
    assert convs and all(match_conv(k) is None for k in convs)
