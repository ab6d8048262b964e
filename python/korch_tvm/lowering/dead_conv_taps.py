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

import numpy as np
import tvm
from tvm import relax

from .mutation import mutate_relax_functions
from .shapes import static_dims


def live_tap_range(size: int, out: int, kernel: int, stride: int, dilation: int,
                   pad_before: int) -> tuple[int, int]:
    """First and last tap (along one spatial axis) that reads a real input element for some
    output position: tap t of output o reads input o*stride + t*dilation - pad_before."""
    live = [t for t in range(kernel)
            if any(0 <= o * stride + t * dilation - pad_before < size for o in range(out))]
    return (live[0], live[-1]) if live else (0, kernel - 1)


def _int_list(values) -> list[int]:
    return [int(v) for v in values]


def trimmed_conv2d(call: relax.Call) -> relax.Call | None:
    """`call` (a conv2d with a constant weight) with its dead edge taps cut, or None when every
    tap is live, a shape is not static, or a layout is not a plain four-letter one."""
    attrs = call.attrs
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    weight = call.args[1]
    in_shape, out_shape = static_dims(call.args[0]), static_dims(call)
    if (not isinstance(weight, tvm.ir.expr.Constant) or in_shape is None or out_shape is None
            or sorted(data_layout) != sorted("NCHW") or sorted(kernel_layout) != sorted("OIHW")
            or str(attrs.out_layout) != data_layout):
        return None
    strides, dilation = _int_list(attrs.strides), _int_list(attrs.dilation)
    padding = _int_list(attrs.padding)  # top, left, bottom, right
    data = weight.value.numpy()
    if not np.all(np.isfinite(data)):
        return None  # an infinite weight times a padding zero is NaN, not zero
    keep, new_padding = [slice(None)] * 4, list(padding)
    for axis, (letter, stride, dil) in enumerate(zip("HW", strides, dilation)):
        kernel_axis = kernel_layout.index(letter)
        kernel = data.shape[kernel_axis]
        first, last = live_tap_range(in_shape[data_layout.index(letter)],
                                     out_shape[data_layout.index(letter)], kernel, stride, dil,
                                     padding[axis])
        new_padding[axis] -= first * dil
        new_padding[axis + 2] -= (kernel - 1 - last) * dil
        keep[kernel_axis] = slice(first, last + 1)
    if min(new_padding) < 0 or new_padding == padding:
        return None
    kept = np.ascontiguousarray(data[tuple(keep)])
    return relax.op.nn.conv2d(
        call.args[0], relax.const(kept, str(kept.dtype)), strides=strides,
        padding=new_padding, dilation=dilation, groups=int(attrs.groups),
        data_layout=data_layout, kernel_layout=kernel_layout, out_layout=data_layout,
        out_dtype=attrs.out_dtype)


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
