"""What the lowering rules need to know of a call's shapes before they rewrite it."""

import tvm
from tvm import relax


def shapes_known(call: relax.Call) -> bool:
    """Whether every argument of `call` is a tensor of known shape (symbolic is fine) or a
    literal shape (a resize's output size).

    Rules resolve axes and align parameters from shapes, so a call without them is kept.
    """
    return all(
        isinstance(arg, relax.ShapeExpr)
        or (isinstance(arg.ty, relax.TensorType) and isinstance(arg.ty.shape, relax.ShapeExpr))
        for arg in call.args
    )


def static_dims(expr: relax.Expr) -> list[int] | None:
    """The tensor's shape as Python ints, or None when any dimension is symbolic or unknown."""
    shape = expr.ty.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        return None
    dims = list(shape.values)
    if not all(isinstance(dim, tvm.tirx.IntImm) for dim in dims):
        return None
    return [int(dim) for dim in dims]
