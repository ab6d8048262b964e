"""Alternatives in the primitive graph: which nodes compute the same tensors another way.

A site is one offered alternative (substitutions/offer.py) read back as node ids: its own nodes
(`nodes`), the original nodes whose tensors it recomputes (`replaced`) and, for each, the node of
the alternative equal to it (`offers`). A tensor's *class* is its original node; an offered
node stands for the class of the node it replaces. With no sites every node is its own class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


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
