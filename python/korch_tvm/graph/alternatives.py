"""Alternatives in the primitive graph: which nodes compute the same tensors another way.

A site is one offered alternative (substitutions/offer.py) read back as node ids: its own nodes
(`nodes`), the original nodes whose tensors it recomputes (`replaced`) and, for each, the node of
the alternative equal to it (`offers`). A tensor's *class* is its original node; an offered
node stands for the class of the node it replaces. With no sites every node is its own class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import tvm
from tvm import relax


@dataclass(frozen=True)
class AlternativeSite:
    """One alternative as nodes of the graph."""

    rule: str
    nodes: frozenset[int]          # the alternative's primitives
    replaced: tuple[int, ...]      # original nodes it recomputes
    offers: tuple[int, ...]        # offers[k] computes the tensor of replaced[k]

    @property
    def equivalences(self) -> tuple[tuple[int, int], ...]:
        """(offered node, original node) pairs."""
        return tuple(zip(self.offers, self.replaced))


def class_map(sites: Iterable[AlternativeSite]) -> dict[int, int]:
    """Offered node -> the original node whose tensor it computes (its class)."""
    classes: dict[int, int] = {}
    for site in sites:
        for offered, original in site.equivalences:
            classes[offered] = original
    return classes


def in_classes(nodes: Iterable[int], classes: dict[int, int]) -> frozenset[int]:
    """`nodes` as tensor classes (each offered node replaced by its original)."""
    return frozenset(classes.get(node, node) for node in nodes)


def alternative_nodes(sites: Iterable[AlternativeSite]) -> frozenset[int]:
    """Every node that belongs to some alternative."""
    return frozenset(node for site in sites for node in site.nodes)


def site_of_node(sites: Iterable[AlternativeSite]) -> dict[int, int]:
    """Node -> the index of the site it belongs to (original nodes are absent)."""
    return {node: k for k, site in enumerate(sites) for node in site.nodes}


def counts_as_reader(producer: int, reader: int, site_of: dict[int, int]) -> bool:
    """Whether `reader` makes `producer`'s tensor an output of a kernel holding the producer but
    not the reader: only readers of the producer's own program do. An alternative reading an
    original tensor does not, or every original kernel would export its reads for it; the
    program then has that alternative supplied by a kernel that outputs the tensor anyway."""
    return site_of.get(reader) is None or site_of.get(reader) == site_of.get(producer)


def mixes_a_site(nodes: frozenset[int], sites: Iterable[AlternativeSite]) -> bool:
    """Whether `nodes` hold both a replaced node of some site and a node of its alternative:
    such a kernel would compute one tensor class twice, so it is never a candidate."""
    return any(nodes & site.nodes and nodes.intersection(site.replaced) for site in sites)


def without_alternatives(graph) -> tvm.IRModule:
    """The legalized module with the alternatives' bindings dropped: what TVM's FuseOps sees
    of the model itself (the stock plan never computes an alternative)."""
    if not graph.alternatives:
        return graph.legalized
    dropped = {p for i in alternative_nodes(graph.alternatives) for p in graph.nodes[i].bindings}
    func = graph.legalized[graph.func_name]
    kept = [b for p, b in enumerate(func.body.blocks[0].bindings) if p not in dropped]
    body = relax.SeqExpr([relax.DataflowBlock(kept)], func.body.body)
    builder = relax.BlockBuilder(graph.legalized)
    builder.update_func(graph.legalized.get_global_var(graph.func_name), relax.Function(
        func.params, body, func.ret_ty, func.is_pure, func.attrs))
    return relax.transform.Normalize()(builder.get())


def sites_as_nodes(graph, offered_sites) -> tuple[AlternativeSite, ...]:
    """Offered sites (vars of the module) as node ids of `graph`."""
    func = graph.legalized[graph.func_name]
    position_of = {b.var: p for p, b in enumerate(func.body.blocks[0].bindings)}
    node_at = {p: n.index for n in graph.nodes for p in n.bindings}

    def node_of(var):
        node = node_at.get(position_of.get(var))
        assert node is not None, f"{var.name} is no primitive of the legalized module"
        return node

    return tuple(AlternativeSite(site.rule, frozenset(node_of(v) for v in site.bound),
                                 tuple(node_of(v) for v in site.replaces),
                                 tuple(node_of(v) for v in site.offers))
                 for site in offered_sites)
