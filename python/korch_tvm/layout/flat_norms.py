"""A normalization over a whole tensor, computed on the tensor as it is, not a flattened copy.

A group norm with one group (PoolFormer's, exported from PyTorch as Reshape, then
InstanceNormalization, then Reshape back) flattens a [B, C, H, W] tensor to [B, 1, C*H*W], takes
its mean and variance along the last axis, normalizes it elementwise and reshapes the result
back. ConvertLayout cannot carry NHWC through such a reshape: in NHWC each one became a
transpose to NCHW and another back, full-tensor gathers around every norm. Yet a reduction over
every axis but the batch does not depend on how they are ordered. So where the values between
the two reshapes are elementwise operations, reductions over the flattened axis (kept as
[B, 1, 1]) and constants of one element, the chain is computed again on the original tensor
(reductions over its axes 1..), and the reshape back is replaced by the result; the flattened
chain is left dead.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..lowering.mutation import bound_values, mutate_relax_functions
from ..lowering.shapes import static_dims

_ELEMENTWISE = {f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "sqrt", "rsqrt",
    "exp", "negative")}
_REDUCTIONS = {f"relax.{name}" for name in ("mean", "variance", "sum", "max", "min")}


def unflatten_whole_norms(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every whole-tensor normalization computed on its unflattened tensor (see the
    module docstring), dead flattened chains removed."""
    rewritten = mutate_relax_functions(_Unflatten(mod, bound_values(mod)), mod)
    # the reshape back is now the chain's last value under another name: ConvertLayout
    # follows no such alias, so it goes
    return relax.transform.DeadCodeElimination()(
        relax.transform.CanonicalizeBindings()(rewritten))


@relax.expr_functor.mutator
class _Unflatten(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, values):
        super().__init__(mod)
        self.values = values

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.reshape":
            return call
        source, target = call.args[0], static_dims(call)
        if not isinstance(source, relax.Var) or target is None or len(target) < 3:
            return call
        rebuilt = _Chain(self, target).rebuild(source)
        return call if rebuilt is None else rebuilt


class _Chain:
    """Rebuilds, on the unflattened tensor of shape `shape`, the value a reshape back to
    `shape` reads; None where anything in between is not a whole-tensor normalization's."""

    def __init__(self, mutator: _Unflatten, shape: list[int]):
        self.mutator, self.shape, self.done = mutator, shape, {}

    def rebuild(self, var: relax.Var) -> relax.Expr | None:
        rebuilt = self.value(var)
        return rebuilt if rebuilt is not None and static_dims(rebuilt) == self.shape else None

    def value(self, expr: relax.Expr) -> relax.Expr | None:
        if isinstance(expr, tvm.ir.expr.Constant):
            shape = static_dims(expr)
            return expr if shape is not None and math.prod(shape) == 1 else None
        if not isinstance(expr, relax.Var) or expr not in self.mutator.values:
            return None
        if expr not in self.done:
            self.done[expr] = self._call(self.mutator.values[expr])
        return self.done[expr]

    def _call(self, call) -> relax.Expr | None:
        name = getattr(getattr(call, "op", None), "name", None)
        if name == "relax.reshape":
            return self._unflattened(call)
        if name in _ELEMENTWISE:
            args = [self.value(arg) for arg in call.args]
            if any(arg is None for arg in args):
                return None
            return self._emit(relax.Call(call.op, args, call.attrs))
        if name in _REDUCTIONS and self._over_flat_axis(call):
            arg = self.value(call.args[0])
            if arg is None:
                return None
            axes = list(range(1, len(self.shape)))
            return self._emit(getattr(relax.op, name.split(".")[1])(arg, axis=axes,
                                                                   keepdims=True))
        return None

    def _unflattened(self, call) -> relax.Expr | None:
        """The tensor a reshape to [B, 1, N] flattens, when it has `shape` (B the same)."""
        source, flat = call.args[0], static_dims(call)
        if (flat is None or len(flat) != 3 or flat[1] != 1 or static_dims(source) != self.shape
                or flat[0] != self.shape[0] or flat[2] != math.prod(self.shape[1:])):
            return None
        return self.mutator.visit_expr(source)  # as the rewritten function names it

    def _over_flat_axis(self, call) -> bool:
        axes = [int(axis) for axis in (call.attrs.axis or [])]
        return bool(call.attrs.keepdims) and axes in ([2], [-1])

    def _emit(self, call: relax.Call) -> relax.Var:
        return self.mutator.builder_.emit(call)
