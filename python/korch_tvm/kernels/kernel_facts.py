"""What a kernel module holds (FLOPs, blocks, written parameters) and whether it is scheduled.

Small queries the cost model, the record check, the GPU rules and the backends ask of a kernel,
kept apart from the construction of kernels.
"""

from __future__ import annotations

from typing import Sequence

import tvm

from ..support.tir_blocks import blocks_of


def kernel_flops(kernel_mod: tvm.IRModule) -> float:
    """TVM's FLOP estimate of a standalone kernel; 0 where it has none (opaque calls)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(kernel_mod))
    except Exception:  # noqa: BLE001 - TVM raises a generic error for what it cannot count
        return 0.0


def kernel_blocks(kernel_mod: tvm.IRModule) -> list:
    """Every block of the kernel's `main`, nested ones included (the root left out), in the
    order of the code."""
    return blocks_of(kernel_mod["main"])


def written_params(kernel_mod: tvm.IRModule, blocks: Sequence | None = None) -> list[bool]:
    """For each parameter of `main`, whether some block writes it (an output).

    `blocks` are the kernel's `kernel_blocks` when the caller has them already.
    """
    written = [region.source for block in (blocks if blocks is not None
                                           else kernel_blocks(kernel_mod))
               for region in block.writes]
    return [any(param.same_as(source) for source in written)
            for param in kernel_mod["main"].params]


def is_scheduled(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a PrimFunc carries a schedule (from a tuning record or a default rule)."""
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def schedule_unscheduled(mod: tvm.IRModule, schedule_of, marks: Sequence[str] = ()
                         ) -> tvm.IRModule:
    """`mod` with every unscheduled PrimFunc replaced by `schedule_of(func)` (an s_tir Schedule
    of `{"main": func}`, or None to leave the function as it is), marked as scheduled and with
    each attribute of `marks` set: the one loop of the CPU and the GPU default schedules."""
    updated = {}
    for global_var, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and not is_scheduled(func):
            schedule = schedule_of(func)
            if schedule is not None:
                scheduled = schedule.mod["main"]
                for attr in ("tirx.is_scheduled", *marks):
                    scheduled = scheduled.with_attr(attr, True)
                updated[global_var] = scheduled
    for global_var, func in updated.items():
        mod[global_var] = func
    return mod
