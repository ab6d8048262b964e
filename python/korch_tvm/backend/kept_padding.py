"""Which padding blocks the CPU default schedule keeps as loops of their own.

Inlined into a convolution (or a pooling window), a padding block becomes a bounds test on
every input read in the reduction's innermost loops: a register tile of eight output pixels
then tests eight conditions per input channel, and a tile two vectors wide is slower than one
(bench/results/kept-padding.txt). Kept, the padded input is written once, at copy speed, and
the reduction reads it unconditionally. Where the copy is not small beside the reduction it
costs more than it saves (bench/results/kept-padding/), so it is kept only for compute-bound
reductions over a tensor it grows little (the two constants below); elsewhere it is inlined.
"""

from __future__ import annotations

import tvm

from ..support.tir_blocks import is_reduction
from .cpu_rules import block_points, static_size


# Kept only where the copy is cheap beside the reduction: the padded tensor at most this many
# times the input (a 3x3 convolution on a 7 x 7 map grows it 1.65x; a dilated one padded by
# 12 on a 16 x 16 map would write 6.25x it)...
MAX_PADDED_GROWTH = 2.0
# ...and the reduction at least this many multiply-adds per padded element (a 3x3 convolution
# over 64 channels does 576; a depthwise one 9 and a pooling window fewer: memory-bound, where
# a second pass over the input costs what the bounds tests did).
MIN_REDUCTION_PER_ELEMENT = 64


def padding_read_by_reductions(schedule, block_rvs) -> set[str]:
    """Names of those of `block_rvs` that pad a tensor with a constant, little, and that a
    compute-bound reduction reads."""
    kept = set()
    for rv in block_rvs:
        block = schedule.get(rv)
        if not _pads_with_constant(block):
            continue
        padded = block_points(block)
        source = static_size(block.reads[0].source.shape) if len(block.reads) == 1 else None
        if not padded or not source or padded > MAX_PADDED_GROWTH * source:
            continue
        work = max((block_points(schedule.get(consumer)) or 0
                    for consumer in schedule.get_consumers(rv)
                    if is_reduction(schedule.get(consumer))), default=0)
        if work >= MIN_REDUCTION_PER_ELEMENT * padded:
            kept.add(block.name_hint)
    return kept


def _pads_with_constant(block) -> bool:
    """`out[i] = if_then_else(i inside the input, in[i - offset], constant)`, as TOPI's pad
    writes it (or as a select)."""
    store = block.body
    if not isinstance(store, tvm.tirx.BufferStore) or block.iter_vars is None:
        return False
    value = store.value
    if isinstance(value, tvm.tirx.Select):
        otherwise = value.false_value
    elif isinstance(value, tvm.ir.expr.Call) and value.op.same_as(_IF_THEN_ELSE):
        otherwise = value.args[2]
    else:
        return False
    return (isinstance(otherwise, (tvm.tirx.FloatImm, tvm.tirx.IntImm))
            and all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in block.iter_vars))


_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")
