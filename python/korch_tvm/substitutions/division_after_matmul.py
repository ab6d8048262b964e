"""Softmax's normalizing division moved after the MatMul that reads it, and its inverse.

`O = matmul(E / S, V)` with `S` constant along each row of `E` (softmax's row sum, shape
[..., n, 1]) equals `matmul(E, V) / S`: the division then touches the seq x d result instead of
the seq x seq matrix, and it becomes an epilogue of the matmul (the exponent a prologue), which
is how a flash-attention kernel normalizes. Where the matrix reaches the matmul transposed
(EfficientViT computes `V @ P^T`), `V @ (E / S)^T == (V @ E^T) / S^T`.

The inverse, `op(matmul(A, B), S)` for a divide or multiply by a row-wise or scalar `S`,
scales the operand before the matmul instead (BERT and SegFormer scale the attention logits
after Q @ K^T; scaling the smaller Q or K pays the same way).

Each is offered only where the moved division or scaling touches no more elements than before
(at equal sizes, BERT's 64 x 64 heads, the gain is the fusion, which the solver weighs).
"""

from __future__ import annotations

from .alternative import Alternative
from .program import R, Program, build_alternative, is_float, size_of, static_shape

MATMUL, DIVIDE, MULTIPLY = "relax.matmul", "relax.divide", "relax.multiply"


def row_divisor(program: Program, var):
    """(E, S) where `var = E / S` with S of shape [..., n, 1] matching E's rows; else None."""
    call = program.call_of(program.skip_identity_casts(var), DIVIDE)
    if call is None:
        return None
    numerator, divisor = call.args
    shape, divisor_shape = static_shape(numerator), static_shape(divisor)
    if (shape is None or divisor_shape is None or len(shape) < 2 or not is_float(numerator)
            or divisor_shape != shape[:-1] + [1] or static_shape(var) != shape):
        return None
    return numerator, divisor


def swaps_last_two(call) -> bool:
    ndim = len(static_shape(call))
    axes = [int(axis) for axis in call.attrs.axes] if call.attrs.axes is not None else None
    return ndim >= 2 and axes == list(range(ndim - 2)) + [ndim - 1, ndim - 2]


def transposed_row_divisor(program: Program, var):
    """(E, S) where `var = permute_dims(E / S)` swapping the last two axes; else None."""
    call = program.call_of(program.skip_identity_casts(var), "relax.permute_dims")
    if call is None or not swaps_last_two(call):
        return None
    return row_divisor(program, call.args[0])


class DivisionAfterMatmul:
    """matmul(E / S, V) -> matmul(E, V) / S (and V @ (E/S)^T -> (V @ E^T) / S^T)."""

    name = "division_after_matmul"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for out, call in program.calls(MATMUL):
            left, right = call.args
            shape = static_shape(out)
            row = row_divisor(program, left)
            if row is not None and shape[:-1] == static_shape(row[0])[:-1] \
                    and size_of(out) <= size_of(row[0]):
                found.append(build_alternative(
                    self.name, [row[0], row[1], right], [out],
                    lambda bb, e, s, v: [R.divide(bb.emit(R.matmul(e, v)), s)]))
                continue
            column = transposed_row_divisor(program, right)
            if column is not None and shape[:-2] == static_shape(column[0])[:-2] \
                    and shape[-1] == static_shape(column[0])[-2] \
                    and size_of(out) <= size_of(column[0]):
                found.append(build_alternative(
                    self.name, [left, column[0], column[1]], [out], _transposed_division))
        return found


def _transposed_division(bb, v, e, s):
    ndim = len(static_shape(e))
    axes = list(range(ndim - 2)) + [ndim - 1, ndim - 2]
    product = bb.emit(R.matmul(v, bb.emit(R.permute_dims(e, axes))))
    return [R.divide(product, bb.emit(R.permute_dims(s, axes)))]


def _scale_operand(program: Program, var):
    """(op, matmul_var, matmul_call, S) where `var = op(matmul(...), S)`, op a divide or a
    multiply (either argument order) by a tensor S; else None."""
    for op in (DIVIDE, MULTIPLY):
        call = program.call_of(var, op)
        if call is None:
            continue
        pairs = [call.args] if op == DIVIDE else [call.args, call.args[::-1]]
        for product, scale in pairs:
            matmul = program.call_of(product, MATMUL)
            if matmul is not None and static_shape(scale) is not None and is_float(product):
                return op, product, matmul, scale
    return None


class ScaleBeforeMatmul:
    """op(matmul(A, B), S) -> matmul(op(A, S), B) for a row-wise S, or onto the smaller
    operand for a scalar S (op: divide or multiply)."""

    name = "scale_before_matmul"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for out, _ in [(b.var, b.value) for b in program.bindings]:
            match = _scale_operand(program, out)
            if match is None or static_shape(out) != static_shape(match[1]):
                continue
            op, product, matmul, scale = match
            left, right = matmul.args
            side = _side_to_scale(product, left, right, scale)
            if side is None:
                continue
            scaled = left if side == 0 else right
            if size_of(scaled) > size_of(out):
                continue
            found.append(build_alternative(
                self.name, [left, right, scale], [out],
                lambda bb, a, b, s, side=side, op=op: [_scaled_matmul(bb, a, b, s, side, op)]))
        return found


def _side_to_scale(product, left, right, scale) -> int | None:
    """0 to scale the left operand, 1 the right, None where the scale does not commute."""
    shape, scale_shape = static_shape(product), static_shape(scale)
    if all(dim == 1 for dim in scale_shape) and len(scale_shape) <= min(
            len(static_shape(left)), len(static_shape(right))):
        return 0 if size_of(left) <= size_of(right) else 1
    if scale_shape == shape[:-1] + [1] and static_shape(left)[:-1] == shape[:-1]:
        return 0
    return None


def _scaled_matmul(bb, a, b, s, side: int, op: str):
    apply = R.divide if op == DIVIDE else R.multiply
    if side == 0:
        return R.matmul(bb.emit(apply(a, s)), b)
    return R.matmul(a, bb.emit(apply(b, s)))
