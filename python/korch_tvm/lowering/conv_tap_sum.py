"""A convolution that reads padding on most of its taps, computed as a sum over its taps.

`dead_conv_taps` cuts taps that read only padding. A tap can also be live on a few outputs
and dead on the rest: DeepLabv3's 3x3 convolution with dilation 12 on a 16x16 map reads real
inputs through its outer taps on 4 of 16 rows and columns only, so three quarters of its
multiply-adds are by padding zeros, and TVM computes them all. Each tap is a 1x1 convolution
(a GEMM) of the input shifted by the tap's offset; it is live on a window of outputs, a
rectangle, which it computes from a crop of the input. The taps' windows, zero-padded to the
output and added, are the convolution, for finite weights exactly (an infinite weight times a
padding zero would be NaN). Splitting the output into regions with the same live taps instead
reads an outer tap's weights once per region (up to four times): measured on that convolution
alone, 2.47 ms by regions against 1.56 ms by taps (3.75 ms unsplit).

Rewritten only where at most `LIVE_SHARE_TO_SPLIT` of the multiply-adds are live, at least
`MIN_DEAD_MACS` are dead, and the kernel has at most `MAX_TAPS` taps: each tap is a kernel
call and a padded add, an ordinary padded convolution loses a sliver of its edge taps only,
and a tiny one (a 3x3 depthwise convolution on a 2x2 map in SSDlite's head) saves less than a
kernel call costs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .mutation import mutate_relax_functions
from .shapes import static_dims

LIVE_SHARE_TO_SPLIT = 0.5
MIN_DEAD_MACS = 10**7
MAX_TAPS = 9


def live_window(size: int, out: int, stride: int, dilation: int, pad_before: int,
                tap: int) -> tuple[int, int]:
    """The outputs [o0, o1) on which `tap` reads a real input along one axis (o0 == o1: none).
    Tap t of output o reads input o*stride + t*dilation - pad_before."""
    live = [o for o in range(out) if 0 <= o * stride + tap * dilation - pad_before < size]
    return (live[0], live[-1] + 1) if live else (0, 0)


def _int_list(values) -> list[int]:
    return [int(v) for v in values]


class _Conv:
    """The conv2d the taps are cut from: layouts, static shapes, attributes, and each tap's
    live window per spatial axis."""

    def __init__(self, call: relax.Call):
        attrs = call.attrs
        self.data, self.weight = call.args[0], call.args[1].value.numpy()
        self.data_layout, self.kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
        self.strides, self.dilation = _int_list(attrs.strides), _int_list(attrs.dilation)
        self.padding = _int_list(attrs.padding)  # top, left, bottom, right
        self.groups, self.out_dtype = int(attrs.groups), attrs.out_dtype
        self.in_shape, self.out_shape = static_dims(call.args[0]), static_dims(call)

    def axis(self, letter: str) -> tuple[int, int]:
        """The data's and the kernel's index of spatial axis `letter` (H or W)."""
        return self.data_layout.index(letter), self.kernel_layout.index(letter)

    def windows(self, spatial: int) -> list[tuple[int, int]]:
        """Each tap's live window along spatial axis 0 (H) or 1 (W)."""
        data_axis, kernel_axis = self.axis("HW"[spatial])
        return [live_window(self.in_shape[data_axis], self.out_shape[data_axis],
                            self.strides[spatial], self.dilation[spatial],
                            self.padding[spatial], tap)
                for tap in range(self.weight.shape[kernel_axis])]

    def tap(self, taps: tuple[int, int], windows) -> relax.Expr:
        """The 1x1 convolution of tap (row, column) over its live window (rows, columns)."""
        begin, end, picked = [], [], [slice(None)] * 4
        for spatial, (tap, (o0, o1)) in enumerate(zip(taps, windows)):
            stride = self.strides[spatial]
            first = o0 * stride + tap * self.dilation[spatial] - self.padding[spatial]
            begin.append(first)
            end.append(first + (o1 - o0 - 1) * stride + 1)
            picked[self.axis("HW"[spatial])[1]] = slice(tap, tap + 1)
        crop = relax.op.strided_slice(self.data, axes=[self.axis("H")[0], self.axis("W")[0]],
                                      begin=begin, end=end)
        weight = np.ascontiguousarray(self.weight[tuple(picked)])
        return relax.op.nn.conv2d(
            crop, relax.const(weight, str(weight.dtype)), strides=self.strides,
            padding=[0, 0, 0, 0], dilation=[1, 1], groups=self.groups,
            data_layout=self.data_layout, kernel_layout=self.kernel_layout,
            out_layout=self.data_layout, out_dtype=self.out_dtype)

    def padding_to_output(self, windows) -> list[int]:
        """`nn.pad` widths that place a tap's window in the whole output."""
        widths = [0] * (2 * len(self.out_shape))
        for spatial, (o0, o1) in enumerate(windows):
            data_axis = self.axis("HW"[spatial])[0]
            widths[2 * data_axis: 2 * data_axis + 2] = [o0, self.out_shape[data_axis] - o1]
        return widths


def live_taps(call: relax.Call, min_dead_macs: int = MIN_DEAD_MACS):
    """The conv2d of `call` and its live taps as ((row, column), (row window, column window)),
    widest window first, when it is worth a sum over taps; None when it is not (see the
    module's docstring), or its weight is not a finite constant, a shape is not static, or a
    layout is not a plain four-letter one."""
    attrs = call.attrs
    if (not isinstance(call.args[1], tvm.ir.expr.Constant)
            or sorted(str(attrs.data_layout)) != sorted("NCHW")
            or sorted(str(attrs.kernel_layout)) != sorted("OIHW")
            or str(attrs.out_layout) != str(attrs.data_layout)):
        return None
    conv = _Conv(call)
    if conv.in_shape is None or conv.out_shape is None or not np.all(np.isfinite(conv.weight)):
        return None
    rows, cols = conv.windows(0), conv.windows(1)
    taps = [((r, c), (rows[r], cols[c])) for r in range(len(rows)) for c in range(len(cols))]
    if len(taps) > MAX_TAPS:
        return None
    outputs = conv.out_shape[conv.axis("H")[0]] * conv.out_shape[conv.axis("W")[0]]
    live = sum((r1 - r0) * (c1 - c0) for _, ((r0, r1), (c0, c1)) in taps) / (outputs * len(taps))
    macs = conv.weight.size * int(np.prod(conv.out_shape)) // conv.weight.shape[
        conv.kernel_layout.index("O")]
    if live > LIVE_SHARE_TO_SPLIT or macs * (1 - live) < min_dead_macs:
        return None
    taps = [(tap, windows) for tap, windows in taps
            if windows[0][1] > windows[0][0] and windows[1][1] > windows[1][0]]
    taps.sort(key=lambda item: -(item[1][0][1] - item[1][0][0]) * (item[1][1][1] - item[1][1][0]))
    return conv, taps


@relax.expr_functor.mutator
class _TapSummer(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, min_dead_macs: int):
        super().__init__(mod)
        self.min_dead_macs = min_dead_macs

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.nn.conv2d":
            return call
        found = live_taps(call, self.min_dead_macs)
        if found is None:
            return call
        conv, taps = found
        total = None
        for tap, windows in taps:
            term = self.builder_.emit(conv.tap(tap, windows))
            widths = conv.padding_to_output(windows)
            if any(widths):
                term = self.builder_.emit(relax.op.nn.pad(term, widths))
            total = term if total is None else self.builder_.emit(relax.op.add(total, term))
        return total


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.SumLiveConvTaps")
class SumLiveConvTaps:
    """Every conv2d with a constant weight whose taps are mostly dead is computed as a sum of
    its taps, each over the outputs where it is live; `min_dead_macs` as `MIN_DEAD_MACS`."""

    def __init__(self, min_dead_macs: int = MIN_DEAD_MACS):
        self.min_dead_macs = min_dead_macs

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return mutate_relax_functions(_TapSummer(mod, self.min_dead_macs), mod)
