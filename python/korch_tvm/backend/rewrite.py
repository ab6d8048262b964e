"""Plan -> Relax module: a fused kernel per chosen candidate (equal ones shared), scheduled.

The kernels of the rebuilt `main` must be structurally the standalone kernels that were tuned,
or the tuning log would not find them; so every fused PrimFunc is put in the canonical form
kernels/fused.py keys the log by before the log is applied. Nothing after this may re-fuse: the
module is built by `cuda_build.build`, which runs TVM's CPU pipeline (it does not fuse) or its
CUDA pipeline without FuseOps/FuseTIR (the stock CUDA pipeline would re-fuse). Kernels the
plan gives to a library (their cost is a library call's) are replaced by that call first, while
they are still the unscheduled kernels the call is matched on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import tvm
from tvm import relax

from ..graph.primitive_graph import KERNEL_PREFIX
from ..kernels.fused import (build_partition_module, canonical_prim_func, is_scheduled,
                             structurally_equal_groups)
from ..kernels.weight_packing import (mark_layout_free_weights, pack_constant_weights,
                                      redirect_calls)
from . import cpu_schedule
from .cuda import is_cuda


def canonicalize_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """Every PrimFunc called from Relax in the canonical form its tuning record is keyed by
    (including the layout-free weight parameters, read from the call sites)."""
    updated = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for global_var, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            updated[global_var] = canonical_prim_func(func)
    return mark_layout_free_weights(updated)


def apply_tuning_log(mod: tvm.IRModule, database, target, *, pack_weights: bool = True
                     ) -> tvm.IRModule:
    """Replace each kernel that has a record in `database` with its best schedule, give the
    others the CPU default schedule (the one their cost was measured with), then (with
    `pack_weights`) compute the weight layouts those schedules chose once, at compile time."""
    canonical = canonicalize_kernels(mod)
    with target, database:
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(canonical)
    if not is_cuda(target):  # CUDA's pipeline schedules the rest (cuda_build.relax_pipeline)
        tuned = cpu_schedule.default_schedule_pass(target)(tuned)
    return pack_constant_weights(tuned) if pack_weights else tuned


def rewrite_with_plan(graph, chosen_groups: Sequence[Iterable[int]], database, target,
                      library_kernels: Collection[str] = ()) -> tvm.IRModule:
    """`main` rebuilt from the chosen node groups (in execution order), the kernels named in
    `library_kernels` (see `library_kernel_names`) as library calls, schedules applied."""
    partition = use_library_kernels(build_partition_module(graph, chosen_groups),
                                    library_kernels, target)
    return share_identical_kernels(apply_tuning_log(partition, database, target))


def library_kernel_names(chosen_keys: Sequence[str | None], costs: Mapping) -> list[str]:
    """Names, in the partition module of a plan, of its kernels whose cost is a library
    implementation's (`KernelCost.implementation`): the plan's g-th chosen group is the
    PrimFunc `korch_k<g>` (kernels/partition.py); `chosen_keys` are their kernel keys."""
    return [f"{KERNEL_PREFIX}{g}" for g, key in enumerate(chosen_keys)
            if key is not None and getattr(costs.get(key), "implementation", None)]


def use_library_kernels(partition: tvm.IRModule, names: Collection[str], target
                        ) -> tvm.IRModule:
    """`partition` (unscheduled kernels, before the tuning log is applied) with the kernels
    `names` replaced by their library calls for `target` (cuBLAS on CUDA, else OpenBLAS); a
    named kernel without one is an error."""
    if not names:
        return partition
    from ..library import UseLibraryGemm

    return UseLibraryGemm(kernels=names, device="cuda" if is_cuda(target) else "cpu")(partition)


def share_identical_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """One PrimFunc per distinct kernel: calls to a structurally equal copy go to the first
    (by name), and the copies are dropped.

    The plan gives each chosen group its own PrimFunc, and a model's repeated blocks make many
    of them equal; TVM's own fusion shares such copies (BlockBuilder.add_func), and each copy
    costs LLVM time and library size.
    """
    prim_funcs = {global_var: func for global_var, func in
                  sorted(mod.functions_items(), key=lambda item: item[0].name_hint)
                  if isinstance(func, tvm.tirx.PrimFunc)}
    twin_of = {copy.name_hint: kept
               for kept, equal in structurally_equal_groups(prim_funcs).items()
               for copy in equal[1:]}
    if not twin_of:
        return mod
    shared = redirect_calls(mod, lambda call: twin_of.get(call.args[0].name_hint))
    return tvm.IRModule({global_var: func for global_var, func in shared.functions_items()
                         if global_var.name_hint not in twin_of}, attrs=shared.attrs)


def scheduled_kernel_count(mod: tvm.IRModule) -> tuple[int, int]:
    """(PrimFuncs carrying a schedule from the log, all PrimFuncs): how much of the model is
    tuned (the CPU default schedule does not count)."""
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    tuned = sum(is_scheduled(f) and not f.attrs.get(cpu_schedule.DEFAULT_SCHEDULE_ATTR, False)
                for f in funcs)
    return tuned, len(funcs)
