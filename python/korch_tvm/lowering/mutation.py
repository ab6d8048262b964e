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
