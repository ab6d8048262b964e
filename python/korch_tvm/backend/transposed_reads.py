"""The loop order of a kernel that writes its input transposed (a layout change, a concat into
another layout, a resize followed by one).

The default schedule keeps a block's loops in the order of its output and vectorizes the
innermost one. Where the largest input's innermost dimension is walked by another loop, every
vector of outputs gathers lanes a whole input row apart: with that loop outside the others
(NHWC to NCHW: channels outside rows and columns) each input element is loaded on as many
passes over the input as that dimension is long (21 passes over 5.5 MB for a segmentation
head's 21 classes at 256x256), and with it just outside the vector (NCHW to NHWC) one sweep of
all channels for a pixel touches more rows than L1 holds before the next pixel comes back to
them. Here the loop over the input's innermost dimension goes between the vector and the
vector's outer loop: a tile of one vector of outputs by that whole dimension reads a patch of
the input that stays in L1, and whole vectors are written. That NHWC-to-NCHW transpose went from
1.4-2.4 to 0.22-0.28 ms, NCHW to NHWC at 64x64x1024 from 13.7 to 1.1 ms
(bench/results/transposed-reads.txt).
"""

from __future__ import annotations

import tvm

from .cpu_rules import static_extent, static_size


def transposed_loop(schedule, block) -> int | None:
    """Position, among the block's spatial loops, of the loop that walks the innermost
    dimension of its largest input, where that is not the innermost loop; None otherwise (no
    transposed read, a reduction, no input, an innermost index that is not one loop's
    variable)."""
    if any(iterator.kind != "S" for iterator in block.iters):
        return None
    spatial = [str(iterator.var) for iterator in block.iters]
    sblock = schedule.get(block.block_rv)
    written = {region.source.name for region in sblock.writes}
    reads = [region for region in sblock.reads if region.source.name not in written]
    if len(spatial) < 2 or not reads:
        return None
    largest = max(reads, key=lambda region: _static_elements(region.source))
    innermost = largest.region[-1]
    if not isinstance(innermost.extent, tvm.tirx.IntImm) or int(innermost.extent) != 1:
        return None
    used = [str(var) for var in tvm.tirx.analysis.undefined_vars(innermost.min)]
    if len(used) != 1 or used[0] not in spatial[:-1]:
        return None
    return spatial.index(used[0])


def _static_elements(buffer) -> int:
    """The product of the buffer's constant dimensions (a dynamic one counts as 1)."""
    return static_size(dim for dim in buffer.shape if static_extent(dim) is not None)
