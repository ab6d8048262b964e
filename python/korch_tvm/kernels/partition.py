"""All of main rebuilt as a sequence of kernels, one per (possibly overlapping) node group."""

from __future__ import annotations

from typing import Iterable, Sequence

import tvm
from tvm import relax

from ..graph.primitive_graph import KERNEL_PREFIX, PrimitiveGraph
from ..support.toposort import ordered_topologically
from ..graph.relax_exprs import leaves, remap
from .group_block import BindingBlock, group_function
from .weight_packing import mark_layout_free_weights


def build_partition_module(graph: PrimitiveGraph, groups: Sequence[Iterable[int]]) -> tvm.IRModule:
    """Rebuild main as the given (possibly overlapping) node groups, each one kernel korch_k<g>.

    Every node must be in some group; opaque nodes must be alone; groups must be convex and
    their dependencies acyclic. A value read by a group that lacks its node comes from the first
    group exporting it (the first group containing it exports it if none does).

    With alternatives (graph/alternatives.py) a node may be in no group: either nothing the
    groups compute reads it, or it is a replaced node whose alternative's node is in a group,
    and then its readers (and main's result) read that node's value instead.
    """
    block = BindingBlock(graph)
    groups = [sorted(set(g)) for g in groups]
    _check_groups(graph, groups)
    members = [block.members(g) for g in groups]
    inputs = [block.external_inputs(m) for m in members]
    exports = [block.exports(m) for m in members]
    source: dict = {}  # binding position -> group whose result supplies it to others
    for g, exported in enumerate(exports):
        for position in exported:
            source.setdefault(position, g)
    aliases = _aliases(block, members, source)
    _export_what_is_read(block, members, inputs, exports, source)
    order = _unit_order(block, members, inputs, source)

    module_builder = relax.BlockBuilder(graph.legalized)
    callees = {g: module_builder.add_func(
        group_function(block, members[g], inputs[g], exports[g], g), f"{KERNEL_PREFIX}{g}")
        for g in range(len(groups)) if graph.nodes[groups[g][0]].fusible}
    main_builder = relax.BlockBuilder()
    func = block.func
    attrs = dict(func.attrs.items()) if func.attrs is not None else None
    with main_builder.function(graph.func_name, list(func.params), attrs=attrs):
        with main_builder.dataflow():
            mapping: dict = {}
            for kind, unit in order:
                _emit_unit(main_builder, block, kind, unit, members, inputs, exports, source,
                           callees, mapping)
                for original, offered in aliases.items():  # read the equal value instead
                    if kind == "group" and source[original] == unit:
                        mapping[block.bindings[original].var] = \
                            mapping[block.bindings[offered].var]
            for position, binding in enumerate(block.bindings):
                if position in block.node_positions and block.escapes[position]:
                    mapping[binding.var] = main_builder.emit_output(mapping[binding.var])
        main_builder.emit_func_output(remap(func.body.body, mapping))
    module_builder.update_func(graph.legalized.get_global_var(graph.func_name),
                               main_builder.get()[graph.func_name])
    fused = relax.transform.FuseTIR()(module_builder.get())
    fused = mark_layout_free_weights(fused)  # as candidate_kernel does: the same keys
    return relax.transform.DeadCodeElimination([graph.func_name])(fused)


def _export_what_is_read(block: BindingBlock, members, inputs, exports, source: dict) -> None:
    """Make the first group holding a value another group reads export it (in place: `exports`,
    `source`); a value no group computes, nor an equal tensor, is refused."""
    for group_inputs in inputs:
        for leaf in group_inputs:
            position = block.position_of.get(leaf)
            if position in block.node_positions and position not in source:
                owner = next((h for h, m in enumerate(members) if position in m), None)
                if owner is None:
                    raise ValueError(f"{leaf.name} is read but no group computes it or an "
                                     "equal tensor")
                exports[owner] = sorted(exports[owner] + [position])
                source[position] = owner
    for position in range(len(block.bindings)):  # escaping values need a source too
        if block.escapes[position] and position in block.node_positions:
            assert position in source, "an escaping value has no exporting group"


def _aliases(block: BindingBlock, members, source: dict) -> dict[int, int]:
    """Original position -> offered position, for each replaced tensor no group computes but
    an alternative's node does: its readers read that node's value (and it supplies them)."""
    covered = {p for m in members for p in m}
    aliases = {}
    for offered, original in block.offered.items():
        if original not in covered and offered in covered and original not in aliases:
            aliases[original] = offered
            source[original] = source[offered]
    return aliases


def _check_groups(graph: PrimitiveGraph, groups: list[list[int]]) -> None:
    covered = {i for g in groups for i in g}
    if not graph.alternatives and covered != set(range(len(graph))):
        missing = sorted(set(range(len(graph))) - covered)[:5]
        raise ValueError(f"groups must cover every node; missing {missing}")
    for g, nodes in enumerate(groups):
        if len(nodes) > 1 and any(not graph.nodes[i].fusible for i in nodes):
            raise ValueError(f"group {g} puts an opaque (non-call_tir) node with others")
        if not graph.is_convex(graph.mask(nodes)):
            raise ValueError(f"group {g} is not convex: {nodes}")


def _unit_order(block: BindingBlock, members, inputs, source) -> list[tuple[str, int]]:
    """Topological order of groups and glue bindings, earliest binding first."""
    glue = [p for p in range(len(block.bindings)) if p not in block.node_positions
            and not _reads_uncomputed(block, p, source)]
    units = [("group", g) for g in range(len(members))] + [("glue", p) for p in glue]
    reads = [inputs[g] for g in range(len(members))] + [
        leaves(block.bindings[p].value) for p in glue]
    unit_of_glue = {p: len(members) + k for k, p in enumerate(glue)}
    deps = []
    for u, read in enumerate(reads):
        found = set()
        for leaf in read:
            position = block.position_of.get(leaf)
            if position is None:
                continue
            found.add(unit_of_glue[position] if position in unit_of_glue else source[position])
        deps.append(found - {u})
    start = [members[g][0] for g in range(len(members))] + glue
    order = ordered_topologically(deps, start)
    if order is None:
        raise ValueError("the groups depend on each other in a cycle; no schedule exists")
    return [units[u] for u in order]


def _reads_uncomputed(block: BindingBlock, position: int, source: dict) -> bool:
    """Whether a glue binding reads a node no group computes (only an unchosen alternative's
    or a replaced original's glue can); such glue is not emitted."""
    for leaf in leaves(block.bindings[position].value):
        read = block.position_of.get(leaf)
        if read is not None and read in block.node_positions and read not in source:
            assert block.graph.alternatives, "glue reads a node no group computes"
            return True
    return False


def _emit_unit(builder, block, kind, unit, members, inputs, exports, source, callees, mapping):
    if kind == "glue":
        binding = block.bindings[unit]
        value = remap(binding.value, mapping)
        emit = builder.emit if isinstance(binding.var, relax.DataflowVar) else builder.emit_output
        mapping[binding.var] = emit(value, binding.var.name)
        return
    if unit not in callees:  # an opaque node: its bindings stay as they are
        for position in members[unit]:
            binding = block.bindings[position]
            mapping[binding.var] = builder.emit(remap(binding.value, mapping), binding.var.name)
        return
    call = relax.Call(callees[unit], [remap(x, mapping) for x in inputs[unit]])
    supplied = [p for p in exports[unit] if source[p] == unit]
    if len(exports[unit]) == 1:
        result = builder.emit(call, block.bindings[exports[unit][0]].var.name)
        if supplied:
            mapping[block.bindings[supplied[0]].var] = result
        return
    result = builder.emit(call, f"{KERNEL_PREFIX}{unit}_out")
    for k, position in enumerate(exports[unit]):
        if position in supplied:
            var = block.bindings[position].var
            mapping[var] = builder.emit(relax.TupleGetItem(result, k), var.name)

