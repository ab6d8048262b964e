"""One Relax mutator applied to every Relax function of a module: the frame of each rewrite here."""

from __future__ import annotations

import tvm
from tvm import relax


def mutate_relax_functions(mutator, mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every Relax function rewritten by `mutator` (a PyExprMutator made on `mod`)."""
    for global_var, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(global_var, mutator.visit_expr(func))
    return mutator.builder_.get()


def bound_values(mod: tvm.IRModule) -> dict:
    """What each variable of the module's Relax functions is bound to (a rewrite that follows
    a value back through the bindings before it reads this)."""
    values = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            values.update(relax.analysis.get_var2val(func))
    return values
