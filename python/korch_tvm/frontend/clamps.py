"""Clamps spelled as comparisons and selects, after import, as one Relax `clip`.

`onnx_rewrites` writes an ONNX Clip with constant bounds as `Where(x < lo, lo, x)` and
`Where(y > hi, hi, y)`, since no ONNX operator imports as Relax's `clip`. Left so, each clamp
is four primitives that ConvertLayout does not carry into NHWC (it wraps them in transposes
back to NCHW). `clip` is one elementwise primitive that it carries, as it does HardSwish's.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..lowering.mutation import mutate_relax_functions

_SIDES = {"relax.less": 0, "relax.greater": 1}  # which bound a select against it sets


def clamps_as_clip(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each `where(x < c, c, x)` / `where(x > c, c, x)` (c a float scalar constant)
    a `clip`, and a clip of a clip merged into one (the inner stays where others read it)."""
    mutator = _ClampsAsClip(mod)
    clipped = mutate_relax_functions(mutator, mod)
    if not mutator.rewrote:
        return mod  # untouched: no dead-code pass over models without such clamps
    return relax.transform.DeadCodeElimination()(clipped)


def _scalar(expr) -> float | None:
    if not isinstance(expr, tvm.ir.expr.Constant) or expr.value.numpy().size != 1:
        return None
    if not str(expr.ty.dtype).startswith("float"):
        return None
    return float(expr.value.numpy().reshape(-1)[0])


def _clip_bounds(call) -> tuple[float, float] | None:
    """(lo, hi) of a `clip` call."""
    if not isinstance(call, relax.Call) or getattr(call.op, "name", None) != "relax.clip":
        return None
    return float(call.args[1].value), float(call.args[2].value)


@relax.expr_functor.mutator
class _ClampsAsClip(relax.PyExprMutator):
    rewrote = False

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.where":
            return call
        condition, chosen, other = call.args
        test = self.lookup_binding(condition) if isinstance(condition, relax.Var) else None
        bound = _scalar(chosen)
        if bound is None or math.isnan(bound) or not isinstance(test, relax.Call) \
                or getattr(test.op, "name", None) not in _SIDES \
                or not test.args[0].same_as(other) or not test.args[1].same_as(chosen) \
                or chosen.ty.ndim > other.ty.ndim:  # a bound of higher rank broadcasts x up
            return call
        bounds = [-math.inf, math.inf]
        bounds[_SIDES[test.op.name]] = bound
        inner = _clip_bounds(self.lookup_binding(other)) if isinstance(other, relax.Var) else None
        merged = None if inner is None else [max(bounds[0], inner[0]), min(bounds[1], inner[1])]
        if merged is not None and merged[0] <= merged[1]:  # then one clip equals the two
            other, bounds = self.lookup_binding(other).args[0], merged
        self.rewrote = True
        return relax.op.clip(other, *bounds)
