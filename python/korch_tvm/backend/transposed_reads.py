"""The loop order of a kernel that writes its input transposed (a layout change, a concat into
another layout, a resize followed by one).

The default schedule keeps a block's loops in the order of its output and vectorizes the
innermost one. Where the largest input's innermost dimension is walked by an outer loop (NHWC
to NCHW: the channel loop is outside the rows and columns), every vector of outputs gathers
lanes a whole input row apart, and each input element is loaded on as many passes over the
input as that dimension is long: 21 passes over 5.5 MB for a segmentation head's 21 classes at
256x256, at L3 speed. Moved just outside the vector loop, the loop over the input's innermost
dimension sweeps a small tile of the input that stays in L1 while whole vectors are written:
that transpose went from 2.4 to 0.29 ms, NHWC to NCHW at 56x56x64 from 0.088 to 0.020 ms
(bench/results/transposed-reads.txt).
"""

from __future__ import annotations

import tvm


def transposed_loop(schedule, block) -> int | None:
    """Position, among the block's spatial loops, of the loop that walks the innermost
    dimension of its largest input, where that loop is outside the next-to-innermost; None
    otherwise (no transposed read, a reduction, no input, an innermost index that is not one
    loop's variable)."""
    if any(iterator.kind != "S" for iterator in block.iters):
        return None
    spatial = [str(iterator.var) for iterator in block.iters]
    sblock = schedule.get(block.block_rv)
    written = {region.source.name for region in sblock.writes}
    reads = [region for region in sblock.reads if region.source.name not in written]
    if len(spatial) < 2 or not reads:
        return None
    largest = max(reads, key=lambda region: _elements(region.source))
    innermost = largest.region[-1]
    if not isinstance(innermost.extent, tvm.tirx.IntImm) or int(innermost.extent) != 1:
        return None
    used = [str(var) for var in tvm.tirx.analysis.undefined_vars(innermost.min)]
    if len(used) != 1 or used[0] not in spatial[:-2]:
        return None
    return spatial.index(used[0])


def _elements(buffer) -> int:
    count = 1
    for dim in buffer.shape:
        count *= int(dim) if isinstance(dim, tvm.tirx.IntImm) else 1
    return count
