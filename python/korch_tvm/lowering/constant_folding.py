"""Relax's FoldConstant, with the reshapes and transposes of constants done in numpy first.

FoldConstant evaluates a call on constants by building it with LLVM, tens of milliseconds a
call. An imported model reshapes every bias to rank 4 and a layout change transposes every
weight and bias, so one converted model took seconds of folding, and a compile folds several
variants (each layout, each region a layout per region costs, each lowering); in numpy it takes
milliseconds and gives the same constants.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .mutation import mutate_relax_functions


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """`relax.transform.FoldConstant()(mod)`, faster where the folding is only moving data."""
    return relax.transform.FoldConstant()(
        mutate_relax_functions(_ConstantLayoutsInNumpy(mod), mod))


@relax.expr_functor.mutator
class _ConstantLayoutsInNumpy(relax.PyExprMutator):
    """`permute_dims` and `reshape` (to a static shape) of a constant, as a new constant."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not call.args or not isinstance(call.args[0], tvm.ir.expr.Constant):
            return call
        name = getattr(call.op, "name", None)
        data = call.args[0].value.numpy()
        if name == "relax.permute_dims":
            axes = call.attrs.axes
            data = np.transpose(data, None if axes is None else [int(a) for a in axes])
        elif name == "relax.reshape" and isinstance(call.args[1], relax.ShapeExpr) and all(
                isinstance(v, tvm.tirx.IntImm) for v in call.args[1].values):
            data = np.reshape(data, [int(v) for v in call.args[1].values])
        else:
            return call
        return relax.const(np.ascontiguousarray(data), str(data.dtype))
