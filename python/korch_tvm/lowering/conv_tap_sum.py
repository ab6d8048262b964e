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

import tvm
from tvm import relax

from .constant_conv import ConstantConv, constant_conv
from .mutation import mutate_relax_functions

LIVE_SHARE_TO_SPLIT = 0.5
MIN_DEAD_MACS = 10**7
MAX_TAPS = 9


def live_window(size: int, out: int, stride: int, dilation: int, pad_before: int,
                tap: int) -> tuple[int, int]:
    """The outputs [o0, o1) on which `tap` reads a real input along one axis (o0 == o1: none).
    Tap t of output o reads input o*stride + t*dilation - pad_before."""
    live = [o for o in range(out) if 0 <= o * stride + tap * dilation - pad_before < size]
    return (live[0], live[-1] + 1) if live else (0, 0)


def tap_windows(conv: ConstantConv, spatial: int) -> list[tuple[int, int]]:
    """Each tap's live window along spatial axis 0 (H) or 1 (W)."""
    size, out, kernel, stride, dilation, pad_before = conv.along(spatial)
    return [live_window(size, out, stride, dilation, pad_before, tap) for tap in range(kernel)]


def tap_conv(conv: ConstantConv, taps: tuple[int, int], windows) -> relax.Expr:
    """The 1x1 convolution of tap (row, column) over its live window (rows, columns)."""
    begin, end, picked = [], [], [slice(None)] * 4
    for spatial, (tap, (o0, o1)) in enumerate(zip(taps, windows)):
        stride = conv.strides[spatial]
        first = o0 * stride + tap * conv.dilation[spatial] - conv.padding[spatial]
        begin.append(first)
        end.append(first + (o1 - o0 - 1) * stride + 1)
        picked[conv.axis("HW"[spatial])[1]] = slice(tap, tap + 1)
    crop = relax.op.strided_slice(conv.data, axes=[conv.axis("H")[0], conv.axis("W")[0]],
                                  begin=begin, end=end)
    return conv.conv2d(crop, conv.weight[tuple(picked)], [0, 0, 0, 0], [1, 1])


def padding_to_output(conv: ConstantConv, windows) -> list[int]:
    """`nn.pad` widths that place a tap's window (rows, columns) in the whole output."""
    widths = [0] * (2 * len(conv.out_shape))
    for spatial, (o0, o1) in enumerate(windows):
        data_axis = conv.axis("HW"[spatial])[0]
        widths[2 * data_axis: 2 * data_axis + 2] = [o0, conv.out_shape[data_axis] - o1]
    return widths


def _area(windows) -> int:
    (r0, r1), (c0, c1) = windows  # live_window never ends before it starts
    return (r1 - r0) * (c1 - c0)


def live_taps(call: relax.Call, min_dead_macs: int = MIN_DEAD_MACS):
    """The conv2d of `call` read (`constant_conv`) and its live taps as ((row, column),
    (row window, column window)), widest window first, when it is worth a sum over taps;
    None when it is not (see the module's docstring) or not a `constant_conv`."""
    conv = constant_conv(call)
    if conv is None:
        return None
    rows, cols = tap_windows(conv, 0), tap_windows(conv, 1)
    taps = [((r, c), (rows[r], cols[c])) for r in range(len(rows)) for c in range(len(cols))]
    if len(taps) > MAX_TAPS:
        return None
    outputs = conv.out_shape[conv.axis("H")[0]] * conv.out_shape[conv.axis("W")[0]]
    live = sum(_area(windows) for _, windows in taps) / (outputs * len(taps))
    if live > LIVE_SHARE_TO_SPLIT or conv.macs() * (1 - live) < min_dead_macs:
        return None
    taps = sorted((item for item in taps if _area(item[1])), key=lambda item: -_area(item[1]))
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
            term = self.builder_.emit(tap_conv(conv, tap, windows))
            widths = padding_to_output(conv, windows)
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
