"""Weight pre-packing: layout-free weight buffers before tuning, packed constants after.

MetaSchedule may give a kernel's weight a blocked layout (its RewriteLayout postprocessor) when
the PrimFunc lists that parameter in the ``layout_free_buffers`` attribute. The tuned kernel
then starts with a "layout rewrite preproc" block that repacks the weight on every call. After
the tuning log is applied, `pack_constant_weights` splits that block into its own PrimFunc
(TVM's SplitLayoutRewritePreproc) and evaluates it once, at compile time, on the constant
weight: the final module calls the kernel on an already packed constant, and the user still
calls ``main(x)`` with the original inputs only.

Which parameters are layout free is read from the call sites: an argument that is a Relax
constant (a weight lifted from the model) is layout free. The same rule marks the standalone
kernel that is tuned (`kernels.candidate_kernel`, the stock path's `kernel_module`) and the
kernel inside the rebuilt model (`rewrite.apply_tuning_log`), so both carry the same attribute
and the tuning database (whose keys include every attribute) finds the record. TVM's own
AttachAttrLayoutFreeBuffers is not used because it renames every PrimFunc it touches (names are
how the plan report refers to kernels) and writes an empty list on kernels without weights.
Only constants are marked: a weight passed as a parameter of ``main`` would need a separate
transform step at run time, which would change the interface users call.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import tvm
from tvm import relax

from ..support.parallel_codegen import library_in_parts
from ..target_spec import host_core_count
from .kernel_facts import kernel_blocks

LAYOUT_FREE_ATTR = "layout_free_buffers"
CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def constant_arg_indices(call: relax.Call) -> tuple[int, ...]:
    """Positions of the PrimFunc parameters that a call_tir fills with Relax constants."""
    args = call.args[1]
    fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
    return tuple(i for i, arg in enumerate(fields) if isinstance(arg, tvm.ir.expr.Constant))


def with_layout_free(func: tvm.tirx.PrimFunc, indices) -> tvm.tirx.PrimFunc:
    """`func` whose layout_free_buffers attribute is exactly `indices` (absent when empty)."""
    indices = sorted(int(i) for i in indices)
    if func.attrs is not None and LAYOUT_FREE_ATTR in func.attrs:
        func = func.without_attr(LAYOUT_FREE_ATTR)
    if indices:
        func = func.with_attr(LAYOUT_FREE_ATTR, indices)  # plain ints, as TVM reads them
    return func


def layout_free_indices(func: tvm.tirx.PrimFunc) -> tuple[int, ...]:
    if func.attrs is None or LAYOUT_FREE_ATTR not in func.attrs:
        return ()
    return tuple(int(i) for i in func.attrs[LAYOUT_FREE_ATTR])


def read_by_one_block(kernel_mod: tvm.IRModule) -> bool:
    """Whether each layout-free buffer of the kernel's `main` is read by one block at most.

    MetaSchedule's RewriteLayout lays a buffer out for the loops of a block that reads it and
    rewrites every read of it to that layout: where a bias add is inlined into several blocks
    that read the bias along other loops (the three slices of Swin-T's QKV projection, each
    reading its third of it), all but one then read the wrong elements."""
    func = kernel_mod["main"]
    names = {str(func.params[i].name) for i in layout_free_indices(func)}
    readers = Counter(name for block in kernel_blocks(kernel_mod)
                      for name in {str(region.source.name) for region in block.reads} & names)
    return all(count <= 1 for count in readers.values())


def _call_sites(mod: tvm.IRModule) -> dict:
    """PrimFunc GlobalVar -> {constant positions: number of call sites}, over every Relax function."""
    sites: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(CALL_TIR):
            callee = expr.args[0]
            if isinstance(mod[callee], tvm.tirx.PrimFunc):
                marks = sites.setdefault(callee, {})
                indices = constant_arg_indices(expr)
                marks[indices] = marks.get(indices, 0) + 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


@relax.expr_functor.mutator
class _RedirectCalls(relax.PyExprMutator):
    """Point each call_tir at `target_of(call)`, where that is not None."""

    def __init__(self, mod: tvm.IRModule, target_of):
        super().__init__(mod)
        self.target_of = target_of

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not call.op.same_as(CALL_TIR):
            return call
        target = self.target_of(call)
        if target is None:
            return call
        return relax.Call(call.op, [target, *call.args[1:]], call.attrs, call.ty_args)


def redirect_calls(mod: tvm.IRModule, target_of) -> tvm.IRModule:
    """`mod` with each call_tir of its Relax functions calling `target_of(call)` (a GlobalVar
    of `mod`) instead of its callee, where that is not None."""
    redirect = _RedirectCalls(mod, target_of)
    for global_var, func in mod.functions_items():
        if isinstance(func, relax.Function):
            redirect.builder_.update_func(global_var, redirect.visit_expr(func))
    return redirect.builder_.get()


def mark_layout_free_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Set every called PrimFunc's layout_free_buffers to the parameters its calls fill with
    constants. A PrimFunc whose call sites disagree keeps the most common marking under its
    name; the other markings get copies (``<name>_lf<k>``) and their calls are redirected."""
    sites = _call_sites(mod)
    updated = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    copies: dict = {}
    builder = None
    for callee, marks in sites.items():
        ranked = sorted(marks, key=lambda m: (-marks[m], m))
        updated[callee] = with_layout_free(mod[callee], ranked[0])
        for k, indices in enumerate(ranked[1:], start=1):
            if builder is None:
                builder = relax.BlockBuilder(updated)
            copy = with_layout_free(mod[callee], indices).with_attr("korch_layout_copy", k)
            copies[(callee, indices)] = builder.add_func(copy, f"{callee.name_hint}_lf{k}")
    if not copies:
        return updated
    result = redirect_calls(builder.get(),
                            lambda call: copies.get((call.args[0], constant_arg_indices(call))))
    for global_var, func in result.functions_items():  # the marker only defeated add_func's dedup
        if isinstance(func, tvm.tirx.PrimFunc) and "korch_layout_copy" in func.attrs:
            result[global_var] = func.without_attr("korch_layout_copy")
    return result


PREPACK_SUFFIX = "_weight_prepack"  # what SplitLayoutRewritePreproc names the split-out block
PREPACKED_SUFFIX = "_prepacked"  # ... and the kernel that reads the packed weight


def pack_constant_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Move tuned kernels' weight repacking out of the kernels and run it now, on the constants.

    SplitLayoutRewritePreproc turns a kernel ``k`` with a layout rewrite into ``k_prepacked``
    (reads the packed weight) and ``k_weight_prepack`` (packs it), called before it from Relax.
    Every such call whose arguments are all constants is evaluated here on the CPU and replaced
    by its results, so the final module holds packed constants and runs no per-call transform.
    Only these calls are folded (not everything FoldConstant would evaluate: a kernel scheduled
    for a GPU cannot be run on the host). A module without layout rewrites is returned as is.
    """
    split = relax.transform.SplitLayoutRewritePreproc()(mod)
    before = {gv.name_hint for gv, _ in mod.functions_items()}
    prepack = {gv.name_hint: func for gv, func in split.functions_items()
               if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint not in before
               and gv.name_hint.endswith(PREPACK_SUFFIX)}
    if not prepack:
        return split
    folder = _FoldPrepackCalls(split, _PrepackEvaluator(prepack))
    for global_var, func in split.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(global_var, folder.visit_expr(func))
    entries = [gv.name_hint for gv, func in split.functions_items()
               if isinstance(func, relax.Function) and func.attrs is not None
               and "global_symbol" in func.attrs]
    folded = relax.transform.CanonicalizeBindings()(folder.builder_.get())  # kernels read constants
    return relax.transform.DeadCodeElimination(entries)(folded)


class _PrepackEvaluator:
    """Builds every weight-prepack PrimFunc once (for the host CPU) and runs it on constants.

    Built without LLVM's optimizations: each runs once, on a few megabytes, and optimizing
    them took longer than running them (a warm DenseNet-121 compile: 5.7 -> 4.1 s here); and
    on one thread per core into a library loaded at once, not JIT-compiled on one thread
    (DenseNet-121's 155: 3.1 s of JIT)."""

    def __init__(self, funcs: dict):
        self.funcs = funcs
        self._library = None

    def __call__(self, name: str, args: list, out_types: list) -> list:
        if self._library is None:
            module = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in self.funcs.items()})
            self._library = library_in_parts(module, {"kind": "llvm", "opt-level": 0},
                                             host_core_count())
        device = tvm.cpu()
        inputs = [tvm.runtime.tensor(arg.value.numpy(), device) for arg in args]
        outputs = [tvm.runtime.tensor(np.empty([int(d) for d in ty.shape.values], str(ty.dtype)),
                                      device) for ty in out_types]
        self._library[name](*inputs, *outputs)
        return outputs


@relax.expr_functor.mutator
class _FoldPrepackCalls(relax.PyExprMutator):
    """call_tir(<k>_weight_prepack, constants) -> its results as constants (a tuple of them, and
    ``t[i]`` of such a tuple -> the i-th constant directly)."""

    def __init__(self, mod: tvm.IRModule, evaluate: _PrepackEvaluator):
        super().__init__(mod)
        self.mod = mod
        self.evaluate = evaluate

    def _folded(self, call):
        if not (isinstance(call, relax.Call) and call.op.same_as(CALL_TIR)):
            return None
        name = call.args[0].name_hint
        if name not in self.evaluate.funcs:
            return None
        args = call.args[1]
        fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
        if not all(isinstance(arg, tvm.ir.expr.Constant) for arg in fields):
            return None
        ty = call.ty
        out_types = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
        results = [relax.const(t) for t in self.evaluate(name, fields, out_types)]
        return relax.Tuple(results) if isinstance(ty, relax.TupleType) else results[0]

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        folded = self._folded(call)
        return call if folded is None else folded

    def visit_tuple_getitem_(self, item):
        item = self.visit_expr_post_order(item)
        value = item.tuple_value
        if isinstance(value, relax.Var):
            bound = self.lookup_binding(value)
            if isinstance(bound, relax.Tuple) and all(
                    isinstance(f, tvm.ir.expr.Constant) for f in bound.fields):
                return bound.fields[item.index]
        return item


def original_kernel_name(name: str) -> str:
    """The kernel's name before pack_constant_weights split it (``k_prepacked`` -> ``k``)."""
    return name[: -len(PREPACKED_SUFFIX)] if name.endswith(PREPACKED_SUFFIX) else name
