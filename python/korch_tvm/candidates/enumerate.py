"""Candidate kernels: every connected, convex set of primitives that obeys the kernel rules.

Enumeration is ESU (Wernicke 2006): each connected set is grown from its smallest node, adding
only neighbours larger than that root and never a node a sibling branch already took, so every
connected set of at most ``max_kernel_size`` nodes is generated exactly once; the work is
polynomial for a fixed size bound (about n * d^(k-1) for degree d), never exponential in n.

Convexity is not inherited along the way ({a, c} of a->b->c is connected but not convex, while
{a, b, c} is), so non-convex sets are grown further but not emitted. A branch is cut as soon as
the set's *convex hull* (the set plus every node on a path between two of its nodes, two bitset
ANDs) breaks a monotone rule: more than ``max_kernel_size`` nodes, more than ``max_linear``
linear primitives, a linear primitive together with a reduction or with one of its producers,
or an opaque or out-of-subset node. Every convex superset contains the hull,
so no valid candidate is lost. ``max_outputs`` and the ``accept`` hook are not monotone and only
filter what is emitted. TVM's stock FuseOps groups are always added (marked ``is_stock``), even
where they break the rules, so the stock plan is always feasible.

With alternatives offered (graph/alternatives.py), a set holding both a replaced node and a node
of its alternative would compute one tensor twice and is not a candidate; an offered node is
always an output of its candidates (the readers of the tensor it stands for are elsewhere).

Default ``max_kernel_size`` (8): the candidates per primitive grow quickly past it, and every
candidate is a kernel to cost, so the count, not the enumeration, is what matters; the largest
stock groups are added whole regardless of the cap.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

from ..graph.alternatives import class_map, counts_as_reader, mixes_a_site, site_of_node
from ..graph.primitive_graph import PrimitiveGraph


@dataclass(frozen=True)
class Candidate:
    """A candidate kernel: its primitives and the tensors crossing its boundary."""

    nodes: frozenset[int]
    inputs: frozenset[int]  # producer node ids outside the candidate that it reads
    graph_inputs: frozenset[str]  # model inputs read directly
    outputs: frozenset[int]  # member nodes read outside the candidate, or model outputs
    is_stock: bool = False  # one of TVM's FuseOps groups


@dataclass(frozen=True)
class KernelRules:
    """What a kernel may contain. `accept` is the target hook: extra (non-monotone) rules."""

    max_kernel_size: int = 8
    max_linear: int = 1
    # A matmul/conv kernel that also reduces (a norm's mean, a softmax's max) defeats
    # MetaSchedule's CPU tiling rules (it tunes far slower than the two kernels apart); TVM's
    # FuseOps never forms such a group either.
    linear_with_reduce: bool = False
    # Producers fused *into* a matmul/conv are inlined into its reduction loop and recomputed
    # once per output column, which costs many times the matmul alone. So by default a linear
    # primitive only takes an epilogue (the kernel holds no ancestor of it), as in TVM's FuseOps.
    linear_prologue: bool = False
    opaque_alone: bool = True
    max_outputs: int | None = None
    accept: Callable[[Candidate, PrimitiveGraph], bool] | None = None


def enumerate_candidates(graph: PrimitiveGraph, rules: KernelRules = KernelRules(),
                         node_subset: Iterable[int] | None = None) -> list[Candidate]:
    """All rule-obeying connected convex node sets (within `node_subset`), plus stock groups."""
    n = len(graph)
    allowed = graph.mask(node_subset) if node_subset is not None else (1 << n) - 1
    opaque = graph.mask(i for i, node in enumerate(graph.nodes)
                        if not node.fusible or (rules.opaque_alone and node.kind == "opaque"))
    linear = graph.mask(i for i, node in enumerate(graph.nodes) if node.kind == "linear")
    reduce = 0 if rules.linear_with_reduce else graph.mask(
        i for i, node in enumerate(graph.nodes) if node.kind == "reduce")
    prologue_of = {} if rules.linear_prologue else {
        i: graph.ancestors[i] for i in range(n) if linear >> i & 1}
    growable = allowed & ~opaque
    found: set[int] = set()
    with _recursion_depth(rules.max_kernel_size + 100):  # _grow recurses once per member
        _grow_from_every_root(graph, rules, found, n, allowed, growable, opaque, linear, reduce,
                              prologue_of)
    offered = graph.mask(class_map(graph.alternatives))
    site_of = site_of_node(graph.alternatives)
    candidates = {mask: _candidate(graph, mask, False, offered, site_of) for mask in found}
    for group in graph.stock_fusion_groups():
        mask = graph.mask(group)
        if mask & allowed == mask:
            candidates[mask] = _candidate(graph, mask, True, offered, site_of)
    return [c for mask, c in sorted(candidates.items(), key=lambda kv: _order(kv[0]))
            if c.is_stock or (_obeys_filters(graph, rules, c)
                              and not mixes_a_site(c.nodes, graph.alternatives))]


@contextmanager
def _recursion_depth(depth: int):
    """Python's recursion limit raised to at least `depth` while enumerating, then restored:
    a library call must not change the process's limit for good."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, depth))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _grow_from_every_root(graph, rules, found, n, allowed, growable, opaque, linear, reduce,
                          prologue_of) -> None:
    """ESU from each allowed root: every connected set whose lowest node is that root."""
    for root in range(n):
        bit = 1 << root
        if not allowed & bit:
            continue
        if opaque & bit or rules.max_kernel_size < 1:
            found.add(bit)
            continue
        if (linear & bit) and rules.max_linear < 1:
            continue
        above_root = growable & ~((bit << 1) - 1)
        _grow(graph, rules, found, above_root, opaque | ~allowed, linear, reduce, prologue_of,
              bit, 1,
              graph.neighbours[root] & above_root, graph.neighbours[root] | bit,
              graph.descendants[root], graph.ancestors[root])


def _grow(graph, rules, found, above_root, watched, linear, reduce, prologue_of, members, size,
          extension, closed_neighbourhood, reach_down, reach_up) -> None:
    """One ESU step: emit `members` if convex, then extend by each node of `extension`."""
    if reach_down & reach_up & ~members == 0:
        found.add(members)
    if size == rules.max_kernel_size:
        return
    while extension:
        low = extension & -extension
        extension ^= low
        node = low.bit_length() - 1
        grown = members | low
        down = reach_down | graph.descendants[node]
        up = reach_up | graph.ancestors[node]
        hull = grown | (down & up)
        if hull.bit_count() > rules.max_kernel_size:
            continue
        if (hull & ~grown & watched) or (hull & linear).bit_count() > rules.max_linear:
            continue  # the hull needs an opaque/outside node, or too many linear primitives
        if hull & linear and (hull & reduce or _has_prologue(hull & linear, hull, prologue_of)):
            continue  # a linear primitive with a reduction or a prologue (see KernelRules)
        exclusive = graph.neighbours[node] & above_root & ~closed_neighbourhood
        _grow(graph, rules, found, above_root, watched, linear, reduce, prologue_of, grown,
              size + 1,
              extension | exclusive, closed_neighbourhood | graph.neighbours[node], down, up)


def _has_prologue(linear_members: int, hull: int, prologue_of: dict[int, int]) -> bool:
    """Whether the set holds an ancestor of one of its linear primitives (monotone in the set)."""
    while linear_members:
        low = linear_members & -linear_members
        linear_members ^= low
        if hull & prologue_of.get(low.bit_length() - 1, 0):
            return True
    return False


def _candidate(graph: PrimitiveGraph, mask: int, is_stock: bool, offered: int = 0,
               site_of: dict | None = None) -> Candidate:
    """`offered`: the nodes an alternative offers in place of an original (graph/alternatives.py);
    nothing reads them in the graph, yet each is an output, read by the original's readers.
    `site_of`: which alternative each node belongs to; only readers of a node's own program
    make it an output (`counts_as_reader`)."""
    site_of = site_of or {}
    nodes = [i for i in range(mask.bit_length()) if mask >> i & 1]
    inputs, outputs, names = set(), set(), set()
    for i in nodes:
        node = graph.nodes[i]
        inputs.update(p for p in node.inputs if not mask >> p & 1)
        names.update(node.graph_inputs)
        if (graph.output_mask | offered) >> i & 1 \
                or any(not mask >> c & 1 and counts_as_reader(i, c, site_of)
                       for c in node.consumers):
            outputs.add(i)
    return Candidate(frozenset(nodes), frozenset(inputs), frozenset(names), frozenset(outputs),
                     is_stock)


def _obeys_filters(graph: PrimitiveGraph, rules: KernelRules, candidate: Candidate) -> bool:
    if rules.max_outputs is not None and len(candidate.outputs) > rules.max_outputs:
        return False
    return rules.accept is None or bool(rules.accept(candidate, graph))


def _order(mask: int) -> tuple[int, int, int]:
    return ((mask & -mask).bit_length(), mask.bit_count(), mask)
