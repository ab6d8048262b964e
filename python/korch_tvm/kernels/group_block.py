"""The legalized main as bindings, and one node group as a private Primitive Relax function.

The construction both a partition module (`partition.py`) and a standalone candidate kernel
(`fused.py`) share, so that a kernel inside a partition is the same PrimFunc as the candidate.
"""

from __future__ import annotations

from typing import Iterable

import tvm
from tvm import relax

from ..graph.alternatives import counts_as_reader, site_of_node
from ..graph.primitive_graph import PrimitiveGraph
from ..graph.relax_exprs import leaves, remap


class BindingBlock:
    """Binding-level facts of the legalized main that every group construction needs."""

    def __init__(self, graph: PrimitiveGraph):
        assert graph.legalized is not None, "a graph built with from_edges has no module"
        self.graph = graph
        self.func = graph.legalized[graph.func_name]
        self.bindings = list(self.func.body.blocks[0].bindings)
        self.position_of = {b.var: p for p, b in enumerate(self.bindings)}
        self.readers = [set() for _ in self.bindings]
        site_of = _site_of_position(graph)
        for position, binding in enumerate(self.bindings):
            for leaf in leaves(binding.value):
                if isinstance(leaf, relax.Var) and leaf in self.position_of:
                    read = self.position_of[leaf]
                    if counts_as_reader(read, position, site_of):  # as candidates count them
                        self.readers[read].add(position)
        returned = {x for x in leaves(self.func.body.body) if isinstance(x, relax.Var)}
        self.escapes = [not isinstance(b.var, relax.DataflowVar) or b.var in returned
                        for b in self.bindings]
        self.node_positions = {p for n in graph.nodes for p in n.bindings}
        # an offered node (graph/alternatives.py) is read by its original's readers, which
        # read the original's var: its value is always exported for them
        self.offered = {graph.nodes[offer].bindings[0]: graph.nodes[original].bindings[0]
                        for site in graph.alternatives for offer, original in site.equivalences}

    def members(self, nodes: Iterable[int]) -> list[int]:
        """The binding positions of the primitive ids `nodes`, in binding order."""
        return sorted(p for i in set(nodes) for p in self.graph.nodes[i].bindings)

    def external_inputs(self, members: list[int]) -> list:
        """Vars and constants read by the members but bound outside, in first-read order."""
        inside = {self.bindings[p].var for p in members}
        found: dict = {}
        for position in members:
            for leaf in leaves(self.bindings[position].value):
                if leaf not in inside and leaf not in found:
                    found[leaf] = None
        return list(found)

    def exports(self, members: list[int]) -> list[int]:
        """The positions among `members` whose values are read outside them or escape main."""
        member_set = set(members)
        return [p for p in members
                if self.escapes[p] or p in self.offered or not self.readers[p] <= member_set]


def _site_of_position(graph: PrimitiveGraph) -> dict[int, int]:
    """Binding position -> the alternative its node belongs to (originals are absent)."""
    return {p: k for node, k in site_of_node(graph.alternatives).items()
            for p in graph.nodes[node].bindings}


def group_function(block: BindingBlock, members, inputs, exports, group: int) -> relax.Function:
    """The private Primitive function computing `members`; returns the exported values.

    `members` and `exports` are binding positions (`BindingBlock.members`, `.exports`), `inputs`
    the values it reads from outside (`.external_inputs`), in parameter order; `group` tags it.
    """
    sub = relax.BlockBuilder()
    params = [relax.Var(x.name if isinstance(x, relax.Var) else f"c{k}", x.ty)
              for k, x in enumerate(inputs)]
    attrs = {"Primitive": True, "korch_group": group}  # korch_group also defeats add_func dedup
    with sub.function("f", params, attrs=attrs, private=True):
        with sub.dataflow():
            mapping = dict(zip(inputs, params))
            for position in members:
                binding = block.bindings[position]
                mapping[binding.var] = sub.emit(remap(binding.value, mapping), binding.var.name)
            outs = [mapping[block.bindings[p].var] for p in exports]
            out = sub.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        sub.emit_func_output(out)
    (function,) = [f for _, f in sub.get().functions_items()]
    return function
