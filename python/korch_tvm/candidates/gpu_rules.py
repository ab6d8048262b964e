"""Kernel rules per target: what one GPU kernel can hold that a CPU kernel need not worry about.

`rules_for_target(target, max_kernel_size)` is what the Korch path enumerates candidates with.
CPU targets get the plain `KernelRules`. CUDA targets add one rule, read from the target's
limits (`max_shared_memory_per_block`, `max_threads_per_block`):

**A reduction whose result is used inside the same kernel must keep what its consumers read
in one thread block** (see `fits_in_thread_block` for the layout-consumer case). Thread blocks of one kernel cannot wait for each other, so when a kernel reduces a row
(softmax's max and sum, a norm's mean) and another primitive of the same kernel reads the
result (the subtract, the divide), each row is reduced and consumed by a single block. The
consumers read the row again after the reduction, so the schedules that make such a kernel
pay (dlight's GeneralReduction, MetaSchedule's cross-thread reduction) stage the row in shared
memory. If the row does not fit in `max_shared_memory_per_block`, the kernel re-reads it from
global memory for every consumer with one block per row, which is no better than the split
kernels and often far worse (few rows -> a few busy SMs). Such a candidate is dropped.
Reductions whose result only leaves the kernel (the last primitive of a group) need no
block-wide row and are unaffected, so every primitive stays computable.

The rule is a filter on emitted candidates (`KernelRules.accept`). It is monotone (any
superset still holds the offending reduction and its consumer), so filtering loses nothing the
enumerator could have grown from. TVM's own FuseOps groups bypass it (they are always kept, so
the stock plan stays feasible), and TVM builds them with the same dlight rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
from tvm import relax

from ..graph.primitive_graph import CALL_TIR, PrimitiveGraph
from ..kernels.fused import kernel_blocks
from ..support.tir_blocks import REDUCE
from .enumerate import Candidate, KernelRules

DEFAULT_SHARED_MEMORY_BYTES = 48 * 1024
# Linear ops whose default GPU schedule keeps the output tile in registers (see below).
REGISTER_EPILOGUE_OPS = frozenset({"relax.matmul", "relax.linear", "relax.nn.dense"})  # CUDA's static per-block limit on every arch since sm_20


def rules_for_target(target, max_kernel_size: int = 8, **overrides) -> KernelRules:
    """The KernelRules for `target` (a TVM Target); extra fields override the defaults."""
    if target.kind.name != "cuda":
        return KernelRules(max_kernel_size=max_kernel_size, **overrides)
    accept = ThreadBlockFit(gpu_limits(target)["max_shared_memory_per_block"])
    return KernelRules(max_kernel_size=max_kernel_size, accept=overrides.pop("accept", accept),
                       **overrides)


def gpu_limits(target) -> dict[str, int]:
    """Per-block limits of a CUDA target (the target's own attributes, else CUDA's defaults)."""
    def attr(name: str, default: int) -> int:
        value = target.attrs.get(name, None)
        return int(value) if value is not None and int(value) > 0 else default

    return {"max_shared_memory_per_block": attr("max_shared_memory_per_block",
                                                DEFAULT_SHARED_MEMORY_BYTES),
            "max_threads_per_block": attr("max_threads_per_block", 1024)}


class ThreadBlockFit:
    """`KernelRules.accept` for a CUDA target: `fits_in_thread_block` at `shared_memory_bytes`.

    The enumerator asks about the same reductions for every candidate of a graph, so their row
    bytes are kept here, for the graph this rule judges (a rule asked about another graph
    starts afresh); the rules, made per graph, take them with them when they go.
    """

    def __init__(self, shared_memory_bytes: int) -> None:
        self.shared_memory_bytes = shared_memory_bytes
        self._graph: PrimitiveGraph | None = None
        self._rows: dict[int, int | None] = {}

    def __call__(self, candidate: Candidate, graph: PrimitiveGraph) -> bool:
        if graph is not self._graph:
            self._graph, self._rows = graph, {}
        return fits_in_thread_block(candidate, graph, shared_memory_bytes=self.shared_memory_bytes,
                                    row_bytes=self._row_bytes)

    def _row_bytes(self, graph: PrimitiveGraph, index: int) -> int | None:
        if index not in self._rows:
            self._rows[index] = reduction_row_bytes(graph, index)
        return self._rows[index]


def fits_in_thread_block(candidate: Candidate, graph: PrimitiveGraph, *,
                         shared_memory_bytes: int,
                         row_bytes: Callable[[PrimitiveGraph, int], int | None] | None = None
                         ) -> bool:
    """False when a reduction consumed inside the candidate needs more shared memory than a block has.

    Need per block: the reduced row for a reduce whose in-kernel consumers are elementwise or
    broadcast; the reduction's whole output when a layout primitive (transpose, reshape, ...)
    reads it, directly or further down, inside the kernel (a reordering reads elements other
    blocks computed, so the default GPU schedule stages the whole tensor in one block's shared
    memory, which ptxas refuses as "uses too much shared data"). Matmuls are exempt:
    dlight's Matmul rule (and MetaSchedule's tiling) writes any epilogue, reordering ones too,
    straight from the register tiles; convolutions have no such rule and are scheduled as
    general reductions, so they are treated like reductions here. `row_bytes(graph, index)`
    gives a reduction's row bytes (None: `reduction_row_bytes`, computed each time).
    """
    row_bytes = row_bytes or reduction_row_bytes
    members = candidate.nodes
    if len(members) < 2:
        return True
    mask = graph.mask(members)
    for index in members:
        node = graph.nodes[index]
        if node.kind not in ("reduce", "linear") or node.op_name in REGISTER_EPILOGUE_OPS:
            continue
        inside = graph.descendants[index] & mask
        if not inside:
            continue
        if any(graph.nodes[j].kind == "layout" for j in _bit_indices(inside)):
            need = output_bytes(graph, index)
        elif node.kind == "reduce":
            need = row_bytes(graph, index)
        else:
            continue
        if need is not None and need > shared_memory_bytes:
            return False
    return True


def output_bytes(graph: PrimitiveGraph, index: int) -> int | None:
    """Bytes of node `index`'s output (None for tuple or symbolic outputs)."""
    node = graph.nodes[index]
    return node.out_bytes if len(node.out_shapes) == 1 else None


def _bit_indices(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def reduction_row_bytes(graph: PrimitiveGraph, index: int) -> int | None:
    """Bytes of one reduced row of node `index`: product of its reduction extents x dtype size.

    Read from the node's PrimFunc (its reduction blocks' iteration extents); None when the
    graph has no module or the extents are symbolic.
    """
    if graph.legalized is None:
        return None
    func = _node_prim_func(graph, index)
    if func is None:
        return None
    extent, bits = _largest_reduction(func)
    if extent is None:
        return None
    return extent * max(1, bits // 8)


def _node_prim_func(graph: PrimitiveGraph, index: int):
    node = graph.nodes[index]
    bindings = graph.legalized[graph.func_name].body.blocks[0].bindings
    for position in node.bindings:
        value = bindings[position].value
        if isinstance(value, relax.Call) and value.op.same_as(CALL_TIR):
            return graph.legalized[value.args[0]]
    return None


def _largest_reduction(func) -> tuple[int | None, int]:
    """(largest product of reduction extents over the blocks, bits of what that block writes)."""
    best, bits = None, 32
    for block in kernel_blocks(tvm.IRModule({"main": func})):
        extents = [iv.dom.extent for iv in block.iter_vars if int(iv.iter_type) == REDUCE]
        if not extents or not all(isinstance(e, tvm.tirx.IntImm) for e in extents):
            continue
        size = math.prod(int(e) for e in extents)
        if best is None or size > best:
            best = size
            if block.writes:
                bits = tvm.DataType(str(block.writes[0].source.dtype)).bits
    return best, bits
