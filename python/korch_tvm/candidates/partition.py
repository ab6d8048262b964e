"""Cutting a large primitive graph into convex pieces that are enumerated and solved one by one.

The rule. TVM's stock FuseOps groups are the units: a cut never splits one, so every piece
still contains whole stock groups and the stock plan stays feasible piece by piece. The units
are put in a topological order (Kahn's algorithm, smallest node id first, which keeps the
binding order of the model), and the pieces are contiguous runs of that order. A contiguous run
of a topological order is convex (a path between two of its nodes only visits nodes ordered
between them), so every piece is convex, and the pieces run one after another.

Where to cut: the *width* of a cut is the number of tensors that cross it (nodes before it with
a consumer after it). A dynamic program over the cut positions picks the pieces of at most
``max_nodes`` primitives that minimise the total width of the cuts, so the graph is cut at
narrow points, e.g. the single residual tensor between two transformer blocks. A stock group
bigger than ``max_nodes`` becomes a piece of its own.

What a cut costs: no kernel spans it, so every tensor crossing it is written to memory by one
piece and read by the next, fusions across it (an epilogue of one block into the next) are lost,
and a primitive before the cut cannot be recomputed inside a kernel after it. Narrow cuts keep
this loss small; with no cut (``max_nodes`` >= graph size) the whole graph is one piece.

Alternatives (graph/alternatives.py) are no stock groups: the pieces are cut from the model's
own nodes, and each alternative then joins the piece that holds every node it replaces, so
only that piece's program grows. The piece stays convex: nothing reads an alternative's nodes
outside it, and what it reads comes from that piece or earlier ones. An alternative whose
replaced nodes straddle a cut, or that reads a later piece, is left out (never offered).
"""

from __future__ import annotations


import logging

from ..graph.primitive_graph import PrimitiveGraph
from ..support.toposort import ordered_topologically

logger = logging.getLogger("korch_tvm.candidates")


def partition_graph(graph: PrimitiveGraph, max_nodes: int) -> list[frozenset[int]]:
    """Disjoint convex pieces covering the graph, in execution order, each <= max_nodes nodes
    (or one stock group, if that alone is bigger)."""
    assert max_nodes >= 1, "max_nodes must be positive"
    units = _ordered_units(graph)
    if not units:
        return []
    position = {node: k for k, unit in enumerate(units) for node in unit}
    widths = _cut_widths(graph, units, position)
    sizes = [0]
    for unit in units:
        sizes.append(sizes[-1] + len(unit))
    m = len(units)
    best = [0] + [None] * m  # best[p]: least total width of a partition of units[:p]
    start_of = [0] * (m + 1)
    for end in range(1, m + 1):
        cut_cost = widths[end] if end < m else 0
        for start in range(end - 1, -1, -1):
            if start < end - 1 and sizes[end] - sizes[start] > max_nodes:
                break
            if best[start] is None:
                continue
            cost = best[start] + cut_cost
            if best[end] is None or cost < best[end]:  # ties keep the longer piece
                best[end], start_of[end] = cost, start
    pieces, end = [], m
    while end > 0:
        start = start_of[end]
        pieces.append(frozenset(node for unit in units[start:end] for node in unit))
        end = start
    return _with_alternatives(graph, pieces[::-1])


def _with_alternatives(graph: PrimitiveGraph, pieces: list[frozenset[int]]
                       ) -> list[frozenset[int]]:
    """Each alternative's nodes added to the piece of its replaced nodes (see the module
    docstring); those that fit no single piece are dropped, with a line saying so."""
    if not graph.alternatives:
        return pieces
    piece_of = {node: k for k, piece in enumerate(pieces) for node in piece}
    grown = [set(piece) for piece in pieces]
    for site in graph.alternatives:
        homes = {piece_of.get(node) for node in site.replaced}
        reads = {piece_of.get(p) for node in site.nodes for p in graph.nodes[node].inputs
                 if p not in site.nodes}
        if len(homes) != 1 or None in homes or None in reads or max(reads, default=-1) > min(homes):
            logger.info("substitution %s at %s left out: it does not fit one piece", site.rule,
                        graph.nodes[site.replaced[0]].name)
            continue
        grown[homes.pop()] |= site.nodes
    return [frozenset(piece) for piece in grown]


def _ordered_units(graph: PrimitiveGraph) -> list[frozenset[int]]:
    """Stock groups in a topological order of the graph they form (smallest node first)."""
    units = list(graph.stock_fusion_groups())
    unit_of = {node: k for k, unit in enumerate(units) for node in unit}
    dependencies = [{unit_of[p] for node in unit for p in graph.nodes[node].inputs} - {k}
                    for k, unit in enumerate(units)]
    order = ordered_topologically(dependencies, [min(unit) for unit in units])
    assert order is not None, "stock fusion groups depend on each other in a cycle"
    return [units[k] for k in order]


def _cut_widths(graph: PrimitiveGraph, units, position) -> list[int]:
    """widths[p]: tensors crossing the cut before unit p (difference array over positions)."""
    delta = [0] * (len(units) + 2)
    for node in graph.nodes:
        consumers = [position[c] for c in node.consumers if c in position]
        if not consumers or node.index not in position:
            continue  # no reader, or an alternative's node (not in any unit)
        first, last = position[node.index], max(consumers)
        if last > first:
            delta[first + 1] += 1
            delta[last + 1] -= 1
    widths, running = [], 0
    for value in delta[:len(units) + 1]:
        running += value
        widths.append(running)
    return widths
