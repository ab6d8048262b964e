"""Walking and rewriting the leaves of a Relax binding's value.

The graph stage, the kernel builder and the substitution rules all read which values a binding
uses and rebuild a value over other vars; one walk serves them so the three cannot disagree on
what counts as a read (tuples and tuple items looked through, callees skipped). The layout
regions and the cache-state footprint read how long each bound var lives (`last_uses`).
"""

from __future__ import annotations

import tvm
from tvm import relax


def leaves(expr) -> list:
    """Vars and constants an expression reads (tuples flattened, callees skipped)."""
    if isinstance(expr, relax.Tuple):
        return [x for f in expr.fields for x in leaves(f)]
    if isinstance(expr, relax.Call):
        return [x for a in expr.args for x in leaves(a)]
    if isinstance(expr, relax.TupleGetItem):
        return leaves(expr.tuple_value)
    if isinstance(expr, (relax.Var, tvm.ir.expr.Constant)):
        return [expr]
    return []


def vars_read(expr) -> list[relax.Var]:
    """The vars among `leaves(expr)`, in order."""
    return [leaf for leaf in leaves(expr) if isinstance(leaf, relax.Var)]


def vars_in(expr) -> list[relax.Var]:
    """Every Var node under `expr` (those of nested functions too), in post order."""
    found = []
    relax.analysis.post_order_visit(
        expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


def last_uses(func: relax.Function, bindings) -> dict[relax.Var, int]:
    """Per variable, the last position in `bindings` (`func`'s, in order) that reads it;
    len(bindings) for those the function's result reads."""
    last = {}
    for position, binding in enumerate(bindings):
        for var in vars_in(binding.value):
            last[var] = position
    for var in vars_in(func.body.body):
        last[var] = len(bindings)
    return last


def remap(expr, mapping: dict):
    """`expr` with every Var or Constant that `mapping` holds replaced by its image."""
    if isinstance(expr, (relax.Var, tvm.ir.expr.Constant)):
        return mapping.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([remap(x, mapping) for x in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(remap(expr.tuple_value, mapping), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [remap(a, mapping) for a in expr.args], expr.attrs,
                          expr.ty_args)
    return expr
