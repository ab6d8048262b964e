"""A ones column carried through a chain of MatMuls, taken apart into the MatMuls and a sum.

`[V | 1]` times matrices on the left stays split by columns: `B @ (A @ [V | 1])` equals
`[B @ (A @ V) | B @ sum(A, -1)]`. MIT EfficientViT's linear attention appends the ones column
to V so that `k^T @ [v | 1]` also yields the key sums for its normaliser; the product then
has d + 1 columns (17 for heads of 16), an odd width for vectorized matmuls, and the two
column slices that read it are copies. Split, the matmuls are d wide, the normaliser a
matrix-vector product that can live in the division's kernel, and the slices disappear. The
inverse of `sum_in_value_matmul`, which appends the column.

Offered where each product of the chain is read only by the next matmul and the last only by
slices that take either the first d columns or the last one.
"""

from __future__ import annotations

import numpy as np

from .alternative import Alternative
from .program import (R, Program, build_alternative, constant_array, dtype_of, int_values,
                      static_shape)


def _ones_appended(program: Program, var):
    """V where `var = concat([V, ones], axis=-1)` with one column of ones; else None."""
    call = program.call_of(var, "relax.concat")
    if call is None or len(call.args[0].fields) != 2 or static_shape(var) is None:
        return None
    values, ones = call.args[0].fields
    ndim = len(static_shape(var))
    block = constant_array(ones)
    if int(call.attrs.axis) % ndim != ndim - 1 or block is None \
            or list(block.shape) != static_shape(var)[:-1] + [1] or not np.all(block == 1) \
            or dtype_of(values) != dtype_of(var):
        return None
    return values


def _only_reader(program: Program, var):
    """The one binding reading `var`, through casts that keep the dtype; None if not one."""
    readers = program.readers(var)
    while len(readers) == 1 and var not in program.outputs:
        call = program.call_of(readers[0], "relax.astype")
        if call is None or dtype_of(readers[0]) != dtype_of(var):
            return readers[0]
        var, readers = readers[0], program.readers(readers[0])
    return None


def _left_factors(program: Program, var):
    """([A_1, ..., A_n], product) for the longest chain `product = A_n @ ... @ (A_1 @ var)` in
    which each intermediate is read by the next matmul alone."""
    factors = []
    while True:
        reader = _only_reader(program, var)
        call = program.call_of(reader, "relax.matmul") if reader is not None else None
        if call is None or not program.skip_identity_casts(call.args[1]).same_as(var) \
                or program.skip_identity_casts(call.args[0]).same_as(var):
            return factors, var
        factors.append(call.args[0])
        var = reader


def _same_batch(factor, values) -> bool:
    """Whether sum(A_1, -1) has the batch axes of the ones column it stands for (V's)."""
    shape = static_shape(factor)
    return shape is not None and shape[:-2] == static_shape(values)[:-2]


def _column_slice(program: Program, var, width: int):
    """(begin, end) of the last axis a unit-stride strided_slice binding `var` takes of a tensor
    `width` columns wide, normalized to 0 <= begin <= end <= width; None for anything else."""
    call = program.call_of(var, "relax.strided_slice")
    if call is None:
        return None
    axes, begin, end = (int_values(arg) for arg in call.args[1:4])
    strides = int_values(call.args[4]) if len(call.args) > 4 else [1]
    ndim = len(static_shape(call.args[0]))
    if axes is None or begin is None or end is None or len(axes) != 1 \
            or axes[0] % ndim != ndim - 1 or strides not in ([1], None):
        return None
    lo = begin[0] + width if begin[0] < 0 else begin[0]
    hi = end[0] + width if end[0] < 0 else end[0]
    return max(0, min(lo, width)), max(0, min(hi, width))


class OnesColumnSplit:
    """slices of A_n @ ... @ (A_1 @ [V | 1]) -> A_n @ ... @ (A_1 @ V) and
    A_n @ ... @ sum(A_1, -1)."""

    name = "ones_column_split"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for appended, _ in program.calls("relax.concat"):
            values = _ones_appended(program, appended)
            if values is None:
                continue
            factors, product = _left_factors(program, appended)
            width = static_shape(values)[-1]
            slices = [(reader, _column_slice(program, reader, width + 1))
                      for reader in program.readers(product)]
            if not factors or product in program.outputs or not slices \
                    or any(span not in ((0, width), (width, width + 1)) for _, span in slices) \
                    or not _same_batch(factors[0], values):
                continue
            found.append(build_alternative(
                self.name, [values, *factors], [reader for reader, _ in slices],
                lambda bb, v, *a, spans=[span for _, span in slices]:
                    _pick(bb, v, a, spans)))
        return found


def _pick(bb, values, factors, spans):
    """One call per slice: the values' columns or the ones column, through the chain."""
    columns, sums = _through_chain(bb, values, factors)
    return [columns if span[0] == 0 else sums for span in spans]


def _through_chain(bb, values, factors):
    """A_n @ ... @ (A_1 @ V) and A_n @ ... @ sum(A_1, -1), their last calls not emitted (the
    alternative binds each replaced tensor itself)."""
    columns = R.matmul(factors[0], values)
    sums = R.sum(factors[0], axis=[-1], keepdims=True)
    for factor in factors[1:]:
        columns = R.matmul(factor, bb.emit(columns))
        sums = R.matmul(factor, bb.emit(sums))
    return columns, sums
