"""A conv2d with a constant, finite weight and static shapes, read into plain values: what the
rewrites that cut its dead taps (`dead_conv_taps`) or sum its live ones (`conv_tap_sum`) work
from, and the conv2d they build back with its layouts, groups and output type."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .shapes import static_dims


@dataclass(frozen=True)
class ConstantConv:
    """`weight` as numpy; `padding` top, left, bottom, right; shapes as Python ints."""

    data: relax.Expr
    weight: np.ndarray
    data_layout: str
    kernel_layout: str
    strides: list[int]
    dilation: list[int]
    padding: list[int]
    groups: int
    out_dtype: object
    in_shape: list[int]
    out_shape: list[int]

    def axis(self, letter: str) -> tuple[int, int]:
        """The data's and the kernel's index of spatial axis `letter` (H or W)."""
        return self.data_layout.index(letter), self.kernel_layout.index(letter)

    def along(self, spatial: int) -> tuple[int, int, int, int, int, int]:
        """Along spatial axis 0 (H) or 1 (W): input size, output size, taps, stride,
        dilation, padding before."""
        data_axis, kernel_axis = self.axis("HW"[spatial])
        return (self.in_shape[data_axis], self.out_shape[data_axis],
                self.weight.shape[kernel_axis], self.strides[spatial], self.dilation[spatial],
                self.padding[spatial])

    def macs(self) -> int:
        """Multiply-adds: every weight times every output position."""
        out_channels = self.weight.shape[self.kernel_layout.index("O")]
        return self.weight.size * int(np.prod(self.out_shape)) // out_channels

    def conv2d(self, data: relax.Expr, weight: np.ndarray, padding: list[int],
               dilation: list[int]) -> relax.Call:
        """A conv2d like this one of `data` by `weight`, with `padding` and `dilation`."""
        weight = np.ascontiguousarray(weight)
        return relax.op.nn.conv2d(
            data, relax.const(weight, str(weight.dtype)), strides=self.strides,
            padding=padding, dilation=dilation, groups=self.groups,
            data_layout=self.data_layout, kernel_layout=self.kernel_layout,
            out_layout=self.data_layout, out_dtype=self.out_dtype)


def constant_conv(call: relax.Call) -> ConstantConv | None:
    """`call` (a conv2d) read; None when its weight is not a finite constant (an infinite
    weight times a padding zero is NaN, not zero), a shape is not static, or a layout is not
    a plain four-letter one."""
    attrs, weight = call.attrs, call.args[1]
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    in_shape, out_shape = static_dims(call.args[0]), static_dims(call)
    if (not isinstance(weight, tvm.ir.expr.Constant) or in_shape is None or out_shape is None
            or sorted(data_layout) != sorted("NCHW") or sorted(kernel_layout) != sorted("OIHW")
            or str(attrs.out_layout) != data_layout):
        return None
    values = weight.value.numpy()
    if not np.all(np.isfinite(values)):
        return None
    return ConstantConv(call.args[0], values, data_layout, kernel_layout,
                        [int(v) for v in attrs.strides], [int(v) for v in attrs.dilation],
                        [int(v) for v in attrs.padding], int(attrs.groups), attrs.out_dtype,
                        in_shape, out_shape)
