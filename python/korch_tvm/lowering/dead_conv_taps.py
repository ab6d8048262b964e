"""Convolution taps that only ever read padding, cut from the kernel.

A dilated convolution on a small feature map can have taps whose every read falls in the zero
padding: DeepLabv3's atrous pyramid runs 3x3 convolutions with dilation 24 and 36 on a 16x16 map,
so eight of the nine taps multiply zeros, and TVM computes them all on a buffer padded to 88x88.
Dropping a dead tap removes terms that are exactly zero for finite weights, so the result is the
same convolution with a smaller kernel and less padding (a 1x1 convolution in that example, a
ninth of the work). Only taps at the kernel's edges are cut, axis by axis, so the kept taps stay
a dense kernel with the same dilation.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .constant_conv import constant_conv
from .mutation import mutate_relax_functions


def live_tap_range(size: int, out: int, kernel: int, stride: int, dilation: int,
                   pad_before: int) -> tuple[int, int]:
    """First and last tap (along one spatial axis) that reads a real input element for some
    output position: tap t of output o reads input o*stride + t*dilation - pad_before."""
    live = [t for t in range(kernel)
            if any(0 <= o * stride + t * dilation - pad_before < size for o in range(out))]
    return (live[0], live[-1]) if live else (0, kernel - 1)


def trimmed_conv2d(call: relax.Call) -> relax.Call | None:
    """`call` (a conv2d) with its dead edge taps cut, or None when every tap is live or it is
    not a `constant_conv`."""
    conv = constant_conv(call)
    if conv is None:
        return None
    keep, new_padding = [slice(None)] * 4, list(conv.padding)
    for spatial, letter in enumerate("HW"):
        size, out, kernel, stride, dil, pad = conv.along(spatial)
        first, last = live_tap_range(size, out, kernel, stride, dil, pad)
        new_padding[spatial] -= first * dil
        new_padding[spatial + 2] -= (kernel - 1 - last) * dil
        keep[conv.axis(letter)[1]] = slice(first, last + 1)
    if min(new_padding) < 0 or new_padding == conv.padding:
        return None
    return conv.conv2d(conv.data, conv.weight[tuple(keep)], new_padding, conv.dilation)


@relax.expr_functor.mutator
class _DeadTapTrimmer(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.nn.conv2d":
            return call
        trimmed = trimmed_conv2d(call)
        return call if trimmed is None else trimmed


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.TrimDeadConvTaps")
class TrimDeadConvTaps:
    """Every conv2d with a constant weight loses the edge taps that read only padding."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return mutate_relax_functions(_DeadTapTrimmer(mod), mod)
