"""The extension's convolutions (im2col + GEMM, and the direct kernel for narrow groups) against
a numpy reference, and their refusals."""

import numpy as np
import pytest
import tvm

RNG = np.random.default_rng(3)


def reference_conv(x, w, stride, pad, dilation, groups, pad_after=None):
    """NCHW/OIHW convolution in float64: every output a sum over its zero-padded window."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (pt, pl), (dh, dw) = stride, pad, dilation
    pb, pr = pad_after if pad_after is not None else pad
    padded = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    padded[:, :, pt:pt + h, pl:pl + wd] = x
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    y = np.zeros((n, k, p, q))
    kg = k // groups
    for g in range(groups):
        for kr in range(r):
            for ks in range(s):
                window = padded[:, g * cg:(g + 1) * cg,
                                kr * dh:kr * dh + sh * (p - 1) + 1:sh,
                                ks * dw:ks * dw + sw * (q - 1) + 1:sw]
                y[:, g * kg:(g + 1) * kg] += np.einsum("ncpq,kc->nkpq", window,
                                                       w[g * kg:(g + 1) * kg, :, kr, ks])
    return y


def sconv2d(x, w, nhwc, stride, pad, dilation, groups, out_shape, steps=None, operands=()):
    y = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype="float32"))
    epilogue = () if steps is None else (steps, *[tvm.runtime.tensor(o) for o in operands])
    tvm.get_global_func("korch_tvm.blas.sconv2d")(
        tvm.runtime.tensor(x), tvm.runtime.tensor(w), int(nhwc), *stride, *pad, *dilation,
        groups, *epilogue, y)
    return y.numpy()


def rel_err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


CASES = [  # (N, C, H, W), (K, C/G, R, S), stride, pad (top, left), dilation, groups, pad after
    ((1, 8, 9, 11), (6, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1, None),
    ((2, 3, 17, 16), (5, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1, None),      # a stem, 2 images
    ((1, 6, 12, 12), (4, 6, 3, 3), (1, 2), (2, 0), (2, 1), 1, (2, 1)),     # dilated, asymmetric
    ((1, 8, 10, 10), (12, 2, 3, 3), (1, 1), (1, 1), (1, 1), 4, None),     # grouped
    ((1, 16, 7, 5), (9, 16, 1, 1), (1, 1), (0, 0), (1, 1), 1, None),      # pointwise: X as is
    ((1, 16, 8, 8), (9, 16, 1, 1), (2, 2), (0, 0), (1, 1), 1, None),      # strided 1x1
    ((1, 4, 6, 6), (4, 4, 3, 3), (1, 1), (0, 0), (1, 1), 1, (1, 1)),      # padding after only
]


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_sconv2d_matches_the_reference(blas_extension, case, nhwc):
    x_shape, w_shape, stride, pad, dilation, groups, pad_after = case
    x, w = RNG.standard_normal(x_shape, "float32"), RNG.standard_normal(w_shape, "float32")
    want = reference_conv(x, w, stride, pad, dilation, groups, pad_after)
    if nhwc:
        got = sconv2d(x.transpose(0, 2, 3, 1).copy(), w.transpose(2, 3, 1, 0).copy(), True,
                      stride, pad, dilation, groups, want.transpose(0, 2, 3, 1).shape)
        got = got.transpose(0, 3, 1, 2)
    else:
        got = sconv2d(x, w, False, stride, pad, dilation, groups, want.shape)
    assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("nhwc", [False, True])
def test_sconv2d_applies_a_per_channel_bias_residual_and_activation(blas_extension, nhwc):
    x, w = RNG.standard_normal((2, 6, 9, 9), "float32"), RNG.standard_normal((8, 6, 3, 3),
                                                                             "float32")
    bias = RNG.standard_normal(8, "float32")
    conv = reference_conv(x, w, (1, 1), (1, 1), (1, 1), 1)
    residual = RNG.standard_normal(conv.shape, "float32")
    want = np.clip(conv + bias[None, :, None, None] + residual, 0.0, 6.0)
    if nhwc:
        got = sconv2d(x.transpose(0, 2, 3, 1).copy(), w.transpose(2, 3, 1, 0).copy(), True,
                      (1, 1), (1, 1), (1, 1), 1, (2, 9, 9, 8), "bias_n residual clip:0.0:6.0",
                      [bias.reshape(1, 1, 1, 8), residual.transpose(0, 2, 3, 1).copy()])
        got = got.transpose(0, 3, 1, 2)
    else:
        got = sconv2d(x, w, False, (1, 1), (1, 1), (1, 1), 1, (2, 8, 9, 9),
                      "bias_m residual clip:0.0:6.0",
                      [bias.reshape(1, 8, 1, 1), residual.astype("float32")])
    assert rel_err(got, want) <= 1e-5


def test_sconv2d_refuses_operands_that_do_not_fit_before_y_is_written(blas_extension):
    x, w = np.ones((1, 8, 6, 6), "float32"), np.ones((4, 8, 3, 3), "float32")
    cases = [
        (dict(w=np.ones((4, 3, 3, 3), "float32")), "4 groups|input channels per group"),
        (dict(groups=3), "3 groups do not divide"),
        (dict(stride=(0, 1)), "must be >= 1"),
        (dict(pad=(-1, 0)), "negative padding"),
        (dict(out=(1, 5, 6, 6)), "W's 4 filters"),
        (dict(steps="bias_m", operands=[np.ones(5, "float32")]), "bias_m must have M elements"),
    ]
    for change, message in cases:
        args = dict(x=x, w=w, nhwc=False, stride=(1, 1), pad=(1, 1), dilation=(1, 1), groups=1,
                    out=(1, 4, 6, 6), steps=None, operands=())
        args.update(change)
        y = tvm.runtime.tensor(np.zeros(args["out"], "float32"))
        epilogue = () if args["steps"] is None else (
            args["steps"], *[tvm.runtime.tensor(o) for o in args["operands"]])
        with pytest.raises(ValueError, match=message):
            tvm.get_global_func("korch_tvm.blas.sconv2d")(
                tvm.runtime.tensor(args["x"]), tvm.runtime.tensor(args["w"]), 0, *args["stride"],
                *args["pad"], *args["dilation"], args["groups"], *epilogue, y)
        assert not y.numpy().any(), change


def sgconv2d(x, w, stride, pad, dilation, groups, out_shape, steps=None, operands=()):
    """The direct grouped kernel, NHWC / HWIO operands from NCHW / OIHW ones; Y back in NCHW."""
    y = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype="float32"))
    epilogue = () if steps is None else (steps, *[tvm.runtime.tensor(o) for o in operands])
    tvm.get_global_func("korch_tvm.blas.sgconv2d")(
        tvm.runtime.tensor(x.transpose(0, 2, 3, 1).copy()),
        tvm.runtime.tensor(w.transpose(2, 3, 1, 0).copy()), 1, *stride, *pad, *dilation, groups,
        *epilogue, y)
    return y.numpy().transpose(0, 3, 1, 2)


GROUPED_CASES = [  # (N, C, H, W), (K, C/G, R, S), stride, pad (top, left), dilation, groups, after
    ((1, 48, 12, 12), (48, 8, 3, 3), (2, 2), (1, 1), (1, 1), 6, None),     # RegNet's, strided
    ((2, 16, 9, 13), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 2, None),      # Q not a tile multiple
    ((1, 32, 7, 7), (32, 4, 3, 3), (1, 1), (1, 1), (1, 1), 8, None),       # 4 per group
    ((1, 12, 6, 10), (32, 6, 3, 3), (1, 2), (2, 0), (2, 1), 2, (2, 1)),    # C/G 6, K/G 16, dilated
    ((1, 64, 5, 5), (64, 16, 3, 3), (1, 1), (1, 1), (1, 1), 4, None),      # 16 per group
    ((1, 32, 4, 6), (32, 8, 1, 3), (1, 1), (0, 1), (1, 1), 4, None),       # 1x3 window
    ((1, 8, 5, 5), (16, 4, 3, 3), (1, 1), (0, 0), (1, 1), 2, (1, 1)),      # padding after only
]


@pytest.mark.parametrize("case", GROUPED_CASES, ids=[f"case{i}" for i in range(len(GROUPED_CASES))])
def test_sgconv2d_matches_the_reference(blas_extension, case):
    x_shape, w_shape, stride, pad, dilation, groups, pad_after = case
    x, w = RNG.standard_normal(x_shape, "float32"), RNG.standard_normal(w_shape, "float32")
    want = reference_conv(x, w, stride, pad, dilation, groups, pad_after)
    got = sgconv2d(x, w, stride, pad, dilation, groups, want.transpose(0, 2, 3, 1).shape)
    assert rel_err(got, want) <= 1e-5


def test_sgconv2d_applies_a_per_channel_bias_and_activation(blas_extension):
    x, w = RNG.standard_normal((1, 24, 8, 8), "float32"), RNG.standard_normal((24, 8, 3, 3),
                                                                              "float32")
    bias = RNG.standard_normal(24, "float32")
    want = np.maximum(reference_conv(x, w, (1, 1), (1, 1), (1, 1), 3)
                      + bias[None, :, None, None], 0.0)
    got = sgconv2d(x, w, (1, 1), (1, 1), (1, 1), 3, (1, 8, 8, 24), "bias_n relu",
                   [bias.reshape(1, 1, 1, 24)])
    assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("nhwc, groups, width, message", [
    (True, 4, 3, "groups of 4, 8 or 16 output channels, got 4 groups of 3"),
    (True, 2, 32, "got 2 groups of 32"),
    (True, 1, 8, "at least 2 groups"),
    (False, 2, 8, "in NCHW"),
])
def test_sgconv2d_refuses_what_it_has_no_kernel_for(blas_extension, nhwc, groups, width,
                                                     message):
    k = groups * width
    x = np.ones((1, k, 6, 6) if not nhwc else (1, 6, 6, k), "float32")
    w = np.ones((k, width, 3, 3) if not nhwc else (3, 3, width, k), "float32")
    y = tvm.runtime.tensor(np.zeros(x.shape, "float32"))
    with pytest.raises(ValueError, match=message):
        tvm.get_global_func("korch_tvm.blas.sgconv2d")(
            tvm.runtime.tensor(x), tvm.runtime.tensor(w), int(nhwc), 1, 1, 1, 1, 1, 1, groups, y)
    assert not y.numpy().any()
