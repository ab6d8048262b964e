"""One PrimFunc per call_tir binding, so that any set of primitives can become one kernel.

LegalizeOps shares a PrimFunc between bindings of equal ops; the graph needs each binding's own
copy (tagged with its binding position) to fuse it apart from its twins.
"""

from __future__ import annotations

import tvm
from tvm import relax

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
NODE_ATTR = "korch_node"


def uniquify_callees(mod: tvm.IRModule, func_name: str, keep_unread: bool = False
                      ) -> tvm.IRModule:
    """Give every call_tir binding its own PrimFunc copy, tagged with its binding position.
    `keep_unread`: keep bindings nothing reads (offered alternatives), dropping only the
    functions no longer called."""
    builder, func = relax.BlockBuilder(mod), mod[func_name]
    rebound = []
    for position, binding in enumerate(func.body.blocks[0].bindings):
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(CALL_TIR):
            callee = mod[value.args[0]].with_attr(NODE_ATTR, position)  # defeats add_func dedup
            gvar = builder.add_func(callee, f"k{position}_{value.args[0].name_hint}")
            value = relax.Call(value.op, [gvar, *value.args[1:]], value.attrs, value.ty_args)
        rebound.append(relax.VarBinding(binding.var, value))
    body = relax.SeqExpr([relax.DataflowBlock(rebound)], func.body.body)
    builder.update_func(mod.get_global_var(func_name),
                        relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs))
    if keep_unread:  # Normalize fills in the rebound calls' types, as DCE does below
        return relax.transform.Normalize()(without_uncalled_functions(builder.get(), func_name))
    return relax.transform.DeadCodeElimination([func_name])(builder.get())


def without_uncalled_functions(mod: tvm.IRModule, func_name: str) -> tvm.IRModule:
    """`mod` keeping `func_name` and the functions reachable from it by calls."""
    keep, frontier = set(), [mod.get_global_var(func_name)]
    while frontier:
        gvar = frontier.pop()
        if gvar.name_hint in keep:
            continue
        keep.add(gvar.name_hint)
        if isinstance(mod[gvar], relax.Function):
            frontier += list(relax.analysis.all_global_vars(mod[gvar]))
    return tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint in keep},
                        attrs=mod.attrs)
