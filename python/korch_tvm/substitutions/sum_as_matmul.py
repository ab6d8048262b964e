"""A row sum expressed as a MatMul with a ones vector, and the inverse.

`sum(E, axis=-1, keepdims=True) == matmul(E, ones[n, 1])` (and a sum over axis -2 is
`matmul(ones[1, m], E)`). A reduction becomes a contraction, so the softmax denominator can
live in the same matmul-kind kernel as the `E @ V` that reads the same `E` (EfficientViT's
ReduceSum merged into a MatMul in the Korch paper), instead of a separate reduce kernel that
reads the seq x seq matrix again. The inverse turns a matmul by an all-ones constant back into a
sum, which is cheaper as a kernel of its own (no multiplications, a vectorized reduction).
"""

from __future__ import annotations

import numpy as np

from .alternative import Alternative
from .program import (R, Program, build_alternative, constant_array, constant_like, is_float,
                      static_shape)


def reduced_axis(call) -> int | None:
    """The one axis, normalized to -1 or -2, that a keepdims sum reduces; else None."""
    ndim = len(static_shape(call.args[0]))
    axes = [int(axis) for axis in call.attrs.axis] if call.attrs.axis is not None else None
    if ndim < 2 or axes is None or len(axes) != 1 or not bool(call.attrs.keepdims):
        return None
    axis = axes[0] - ndim if axes[0] >= 0 else axes[0]
    return axis if axis in (-1, -2) else None


class SumAsMatmul:
    """sum(E, axis=-1, keepdims) -> matmul(E, ones[n, 1]); axis -2: matmul(ones[1, m], E)."""

    name = "sum_as_matmul"

    def find(self, main) -> list[Alternative]:
        found = []
        for out, call in Program(main).calls("relax.sum"):
            source = call.args[0]
            axis = reduced_axis(call) if static_shape(source) is not None else None
            if axis is None or not is_float(source):
                continue
            length = static_shape(source)[axis]
            ones_shape = (length, 1) if axis == -1 else (1, length)
            ones = constant_like(np.ones(ones_shape), source)
            found.append(build_alternative(
                self.name, [source], [out],
                lambda bb, e, ones=ones, axis=axis:
                    [R.matmul(e, ones) if axis == -1 else R.matmul(ones, e)]))
        return found


def _ones_side(call) -> int | None:
    """0 where `call = matmul(ones[1, m], X)`, 1 where `matmul(X, ones[n, 1])`; else None."""
    for side, expected in ((1, lambda n: [n, 1]), (0, lambda m: [1, m])):
        weight, other = call.args[side], call.args[1 - side]
        array = constant_array(weight)
        other_shape = static_shape(other)
        if array is None or other_shape is None or len(other_shape) < 2:
            continue
        length = other_shape[-1] if side == 1 else other_shape[-2]
        if list(array.shape) == expected(length) and np.all(array == 1):
            return side
    return None


class MatmulAsSum:
    """matmul(X, ones[n, 1]) -> sum(X, axis=-1, keepdims); matmul(ones[1, m], X) likewise."""

    name = "matmul_as_sum"

    def find(self, main) -> list[Alternative]:
        found = []
        for out, call in Program(main).calls("relax.matmul"):
            side = _ones_side(call)
            if side is None or not is_float(out):
                continue
            source = call.args[1 - side]
            if constant_array(source) is not None:
                continue
            if static_shape(out) != static_shape(source)[:-1] + [1] and side == 1:
                continue
            if side == 0 and static_shape(out) != static_shape(source)[:-2] + [1] + \
                    static_shape(source)[-1:]:
                continue
            axis = -1 if side == 1 else -2
            found.append(build_alternative(
                self.name, [source], [out],
                lambda bb, x, axis=axis: [R.sum(x, axis=[axis], keepdims=True)]))
        return found
