"""Node groups -> fused PrimFuncs: whole partition modules, standalone kernels, structural keys.

A group of primitive nodes becomes a private ``{"Primitive": True}`` Relax function (the form
FuseOps makes) and FuseTIR turns it into one PrimFunc. The same construction serves two uses:

* `build_partition_module(graph, groups)`: all of ``main`` rebuilt as a sequence of kernels
  ``korch_k<g>`` (g = position in ``groups``); groups may overlap (recomputation).
* `candidate_kernel(graph, nodes)`: one candidate alone, as ``IRModule({"main": PrimFunc})``,
  the unit MetaSchedule tunes and the tuning database is keyed by.

A group exports every value read outside it (its candidate outputs), so a kernel inside a
partition module is the same PrimFunc as the standalone candidate kernel. Constants read by a
group are lifted to parameters, so layers that differ only in weights give identical kernels.

The canonical form and keys are in `keys.py`, the partition module in `partition.py`, the shared
group construction in `group_block.py`; this module builds the standalone candidate kernels.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import tvm
import tvm_ffi
from tvm import relax

from ..graph.primitive_graph import KERNEL_PREFIX, PrimitiveGraph
from ..graph.relax_exprs import leaves
from ..support.memo import KeyedMemo
from .group_block import BindingBlock, group_function
from .kernel_facts import is_scheduled, kernel_blocks, kernel_flops, schedule_unscheduled, written_params
from .keys import canonical_prim_func, kernel_module, structural_key, structurally_equal_groups
from .partition import build_partition_module
from .weight_packing import mark_layout_free_weights

# The names below are imported from here across the package (costing, backend, pipeline, tools).
__all__ = ["DistinctKernels", "build_partition_module", "candidate_io", "candidate_kernel",
           "canonical_prim_func", "distinct_kernels", "is_scheduled", "kernel_blocks", "kernel_flops",
           "kernel_module", "schedule_unscheduled", "structural_key", "structurally_equal_groups",
           "written_params"]


def candidate_io(graph: PrimitiveGraph, nodes: Iterable[int]) -> tuple[list, list]:
    """The kernel's parameters in order: the Relax values it reads (Vars and Constants of the
    legalized main), then the Vars it writes (outputs follow inputs in the PrimFunc)."""
    block = BindingBlock(graph)
    members = block.members(nodes)
    return (block.external_inputs(members),
            [block.bindings[p].var for p in block.exports(members)])


def candidate_kernel(graph: PrimitiveGraph, nodes: Iterable[int],
                     block: BindingBlock | None = None) -> tvm.IRModule:
    """One candidate as a standalone `kernel_module`: what the partition module would run.

    `nodes` are the candidate's primitive ids (all fusible); `block` is the graph's
    `BindingBlock` when the caller builds many candidates and made it once.
    """
    block = block if block is not None else BindingBlock(graph)
    nodes = sorted(set(nodes))
    assert all(graph.nodes[i].fusible for i in nodes), "opaque nodes have no fused kernel"
    members = block.members(nodes)
    inputs = block.external_inputs(members)
    exports = block.exports(members)
    callees = {block.bindings[p].value.args[0] for p in members
               if isinstance(block.bindings[p].value, relax.Call)}
    builder = relax.BlockBuilder(tvm.IRModule({gv: graph.legalized[gv] for gv in callees}))
    kernel = builder.add_func(group_function(block, members, inputs, exports, 0),
                              f"{KERNEL_PREFIX}0")
    params = [relax.Var(f"p{k}", x.ty) for k, x in enumerate(inputs) if isinstance(x, relax.Var)]
    param_of = dict(zip([x for x in inputs if isinstance(x, relax.Var)], params))
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.Call(kernel, [param_of.get(x, x) for x in inputs]))
        builder.emit_func_output(out)
    fused = mark_layout_free_weights(relax.transform.FuseTIR()(builder.get()))
    return kernel_module(fused[f"{KERNEL_PREFIX}0"])


class DistinctKernels(NamedTuple):
    """Kernel modules by structural key, and the key of each candidate, in candidate order.

    A candidate holding a non-call_tir (opaque) node has no PrimFunc and its key is None.
    """

    modules: dict[str, tvm.IRModule]
    keys: list[str | None]


def distinct_kernels(graph: PrimitiveGraph, candidates: Sequence,
                     built: KeyedMemo | None = None) -> DistinctKernels:
    """Build each structurally distinct candidate once (candidates: `Candidate`s or node sets).

    Candidates are first grouped by a cheap wiring signature (member PrimFunc hashes, how they
    connect, input types), so FuseTIR runs once per signature, not once per candidate. The
    signature says nothing of the graph it was read from, so `built` (signature -> (key,
    module)) carries the kernels over to other graphs of one compile: the regions of a model
    repeat the whole model's candidates.
    """
    block = BindingBlock(graph)
    built = KeyedMemo() if built is None else built
    callee_hash: dict = {}
    modules: dict = {}
    keys: list = []
    for candidate in candidates:
        nodes = frozenset(getattr(candidate, "nodes", candidate))
        if any(not graph.nodes[i].fusible for i in nodes):
            keys.append(None)
            continue
        key, module = built.get(_wiring_signature(block, nodes, callee_hash),
                                lambda: _keyed(candidate_kernel(graph, nodes, block)))
        modules.setdefault(key, module)
        keys.append(key)
    return DistinctKernels(modules, keys)


def _keyed(module: tvm.IRModule) -> tuple[str, tvm.IRModule]:
    return structural_key(module), module


def _wiring_signature(block: BindingBlock, nodes, callee_hash: dict) -> tuple:
    """Equal signatures give structurally equal fused kernels (the construction is determined)."""
    members = block.members(nodes)
    local: dict = {}
    external: dict = {}
    entries = []
    for position in members:
        binding = block.bindings[position]
        value = binding.value
        if isinstance(value, relax.Call):
            if position not in callee_hash:
                callee = block.graph.legalized[value.args[0]]
                callee_hash[position] = tvm_ffi.structural_hash(canonical_prim_func(callee))
            extra = str(value.args[2:]) if len(value.args) > 2 else ""  # symbolic tir_vars
            head = ("call", callee_hash[position], extra)
        else:
            head = ("get", value.index)
        refs = []
        for leaf in leaves(value):
            if leaf in local:
                refs.append(local[leaf])
            else:
                if leaf not in external:  # a constant input makes a layout-free parameter
                    external[leaf] = (len(external), str(leaf.ty),
                                      isinstance(leaf, tvm.ir.expr.Constant))
                refs.append(("in", external[leaf]))
        local[binding.var] = len(local)
        entries.append((head, tuple(refs)))
    exports = tuple(members.index(p) for p in block.exports(members))
    return tuple(entries), exports
