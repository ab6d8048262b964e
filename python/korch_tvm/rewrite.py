"""Plan -> Relax module: one fused kernel per chosen candidate, tuned schedules applied.

The kernels of the rebuilt `main` must be structurally the standalone kernels that were tuned,
or the tuning log would not find them; so every fused PrimFunc is put in the canonical form
kernels.py keys the log by before the log is applied. Nothing after this may re-fuse: the
module goes to `tvm.compile`, whose CPU and GPU pipelines do not run FuseOps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import tvm
from tvm import relax

from .kernels import canonical_prim_func


def canonicalize_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """Every PrimFunc called from Relax in the canonical form its tuning record is keyed by."""
    updated = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for global_var, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            updated[global_var] = canonical_prim_func(func)
    return updated


def apply_tuning_log(mod: tvm.IRModule, database, target) -> tvm.IRModule:
    """Replace each kernel that has a record in `database` with its best schedule."""
    canonical = canonicalize_kernels(mod)
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(canonical)


def rewrite_with_plan(graph, chosen_groups: Sequence[Iterable[int]], database, target
                      ) -> tvm.IRModule:
    """`main` rebuilt from the chosen node groups (in execution order), with schedules applied."""
    return apply_tuning_log(graph.build_partition_module(chosen_groups), database, target)


def scheduled_kernel_count(mod: tvm.IRModule) -> tuple[int, int]:
    """(PrimFuncs carrying a tuned schedule, all PrimFuncs): how much of the model is tuned."""
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    tuned = sum(bool(f.attrs is not None and f.attrs.get("tirx.is_scheduled", False))
                for f in funcs)
    return tuned, len(funcs)
