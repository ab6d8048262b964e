"""Softmax's row sum computed by the value MatMul itself: a ones column appended to V.

`matmul(E / sum(E, -1), V)` equals `M[..., :d] / M[..., d:]` with `M = matmul(E, [V | 1])`:
the seq x seq matrix is reduced once, by the matmul, instead of by a separate sum kernel that
reads it again, and only the seq x d result is divided (the Korch paper's EfficientViT case:
the ReduceSum merged into the MatMul; MIT EfficientViT's linear attention pads V with ones the
same way). Where the matrix reaches the matmul transposed (`V @ P^T`, EfficientViT-M), a
ones row is appended to V instead: `M = [V ; 1] @ E^T`, `O = M[..., :d, :] / M[..., d:, :]`.
Offered where the division then touches no more elements than before, like
`division_after_matmul`.
"""

from __future__ import annotations

import numpy as np

from .alternative import Alternative
from .division_after_matmul import row_divisor, transposed_row_divisor
from .program import R, Program, build_alternative, constant_like, size_of, static_shape
from .sum_as_matmul import reduced_axis


def _is_row_sum_of(program: Program, divisor, numerator) -> bool:
    call = program.call_of(divisor, "relax.sum")
    return call is not None and call.args[0].same_as(numerator) and reduced_axis(call) == -1


def _ones_along(values, axis: int):
    shape = static_shape(values)
    shape[axis] = 1
    return constant_like(np.ones(shape), values)


def _sliced_quotient(bb, product, axis: int, width: int):
    ndim = len(static_shape(product))
    numerator = bb.emit(R.strided_slice(product, [axis % ndim], [0], [width]))
    denominator = bb.emit(R.strided_slice(product, [axis % ndim], [width], [width + 1]))
    return R.divide(numerator, denominator)


def _direct(bb, e, v):
    product = bb.emit(R.matmul(e, bb.emit(R.concat([v, _ones_along(v, -1)], axis=-1))))
    return [_sliced_quotient(bb, product, -1, static_shape(v)[-1])]


def _transposed(bb, v, e):
    ndim = len(static_shape(e))
    e_t = bb.emit(R.permute_dims(e, list(range(ndim - 2)) + [ndim - 1, ndim - 2]))
    product = bb.emit(R.matmul(bb.emit(R.concat([v, _ones_along(v, -2)], axis=-2)), e_t))
    return [_sliced_quotient(bb, product, -2, static_shape(v)[-2])]


class SumInValueMatmul:
    """matmul(E / sum(E), V) -> slices of matmul(E, [V | 1]) divided; V @ (E / sum(E))^T
    likewise with a ones row."""

    name = "sum_in_value_matmul"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for out, call in program.calls("relax.matmul"):
            left, right = call.args
            shape = static_shape(out)
            row = row_divisor(program, left)
            if row is not None and _is_row_sum_of(program, row[1], row[0]) \
                    and static_shape(right) is not None \
                    and static_shape(right)[:-2] == shape[:-2] \
                    and shape[:-1] == static_shape(row[0])[:-1] \
                    and size_of(out) <= size_of(row[0]):
                found.append(build_alternative(self.name, [row[0], right], [out], _direct))
                continue
            column = transposed_row_divisor(program, right)
            if column is not None and _is_row_sum_of(program, column[1], column[0]) \
                    and static_shape(left) is not None \
                    and static_shape(left)[:-2] == shape[:-2] \
                    and shape[:-2] == static_shape(column[0])[:-2] \
                    and shape[-1] == static_shape(column[0])[-2] \
                    and size_of(out) <= size_of(column[0]):
                found.append(build_alternative(self.name, [left, column[0]], [out], _transposed))
        return found
