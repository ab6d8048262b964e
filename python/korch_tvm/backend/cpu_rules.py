"""Per-kind rules the CPU default schedule applies before its generic rule (`cpu_schedule.py`).

The generic rule vectorizes a block's innermost spatial loop by a divisor of its extent and
tiles a reduction's rows by a divisor of theirs. Some kernels of real models have extents with
no such divisor: a vision transformer's 197 tokens (a prime) leave attention's Q K^T and P V and
every 197-row matmul with neither a vector nor a register tile, at a few percent of the peak.
Each rule here says whether it applies to a block (`applies`) and reshapes the block's loops so
the generic rule then finds what it needs (`apply`), with schedule primitives only, so the
schedule's trace replays on the kernel and the tuning log's default records keep their contract.
The rules run in `CPU_RULES`' order; one that raises leaves the block as it was (the caller
starts again from the kernel without the per-kind rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tvm

# A contraction's vector loop is padded to a multiple of this when its extent has no divisor
# from VECTOR_WIDTH_WANTED to 16 (one AVX-512 register of float32); its rows to a multiple of
# PAD_TILE_ROWS when no divisor from 4 to the tile's 8 (or 14) rows divides them.
PAD_VECTOR = 16
VECTOR_WIDTH_WANTED = 8
PAD_TILE_ROWS = 8
MIN_PADDED_EXTENT = 24  # below this a padded row or column costs more than it gains


class KindRule(NamedTuple):
    """A rule: its name, whether it applies to a block (dlight's BlockInfo), and the rule."""

    name: str
    applies: Callable
    apply: Callable


def apply_kind_rules(schedule, blocks, row_loop: Callable, tile_rows: Callable,
                     vector_width: Callable, row_reduction: Callable) -> set[str] | None:
    """Apply the first rule of `CPU_RULES` that applies to each of `blocks`. Returns the names
    of the blocks the rules added that must stay blocks of their own (not be inlined), or None
    where no rule applied. A rule whose primitive refuses the block (TVM checks before it
    changes anything) leaves it to the next rule.

    `row_loop`, `tile_rows` and `vector_width` are the generic rule's own choices (passed in so
    the rules pad exactly where the generic rule would otherwise give up); `row_reduction`
    says which blocks it reduces along their rows instead (row_reductions.py), left unpadded."""
    kept: set[str] | None = None
    context = {"row_loop": row_loop, "tile_rows": tile_rows, "vector_width": vector_width,
               "row_reduction": row_reduction}
    for block in blocks:
        for rule in CPU_RULES:
            if not rule.applies(schedule, block, context):
                continue
            try:
                added = rule.apply(schedule, block, context)
            except tvm.s_tir.ScheduleError:
                continue
            kept = (kept or set()) | added
            break
    return kept


# ----------------------------------------------------------------------------- padding
def _padding(schedule, block, context) -> list[int] | None:
    """Per block iterator the multiple to pad it to (1: unchanged), or None where the block is
    not a contraction the generic rule leaves without a vector or a register tile."""
    iters = list(block.iters)
    if (not any(it.kind == "R" for it in iters) or any(it.kind not in "SR" for it in iters)
            or context["row_reduction"](schedule, block)
            or not _indexed_plainly(schedule.get(block.block_rv))):
        return None
    extents = [it.dom if isinstance(it.dom, int) else static_extent(it.dom) for it in iters]
    if any(extent is None for extent in extents):
        return None
    spatial = [i for i, it in enumerate(iters) if it.kind == "S"]
    if len(spatial) < 2:
        return None
    padding = [1] * len(iters)
    vector = spatial[-1]
    width = context["vector_width"](extents[vector])
    if ((width is None or width < VECTOR_WIDTH_WANTED) and extents[vector] >= MIN_PADDED_EXTENT
            and not _reads_weight_along(schedule, block, iters[vector].var)):
        padding[vector] = PAD_VECTOR
    row = context["row_loop"](schedule, block)
    if row is not None:
        row_iter = spatial[row]
        if (context["tile_rows"](extents[row_iter]) < 4
                and extents[row_iter] >= MIN_PADDED_EXTENT):
            padding[row_iter] = PAD_TILE_ROWS
    return padding if any(p > 1 for p in padding) else None


def _indexed_plainly(sblock) -> bool:
    """Whether every buffer the block reads or writes is indexed by block variables alone or
    by 0 (a broadcast axis). TVM's pad_einsum does not refuse every other index: an operand
    read at a fixed slice (`b[1, j, k]`, a fused QKV tensor's K) is copied wrong, padded."""
    for region in list(sblock.reads) + list(sblock.writes):
        for dim in region.region:
            index = dim.min
            if not (isinstance(index, tvm.tirx.Var)
                    or (isinstance(index, tvm.tirx.IntImm) and int(index) == 0)):
                return False
    return True


def _reads_weight_along(schedule, block, var) -> bool:
    """Whether the block reads a layout-free weight (a model constant) along `var`: padding
    that axis would copy the whole weight on every call, so it is left alone."""
    func = schedule.mod["main"]
    free = list(func.attrs.get("layout_free_buffers", [])) if func.attrs is not None else []
    weights = {str(func.params[int(i)].name) for i in free}
    return any(str(region.source.name) in weights
               and any(var.same_as(used) for extent in region.region
                       for used in tvm.tirx.analysis.undefined_vars(extent.min))
               for region in schedule.get(block.block_rv).reads)


def static_extent(value) -> int | None:
    """A loop's or range's extent as a Python int, None where it is not a constant."""
    value = getattr(value, "extent", value)
    return int(value) if isinstance(value, (int, tvm.tirx.IntImm)) else None


def static_size(extents) -> int | None:
    """The product of `extents` (ranges, or a buffer's dimensions), None where one is not a
    constant."""
    total = 1
    for extent in extents:
        value = static_extent(extent)
        if value is None:
            return None
        total *= value
    return total


def block_points(block) -> int | None:
    """The number of points of a block's iteration space (None: not static)."""
    return static_size(iv.dom for iv in block.iter_vars)


def _pads(schedule, block, context) -> bool:
    return _padding(schedule, block, context) is not None


def _pad(schedule, block, context) -> set[str]:
    """Pad the contraction's iteration space (TVM's pad_einsum; only a block indexed by plain
    variables qualifies): zero-filled copies of the inputs, kept as loops of their own (inlined,
    their bounds test would sit inside the vector loop and scalarize it), and a copy of the
    output's valid part, which the generic rule inlines into the epilogue where it can."""
    before = {schedule.get(rv).name_hint for rv in schedule.get_producers(block.block_rv)}
    schedule.pad_einsum(block.block_rv, _padding(schedule, block, context))
    return {schedule.get(rv).name_hint for rv in schedule.get_producers(block.block_rv)} - before


CPU_RULES: tuple[KindRule, ...] = (
    KindRule("pad contraction extents", _pads, _pad),
)
