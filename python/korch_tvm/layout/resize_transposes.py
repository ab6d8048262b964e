"""A transpose after an upsampling resize, moved before it: onto the smaller tensor.

A segmentation model ends by resizing its class map up to the input's size (DeepLabv3 and
LR-ASPP: 21 channels from 16x16 or 32x32 to 256x256). Planned in NHWC, that resize runs in NHWC
and ConvertLayout then transposes its output back to the NCHW the user reads: a transpose of
the largest tensor of the model, which a fused kernel wrote as strided gathers (2.3 ms of
DeepLabv3's 16 ms here). Resizing is the same computation in either layout, so the transpose
is applied to the resize's input instead, and the resize runs in the layout of its output.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..lowering.mutation import bound_values, mutate_relax_functions
from ..lowering.rules import static_dims

# The axes of permute_dims that take a resize's layout to the other one.
_SWITCHES = {("NHWC", (0, 3, 1, 2)): "NCHW", ("NCHW", (0, 2, 3, 1)): "NHWC"}


def transpose_before_upsampling(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every layout transpose that follows a resize to a larger tensor (its only
    use) moved before the resize."""
    uses = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: _count(e, uses))
    rewritten = mutate_relax_functions(_MoveTransposes(mod, bound_values(mod), uses), mod)
    return relax.transform.DeadCodeElimination()(rewritten)


def _count(expr, uses: dict) -> None:
    if isinstance(expr, relax.Call):
        for arg in expr.args:
            if isinstance(arg, relax.Var):
                uses[arg] = uses.get(arg, 0) + 1


@relax.expr_functor.mutator
class _MoveTransposes(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, values, uses):
        super().__init__(mod)
        self.values, self.uses = values, uses

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.permute_dims":
            return call
        resized = call.args[0]
        resize = self.values.get(resized) if isinstance(resized, relax.Var) else None
        if (getattr(getattr(resize, "op", None), "name", None) != "relax.image.resize2d"
                or self.uses.get(resized) != 1 or not _upsamples(resize)):
            return call
        axes = tuple(int(axis) for axis in call.attrs.axes or ())
        layout = _SWITCHES.get((str(resize.attrs.layout), axes))
        if layout is None:
            return call
        moved = self.builder_.emit(relax.op.permute_dims(self.visit_expr(resize.args[0]),
                                                         list(axes)))
        attrs = resize.attrs
        return relax.op.image.resize2d(
            moved, resize.args[1], roi=[float(v) for v in attrs.roi], layout=layout,
            method=attrs.method,
            coordinate_transformation_mode=attrs.coordinate_transformation_mode,
            rounding_method=attrs.rounding_method, cubic_alpha=float(attrs.cubic_alpha),
            cubic_exclude=int(attrs.cubic_exclude),
            extrapolation_value=float(attrs.extrapolation_value),
            out_dtype=attrs.out_dtype if str(attrs.out_dtype) else None)


def _upsamples(resize: relax.Call) -> bool:
    """Whether the resize's output has more elements than its input."""
    shapes = [static_dims(resize.args[0]), static_dims(resize)]
    return None not in shapes and math.prod(shapes[1]) > math.prod(shapes[0])
