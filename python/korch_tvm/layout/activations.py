"""Activation layout as an implementation choice: NCHW as the model gives it, or NHWC.

On this CPU the same convolution (+ bias + SiLU), tuned, is faster in NHWC, where the output
channels are contiguous and vectorise without a transpose (bench/layouts.py). Which layout
wins for a whole model depends on what sits between the convolutions (reshapes and attention
need their own layout, and every switch is a transpose), so both are planned and the cheaper
modelled plan is kept ("auto"); both compile paths do this the same way, so their comparison
stays about orchestration. Korch's "auto" then also tries a layout per region of the model
(layout/regions.py).

In NHWC the weights are HWIO, output channels last, so the vector of output channels that a
default schedule (backend/cpu_schedule.py) accumulates per reduction step is one contiguous load;
with OHWI it was a strided gather, and untuned convolutions ran markedly slower. Tuned kernels
may re-pack their weights either way (kernels/weight_packing.py).

`convert_layout` is Relax's ConvertLayout with convolutions asked for NHWC: it re-expresses
every operator that can follow the new layout and inserts ``permute_dims`` where one cannot
(and at the model's inputs and outputs, which keep the layout the user feeds and reads). Those
transposes are ordinary layout primitives of the graph, costed like any kernel, and Korch may
fuse them into their neighbours. The weight transposes are folded into the constants.

ConvertLayout gives up (and transposes back and forth) on two patterns that imported models are
full of, so they are first rewritten into equivalent forms it follows: ``clip`` (HardSwish, the
cause of most activation transposes where it is used) becomes ``maximum(minimum(x, hi), lo)``,
TOPI's own definition; and a constant operand of lower rank than the tensor it is broadcast
against (an instance norm's ``(C, 1, 1)`` scale) gets the missing leading unit dimensions, so
such norms stay in NHWC and a style-transfer model's transposes sit only around its mirror pads
(imported as call_tir, which no layout rule follows), where Korch can fuse them with the pad.
The NCHW variant takes the same forms, so that a kernel outside the convolutions (a
transformer's matmul + bias) is one kernel in both: measured once, and not mistaken by the
layout probe for one that differs (ViT-S/32's matmuls were, 97 % of its FLOPs).
A third, a norm over a whole tensor flattened by a reshape (a group norm with one group), is
computed on the tensor as it is (layout/flat_norms.py).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np
import tvm
from tvm import relax

from ..config import LAYOUT_CHOICES
from ..errors import KorchError
from ..lowering.constant_folding import fold_constants
from ..lowering.mutation import mutate_relax_functions
from ..support import interrupts
from .flat_norms import unflatten_whole_norms

logger = logging.getLogger("korch_tvm.data_layout")
Result = TypeVar("Result")

LAYOUTS = tuple(choice for choice in LAYOUT_CHOICES if choice != "auto")
# Data and kernel layout of conv2d for each choice; NCHW keeps the model's layout.
_CONV_LAYOUTS = {"NHWC": ["NHWC", "HWIO"]}
_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


def check_layout(layout: str) -> str:
    if layout not in LAYOUT_CHOICES:
        raise KorchError(f"unknown layout '{layout}': choose one of {', '.join(LAYOUT_CHOICES)}")
    return layout


def convert_layout(mod: tvm.IRModule, layout: str) -> tvm.IRModule:
    """`mod` with its convolutions (and whatever follows them) in `layout`, and its constant
    expressions folded."""
    check_layout(layout)
    folded = fold_constants(mod)  # constant operands become Constants
    if layout in _CONV_LAYOUTS:
        folded = unflatten_whole_norms(folded)
    # the same forms in every layout, so that a kernel outside the convolutions (a
    # transformer's matmul + bias) is one kernel in each, measured once and not probed
    friendly = mutate_relax_functions(_LayoutFriendlyForms(folded), folded)
    if layout not in _CONV_LAYOUTS:
        return friendly
    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": _CONV_LAYOUTS[layout]})(friendly)
    return fold_constants(converted)


def layout_variants(mod: tvm.IRModule, layout: str) -> dict[str, tvm.IRModule]:
    """The module in each layout worth planning: one for a fixed layout; for "auto" every
    layout that changes something (a model without convolutions is planned once)."""
    if check_layout(layout) != "auto":
        return {layout: convert_layout(mod, layout)}
    if not has_convolution(mod):
        return {LAYOUTS[0]: mod}
    return {choice: convert_layout(mod, choice) for choice in LAYOUTS}


def in_best_layout(mod: tvm.IRModule, layout: str,
                   compile_in: Callable[[str, tvm.IRModule, float | None], Result],
                   modelled_ms: Callable[[Result], float], time_budget: float | None = None,
                   ) -> tuple[str, dict[str, Result]]:
    """(the layout of least modelled latency, every layout's result) for `mod` in `layout`:
    `plan_layouts`, then `best_layout`."""
    results = plan_layouts(layout_variants(mod, layout), compile_in, time_budget)
    return best_layout({name: modelled_ms(result) for name, result in results.items()}), results


def plan_layouts(variants: Mapping[str, tvm.IRModule],
                 compile_in: Callable[[str, tvm.IRModule, float | None], Result],
                 time_budget: float | None = None) -> dict[str, Result]:
    """Every layout's result for its variant of the model (`layout_variants`).

    `compile_in(layout, module, time_budget)` plans or compiles one variant; the variants share
    `time_budget` evenly (what one leaves goes to the next), and the trial budget: the i-th of
    n runs under `layout_trial_share() == (i, n)`, so that what it tunes on its own
    (`trial_part`) adds up to one budget per compile. A variant after the first that fails is
    left out with a warning: an optional layout must not sink a compile that the model as given
    can do.
    """
    deadline = None if time_budget is None else time.perf_counter() + time_budget
    results: dict[str, Result] = {}
    for position, (name, variant) in enumerate(variants.items()):
        if len(variants) > 1:
            logger.info("layout %s (%d of %d)", name, position + 1, len(variants))
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        token = _TRIAL_SHARE.set((position, len(variants)))
        try:
            results[name] = compile_in(name, variant,
                                       None if left is None else left / (len(variants) - position))
        except Exception as err:  # noqa: BLE001 - see the docstring
            if position == 0 or interrupts.pressed():  # a Ctrl-C TVM re-raised as an error
                raise
            logger.warning("layout %s failed, so it is not considered: %s", name,
                           (str(err).strip().splitlines() or [repr(err)])[0])
        finally:
            _TRIAL_SHARE.reset(token)
    return results


def best_layout(modelled_ms: Mapping[str, float]) -> str:
    """The layout of least modelled latency (the first of equals), said when there was a
    choice."""
    best = min(modelled_ms, key=modelled_ms.__getitem__)
    if len(modelled_ms) > 1:
        logger.info("layout %s chosen (modelled %s)", best, ", ".join(
            f"{name} {ms:.3f} ms" for name, ms in modelled_ms.items()))
    return best


# Which of how many layout variants is being compiled (plan_layouts): a compile path that tunes
# each variant on its own (the stock path) spends only its part of the trial budget there.
_TRIAL_SHARE: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar(
    "korch_tvm_layout_trial_share", default=(0, 1))


def layout_trial_share() -> tuple[int, int]:
    """(index, count) of the layout variant being compiled; (0, 1) outside `plan_layouts`."""
    return _TRIAL_SHARE.get()


def trial_part(budget: int, share: tuple[int, int] | None = None) -> int:
    """The part of `budget` that the share's variant may spend: n parts that add up to it,
    the same on every compile (so a re-run finds each variant tuned as far as its part asks)."""
    index, count = share or layout_trial_share()
    return budget * (index + 1) // count - budget * index // count


def has_convolution(mod: tvm.IRModule) -> bool:
    """Whether any Relax function of `mod` calls conv2d (the op a layout choice changes)."""
    found = []

    def visit(expr):
        if is_conv2d(expr):
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def is_conv2d(expr: relax.Expr) -> bool:
    """Whether `expr` calls conv2d."""
    return isinstance(expr, relax.Call) and expr.op.same_as(_CONV2D)


_BROADCASTING = {f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "floor_divide")}


@relax.expr_functor.mutator
class _LayoutFriendlyForms(relax.PyExprMutator):
    """Equivalent forms of two patterns ConvertLayout cannot follow (module docstring)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = getattr(call.op, "name", None)
        if name == "relax.clip":
            return _clip_as_min_max(call)
        if name in _BROADCASTING:
            return _constants_at_full_rank(call)
        return call


def _clip_as_min_max(call: relax.Call) -> relax.Expr:
    x, low, high = call.args
    dtype = getattr(x.ty, "dtype", None)
    bounds = [getattr(bound, "value", None) for bound in (low, high)]
    if dtype is None or not all(isinstance(b, (tvm.tirx.FloatImm, tvm.tirx.IntImm, float, int))
                                for b in bounds):
        return call
    low_value, high_value = (float(getattr(b, "value", b)) for b in bounds)
    upper = relax.op.minimum(x, relax.const(high_value, str(dtype)))
    return relax.op.maximum(upper, relax.const(low_value, str(dtype)))


def _constants_at_full_rank(call: relax.Call) -> relax.Expr:
    ranks = [getattr(arg.ty, "ndim", -1) for arg in call.args]
    rank = max(ranks)
    args = list(call.args)
    for k, arg in enumerate(args):
        if isinstance(arg, tvm.ir.expr.Constant) and 0 < ranks[k] < rank:
            data = arg.value.numpy()
            args[k] = relax.const(np.reshape(data, (1,) * (rank - data.ndim) + data.shape))
    if all(new is old for new, old in zip(args, call.args)):
        return call
    return relax.Call(call.op, args, call.attrs, call.ty_args)
