"""Relax's FoldConstant, with the data moves and the exact arithmetic on constants done in numpy.

FoldConstant evaluates a call on constants by building it with LLVM, tens of milliseconds a
call. An imported model reshapes every bias to rank 4, a layout change transposes every weight
and bias, and a lowered batch norm computes its per-channel factor from constants (an add, an
rsqrt, a multiply per norm); a compile lowers several variants of the model (each layout, each
region a layout per region costs), so DenseNet-121 spent 11 s of every lowering in those
builds. numpy moves the data and does the IEEE-exact operations (add, subtract, multiply,
divide, square root: each correctly rounded in float32 as in LLVM's code) in milliseconds and
gives the same constants bit for bit; anything else is left to FoldConstant.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .mutation import mutate_relax_functions

# numpy's result is the one LLVM's code gives: each is one correctly rounded IEEE operation
# (rsqrt: TVM computes 1 / sqrt(x), two of them, as here).
_EXACT = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.negative": np.negative,
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda x: np.divide(x.dtype.type(1), np.sqrt(x)),
}
_FLOATS = ("float32", "float64")


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """`relax.transform.FoldConstant()(mod)` and the bindings it leaves unused removed
    (`DeadCodeElimination`), without building code for what numpy does exactly, nor running
    FoldConstant where nothing is left to fold (it legalizes every call it meets to find out:
    8 s on a lowered DenseNet-121)."""
    moved = mutate_relax_functions(_ConstantsInNumpy(mod), mod)
    folded = relax.transform.FoldConstant()(moved) if _has_call_on_constants(moved) else moved
    return relax.transform.DeadCodeElimination()(folded)


def _has_call_on_constants(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of `mod` calls anything on constant arguments only (what
    FoldConstant may evaluate)."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and all(map(_is_constant, expr.args)):
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def _is_tensor(expr) -> bool:
    """Whether `expr` is a tensor constant (TVM 0.27 makes prim values `Constant`s too)."""
    return isinstance(expr, tvm.ir.expr.Constant) and hasattr(getattr(expr, "value", None),
                                                               "numpy")


def _is_constant(arg) -> bool:
    if isinstance(arg, relax.Tuple):
        return all(map(_is_constant, arg.fields))
    # TVM 0.27: tensors, prim values and data types are all `Constant`s
    return isinstance(arg, (tvm.ir.expr.Constant, tvm.ir.expr.StringImm, relax.ShapeExpr,
                            tvm.ir.GlobalVar, relax.ExternFunc))


@relax.expr_functor.mutator
class _ConstantsInNumpy(relax.PyExprMutator):
    """`permute_dims` and `reshape` (to a static shape) of a constant, and the `_EXACT`
    arithmetic of floating-point constants of one dtype, as a new constant; a variable bound
    to a constant is read as that constant (as FoldConstant does)."""

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        bound = self.lookup_binding(var)
        return bound if _is_tensor(bound) else super().visit_var_(var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        bound = self.lookup_binding(var)
        return bound if _is_tensor(bound) else super().visit_dataflow_var_(var)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not call.args or not _is_tensor(call.args[0]):
            return call
        name = getattr(call.op, "name", None)
        if name not in ("relax.permute_dims", "relax.reshape", *_EXACT):
            return call
        data = call.args[0].value.numpy()
        if name == "relax.permute_dims":
            axes = call.attrs.axes
            data = np.transpose(data, None if axes is None else [int(a) for a in axes])
        elif name == "relax.reshape" and isinstance(call.args[1], relax.ShapeExpr) and all(
                isinstance(v, tvm.tirx.IntImm) for v in call.args[1].values):
            data = np.reshape(data, [int(v) for v in call.args[1].values])
        elif name in _EXACT and all(map(_is_tensor, call.args)):
            operands = [data] + [arg.value.numpy() for arg in call.args[1:]]
            if str(data.dtype) not in _FLOATS or any(x.dtype != data.dtype for x in operands):
                return call
            with np.errstate(all="ignore"):  # 1 / 0 is inf here as in LLVM's code
                data = np.asarray(_EXACT[name](*operands), dtype=data.dtype)
        else:
            return call
        return relax.const(np.ascontiguousarray(data), str(data.dtype))
