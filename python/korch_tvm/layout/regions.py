"""Activation layout per region: NHWC where it pays, NCHW where it does not, transposes between.

layout/activations.py plans a whole model in NCHW and in NHWC and keeps the cheaper. Which layout
pays differs along a model, though: convolutions run faster in NHWC on this CPU
(layout/activations.py), while attention, reshapes and opaque ops want the layout the model was
written in, and every place ConvertLayout cannot follow NHWC costs a transpose pair. So the model
is also cut into regions where few tensors are live (`split_regions`), each region is planned in
both layouts with its cut tensors in that layout (`region_module`), and a shortest path over the
regions (`cheapest_layouts`) picks each region's layout, paying for a transpose of the cut tensors
wherever two neighbours differ; that transpose is costed as a kernel of its own (`switch_module`).
`stitched_module` then puts the regions together in the chosen layouts with those transposes
between them as ordinary layout primitives, and the whole stitched model is planned like any other
(pipeline/korch.py), so Korch may fuse each transpose into a neighbour, and the model is only kept
when its plan models cheaper than both single-layout plans.

A tensor keeps the model's layout where the user sees it: model inputs and outputs are never
converted at a cut, and only 4-D tensors are (the others have no NCHW to change).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax

from ..graph.relax_exprs import last_uses, vars_in
from ..lowering.constant_folding import fold_constants
from ..lowering.mutation import mutate_relax_functions
from .activations import LAYOUTS, convert_layout, is_conv2d

# Every tensor live at a cut is transposed where the layout switches there. Three also cuts
# a detection model's neck into regions, where two left it whole.
MAX_CUT_WIDTH = 3
# Regions are at least 1/TARGET_REGIONS of the model: each costs two plans of its own.
TARGET_REGIONS = 12
# The saving, as a share of the best single layout's sum of region costs, that a layout per
# region must be predicted to make before the stitched model is planned: region costs are
# predictions for pieces of the model, and on the zoo the stitched plan modelled slower than one
# layout wherever they promised less (bench/results/zoo-probe/mixed-layouts.md).
MIN_PREDICTED_SAVING = 0.08
# The layout a compile reports when its regions differ.
MIXED = "mixed"
# Axes that take an NCHW tensor to NHWC and back.
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


@dataclass(frozen=True)
class Region:
    """Bindings start..stop-1 of main's dataflow block and the tensors crossing its ends."""

    start: int
    stop: int
    inputs: tuple[relax.Var, ...]  # defined before `start` (or parameters), read inside
    outputs: tuple[relax.Var, ...]  # defined inside, read after `stop` or returned
    live_after: tuple[relax.Var, ...]  # defined up to `stop`, read after it: the cut's tensors


def split_regions(mod: tvm.IRModule, min_bindings: int | None = None,
                  ) -> tuple[tvm.IRModule, list[Region]]:
    """(`mod` with constants folded, its `main` cut into regions of at least `min_bindings`
    bindings (default: 1/TARGET_REGIONS of the model)).

    A cut goes where 1..MAX_CUT_WIDTH tensors are live, none of them a parameter, and right
    before a convolution: ConvertLayout only starts NHWC at a convolution, so an elementwise op
    first in an NHWC region would run in NCHW between two transposes. The regions refer to the
    folded module, in which a weight's reshape is a constant, not a tensor crossing every cut.
    Fewer than two regions means the model has nowhere to switch layout."""
    mod = fold_constants(mod)
    func = mod["main"]
    bindings = _plain_bindings(func)
    if bindings is None or _has_weight_parameters(func):
        return mod, []
    min_bindings = min_bindings or max(1, len(bindings) // TARGET_REGIONS)
    last_use = last_uses(func, bindings)
    params = set(func.params)
    live = set(params)
    cuts, start = [], 0
    for position, binding in enumerate(bindings):
        live.add(binding.var)
        live = {var for var in live if last_use.get(var, -1) > position}
        if (position + 1 - start >= min_bindings and position + 1 < len(bindings)
                and is_conv2d(bindings[position + 1].value)
                and 0 < len(live) <= MAX_CUT_WIDTH and not live & params
                and all(_static_tensor(var) for var in live)):
            cuts.append(position + 1)
            start = position + 1
    if cuts and len(bindings) - cuts[-1] < min_bindings:
        cuts.pop()  # the tail is a region of its own only when it is as long as the others
    bounds = [0, *cuts, len(bindings)]
    return mod, [_region(func, bindings, last_use, begin, end)
                 for begin, end in zip(bounds, bounds[1:])]


def converted_at_cut(mod: tvm.IRModule, var: relax.Var) -> bool:
    """Whether `var`, crossing a cut, takes the layout of the regions beside it: a 4-D tensor
    that is neither a model input nor a model output."""
    func = mod["main"]
    return (getattr(var.ty, "ndim", -1) == 4 and var not in set(func.params)
            and var not in set(vars_in(func.body.body)))


def region_module(mod: tvm.IRModule, region: Region, layout: str) -> tvm.IRModule:
    """`region` of `mod` as a model of its own in `layout`, its cut tensors in `layout` too."""
    builder = relax.BlockBuilder()
    params = [relax.Var(var.name, _in_layout(var.ty, layout) if converted_at_cut(mod, var)
                        else var.ty) for var in region.inputs]
    with builder.function("main", params):
        with builder.dataflow():
            values = {var: _transposed(builder, param, layout, "NCHW")
                      if converted_at_cut(mod, var) else param
                      for var, param in zip(region.inputs, params)}
            body = relax.SeqExpr([relax.DataflowBlock(
                _plain_bindings(mod["main"])[region.start:region.stop])],
                _packed(region.outputs))
            results = _unpacked(builder, _emit_inline(builder, body, values), len(region.outputs))
            outputs = [_transposed(builder, value, "NCHW", layout)
                       if converted_at_cut(mod, var) else value
                       for var, value in zip(region.outputs, results)]
            result = builder.emit_output(_packed(outputs))
        builder.emit_func_output(result)
    return _cancel_transposes(convert_layout(_with_main(mod, builder.get()["main"]), layout))


def switch_module(mod: tvm.IRModule, region: Region) -> tvm.IRModule | None:
    """The transposes a switch of layout after `region` runs (None when nothing is converted).

    It converts every tensor live at the cut; one that skips the next region is converted
    later, or not at all when the region that reads it is back in its layout, so a switch
    costs at most this."""
    crossing = [var for var in region.live_after if converted_at_cut(mod, var)]
    if not crossing:
        return None
    builder = relax.BlockBuilder()
    params = [relax.Var(var.name, var.ty) for var in crossing]
    with builder.function("main", params):
        with builder.dataflow():
            outputs = [_transposed(builder, param, "NCHW", "NHWC") for param in params]
            result = builder.emit_output(_packed(outputs))
        builder.emit_func_output(result)
    return _with_main(mod, builder.get()["main"])


def cheapest_layouts(region_ms: Sequence[Mapping[str, float]], switch_ms: Sequence[float],
                     ) -> tuple[tuple[str, ...], float]:
    """(layout of each region, total ms) of least sum of region costs plus `switch_ms[i]`
    wherever regions i and i+1 differ: a shortest path through (region, layout) states."""
    assert len(switch_ms) == len(region_ms) - 1
    paths = {layout: ((layout,), region_ms[0][layout]) for layout in LAYOUTS}
    for switch, costs in zip(switch_ms, region_ms[1:]):
        paths = {layout: min(((path + (layout,), total + costs[layout]
                               + (0.0 if path[-1] == layout else switch))
                              for path, total in paths.values()), key=lambda entry: entry[1])
                 for layout in LAYOUTS}
    return min(paths.values(), key=lambda entry: entry[1])


def worth_stitching(layouts: Sequence[str], total_ms: float,
                    region_ms: Sequence[Mapping[str, float]]) -> bool:
    """Whether regions in `layouts` (`cheapest_layouts`: `total_ms` with the switches) differ
    and are predicted to save at least `MIN_PREDICTED_SAVING` over the best single layout."""
    single_ms = min(sum(costs[layout] for costs in region_ms) for layout in LAYOUTS)
    return len(set(layouts)) > 1 and total_ms <= single_ms * (1.0 - MIN_PREDICTED_SAVING)


def stitched_module(mod: tvm.IRModule, regions: Sequence[Region], layouts: Sequence[str],
                    region_modules: Sequence[tvm.IRModule] | None = None) -> tvm.IRModule:
    """`mod` with each region in its layout and a transpose wherever the layouts of two
    neighbours differ; `region_modules` are the regions' `region_module`s in those layouts,
    when the caller has them already (each is a ConvertLayout)."""
    region_modules = region_modules or [region_module(mod, region, layout)
                                        for region, layout in zip(regions, layouts)]
    func = mod["main"]
    builder = relax.BlockBuilder()
    params = [relax.Var(param.name, param.ty) for param in func.params]
    attrs = {key: value for key, value in (func.attrs or {}).items() if key != "global_symbol"}
    with builder.function("main", params, attrs=attrs or None):
        with builder.dataflow():
            # each tensor in the layouts it has been computed or transposed to so far
            values = {old: {"NCHW": new} for old, new in zip(func.params, params)}

            def argument(var, layout):
                if not converted_at_cut(mod, var):
                    return values[var]["NCHW"]
                if layout not in values[var]:  # transposed once, however many regions read it
                    [(held, value)] = values[var].items()
                    values[var][layout] = _transposed(builder, value, held, layout)
                return values[var][layout]

            for region, layout, converted in zip(regions, layouts, region_modules):
                converted = converted["main"]
                arguments = [argument(var, layout) for var in region.inputs]
                results = _emit_inline(builder, converted.body,
                                       dict(zip(converted.params, arguments)))
                values.update({var: {layout if converted_at_cut(mod, var) else "NCHW": value}
                               for var, value in zip(region.outputs,
                                                     _unpacked(builder, results,
                                                               len(region.outputs)))})
            returned = _Substitute({var: argument(var, "NCHW") for var in
                                    vars_in(func.body.body) if var in values}
                                   ).visit_expr(func.body.body)
            result = builder.emit_output(returned)
        builder.emit_func_output(result)
    return _cancel_transposes(_with_main(mod, builder.get()["main"]))


# ---------------------------------------------------------------------------------------------
# Relax plumbing


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """Replaces variables by the expressions `values` gives for them."""

    def __init__(self, values: Mapping[relax.Var, relax.Expr]):
        super().__init__()
        self.values = values

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        return self.values.get(var, var)

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.values.get(var, var)


def _emit_inline(builder: relax.BlockBuilder, body: relax.SeqExpr,
                 values: Mapping[relax.Var, relax.Expr]) -> relax.Expr:
    """Emits the bindings of `body` with its free variables replaced by `values`; returns its
    result in the emitted variables."""
    values = dict(values)
    substitute = _Substitute(values)
    for block in body.blocks:
        for binding in block.bindings:
            values[binding.var] = builder.emit(substitute.visit_expr(binding.value),
                                               name_hint=binding.var.name)
    return substitute.visit_expr(body.body)


@relax.expr_functor.mutator
class _CancelTransposes(relax.PyExprMutator):
    """permute_dims of a permute_dims becomes one permute_dims, or none when they undo each
    other (ConvertLayout's transpose to NHWC of the NCHW view of an NHWC cut tensor), and an
    identity permute_dims goes."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        outer_axes = _permute_of(call)
        if outer_axes is None:
            return call
        source = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        inner_axes = _permute_of(source)
        if inner_axes is None:
            return call.args[0] if outer_axes == sorted(outer_axes) else call
        axes = [inner_axes[axis] for axis in outer_axes]
        if axes == sorted(axes):
            return source.args[0]
        return relax.op.permute_dims(source.args[0], axes)


def _permute_of(expr: relax.Expr) -> list[int] | None:
    """The axes of a permute_dims call with explicit axes, else None."""
    if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.permute_dims"
            and expr.attrs.axes is not None):
        return None
    return [int(axis) for axis in expr.attrs.axes]


def _cancel_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    mod = relax.transform.CanonicalizeBindings()(mod)  # no aliases between two transposes
    return relax.transform.DeadCodeElimination(["main"])(
        mutate_relax_functions(_CancelTransposes(mod), mod))


def _transposed(builder: relax.BlockBuilder, value: relax.Expr, current: str,
                wanted: str) -> relax.Expr:
    if current == wanted:
        return value
    return builder.emit(relax.op.permute_dims(value, TO_NHWC if wanted == "NHWC" else TO_NCHW))


def _in_layout(ty, layout: str):
    """The type of an NCHW tensor held in `layout`."""
    if layout == "NCHW":
        return ty
    shape = [ty.shape.values[axis] for axis in TO_NHWC]
    return relax.TensorType(shape, str(ty.dtype))


def _packed(values: Sequence[relax.Expr]) -> relax.Expr:
    return values[0] if len(values) == 1 else relax.Tuple(list(values))


def _unpacked(builder: relax.BlockBuilder, value: relax.Expr, count: int) -> list[relax.Expr]:
    if count == 1:
        return [value]
    if isinstance(value, relax.Tuple):
        return list(value.fields)
    return [builder.emit(relax.TupleGetItem(value, index)) for index in range(count)]


def _with_main(mod: tvm.IRModule, main: relax.Function) -> tvm.IRModule:
    functions = {gv: func for gv, func in mod.functions_items() if gv.name_hint != "main"}
    functions[tvm.ir.GlobalVar("main")] = main
    return tvm.IRModule(functions, attrs=mod.attrs)


def _plain_bindings(func: relax.Function) -> list | None:
    """The bindings of a function that is one dataflow block of plain bindings, else None."""
    body = func.body
    if not (isinstance(body, relax.SeqExpr) and len(body.blocks) == 1
            and isinstance(body.blocks[0], relax.DataflowBlock)):
        return None
    bindings = list(body.blocks[0].bindings)
    return bindings if all(isinstance(b, relax.VarBinding) for b in bindings) else None


def _has_weight_parameters(func: relax.Function) -> bool:
    """Weights passed as parameters (after num_input) would have to cross every cut."""
    return bool(func.attrs and "num_input" in func.attrs
                and int(func.attrs["num_input"]) < len(func.params))


def _static_tensor(var: relax.Var) -> bool:
    ty = var.ty
    return (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)
            and all(isinstance(extent, tvm.tirx.IntImm) for extent in ty.shape.values))


def _region(func, bindings, last_use, start: int, stop: int) -> Region:
    defined_before = set(func.params) | {b.var for b in bindings[:start]}
    inside = [b.var for b in bindings[start:stop]]
    read = {}  # first use order, each once
    for binding in bindings[start:stop]:
        read.update((var, None) for var in vars_in(binding.value) if var in defined_before)
    outputs = [var for var in inside if last_use.get(var, -1) >= stop]
    live_after = [var for var in [*func.params, *(b.var for b in bindings[:stop])]
                  if last_use.get(var, -1) >= stop]
    return Region(start, stop, tuple(read), tuple(outputs), tuple(live_after))
