"""Reductions along each row of a tensor (softmax's max and sum, a layer norm's mean and
variance), computed in vector lanes that walk the row, and elementwise loops that no vector
width divides, vectorized up to their last whole vector.

The generic rule (cpu_schedule.py) vectorizes a block's innermost spatial loop. A reduction
over the innermost, contiguous axis of its input has the rows as its spatial loops: vectorized
across rows, each lane reads another row (a gather, one row length apart), and over a vision
transformer's 197 tokens (a prime) no vector divides the rows at all, so each row is a scalar
chain of dependent additions, softmax's exp evaluated one element at a time. Here the row's loop
is split into `LANES` interleaved partial results (TVM's rfactor) held in one vector that walks
the row, the lanes are combined once per row, and the rows run in parallel. A row whose length
`LANES` does not divide ends in a tail of its own (`loop_partition`): only the tail's few
elements run one at a time, in the reductions and in the elementwise loops alike.
"""

from __future__ import annotations

import tvm

from .cpu_rules import static_extent

LANES = 16  # float32 lanes of an AVX-512 vector (LLVM splits them for narrower ISAs)
MIN_ROW = 32  # a shorter row is a vector or two: the lanes' combination would cost as much


def is_row_reduction(schedule, block) -> bool:
    """Whether `block` (dlight's BlockInfo) reduces each row of one input along its innermost
    dimension into one value: one reduction iterator, innermost, at least `MIN_ROW` long, read
    along by exactly one buffer and by it as its last index alone, one buffer written (not an
    argmax's index and value). A contraction (a matmul, also one with a transposed operand)
    reads two buffers along its reduction and is not one."""
    iters = list(block.iters)
    if (len(iters) < 2 or iters[-1].kind != "R"
            or any(iterator.kind != "S" for iterator in iters[:-1])
            or len(schedule.get(block.block_rv).writes) != 1):
        return False
    length = static_extent(iters[-1].dom)
    if length is None or length < MIN_ROW:
        return False
    reduced = iters[-1].var
    along = set()
    for region in schedule.get(block.block_rv).reads:
        uses = [any(var.same_as(reduced) for var in tvm.tirx.analysis.undefined_vars(dim.min))
                for dim in region.region]
        if not any(uses):
            continue
        last = region.region[-1]
        if (any(uses[:-1]) or not last.min.same_as(reduced)
                or static_extent(last.extent) != 1):
            return False
        along.add(region.source.name)
    return len(along) == 1


def reduce_rows(schedule, block) -> None:
    """Schedule the row reduction `block`: rows fused and parallel; per row, `LANES` partial
    results accumulated in one vector along the row (the tail past the last whole vector in a
    loop of its own), then combined into the row's value."""
    *rows, along = [iterator.loop_rv for iterator in block.iters]
    row = schedule.fuse(*rows) if len(rows) > 1 else rows[0]
    schedule.parallel(row)
    length = static_extent(schedule.get(along))
    steps, lane = schedule.split(along, [None, LANES])
    output_dims = len(schedule.get(block.block_rv).writes[0].region)
    partial = schedule.rfactor(lane, factor_axis=output_dims)
    # rfactor copies the row's loops: the partial results' block runs under the same row loop
    _, steps, lane = schedule.get_loops(partial)[-3:]
    schedule.vectorize(lane)  # before the init is split off: a block without one refuses
    init = schedule.decompose_reduction(partial, steps)
    schedule.vectorize(schedule.get_loops(init)[-1])
    if length % LANES:
        schedule.loop_partition(steps, [length // LANES, None])


def whole_vectors(extent: int | None) -> int | None:
    """The part of a loop of `extent` that whole vectors cover, where the rest is a tail
    (`LANES` does not divide it) and the loop is at least `MIN_ROW` long; else None."""
    if extent is None or extent < MIN_ROW or extent % LANES == 0:
        return None
    return extent - extent % LANES


def vectorize_with_tail(schedule, loop) -> None:
    """Vectorize `loop` (innermost, spatial, no annotation) over its whole vectors; the tail
    (`whole_vectors`) stays a loop of its own. Where TVM refuses the partition (it checks
    before it changes anything), the loop stays scalar, as the generic rule leaves it."""
    try:
        covered, _ = schedule.loop_partition(
            loop, [whole_vectors(static_extent(schedule.get(loop))), None])
    except tvm.s_tir.ScheduleError:
        return
    _, lane = schedule.split(covered, [None, LANES])
    schedule.vectorize(lane)
