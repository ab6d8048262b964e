"""A reduction to a handful of values, computed as partial sums in parallel vectors.

A group norm with one group (PoolFormer's), or a mean over a whole tensor, reduces hundreds of
thousands of elements into one value. The generic rule (cpu_schedule.py) vectorizes and spreads
a block over the cores along its output loops, and such a block has none to speak of: it ran as
one scalar chain of additions on one core, each waiting for the last. Here its innermost
reduction loop is split into `parts` interleaved partial sums (TVM's rfactor): a block of their
own whose parts run as vector lanes, their vectors in parallel, and the block adds the parts up.
Floating-point sums are then added in another order, as any vectorized reduction's are.
"""

from __future__ import annotations

import math

from .cpu_rules import static_extent

# A reduction to at most this many values, over at least MIN_REDUCED elements, is summed in
# parts: as many as the first of PARTS that divides its innermost reduction loop (whole vectors
# of 16, 8 or 4 float32 lanes; 64 gives each of two cores two vectors).
MAX_OUTPUTS = 4
MIN_REDUCED = 4096
PARTS = (64, 32, 16, 8)
LANES = 16  # float32 lanes of an AVX-512 vector (LLVM splits them for narrower ISAs)


def partial_sums(block) -> int | None:
    """How many partial sums `block` (dlight's BlockInfo) is reduced into, or None where it is
    not a reduction of at least `MIN_REDUCED` elements into at most `MAX_OUTPUTS` values."""
    iters = list(block.iters)
    if not any(it.kind == "R" for it in iters) or any(it.kind not in "SR" for it in iters):
        return None
    extents = [static_extent(it.dom) for it in iters]
    if any(extent is None for extent in extents):
        return None
    outputs = math.prod(e for it, e in zip(iters, extents) if it.kind == "S")
    reduced = math.prod(e for it, e in zip(iters, extents) if it.kind == "R")
    if outputs > MAX_OUTPUTS or reduced < MIN_REDUCED:
        return None
    innermost = [e for it, e in zip(iters, extents) if it.kind == "R"][-1]
    return next((parts for parts in PARTS if innermost % parts == 0), None)


def sum_in_parts(schedule, block, parts: int) -> None:
    """Schedule `block` as `parts` partial sums: the parts' block runs its vectors of parts
    in parallel, each vector accumulating along the reduction; `block` adds the parts up."""
    innermost = [it.loop_rv for it in block.iters if it.kind == "R"][-1]
    _, inner = schedule.split(innermost, [None, parts])
    partial = schedule.rfactor(inner, factor_axis=0)
    *outer, part = schedule.get_loops(partial)  # rfactor copies the nest: the part's innermost
    lanes = math.gcd(parts, LANES)
    vectors, lane = schedule.split(part, [None, lanes])
    schedule.reorder(vectors, *outer, lane)
    schedule.parallel(vectors)
    schedule.vectorize(lane)
    schedule.decompose_reduction(partial, outer[0] if outer else lane)

