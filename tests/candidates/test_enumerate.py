"""Candidate enumeration against brute force, stock groups, and partitioning into pieces."""

import itertools
import random

import pytest

from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.candidates.partition import partition_graph
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from test_primitive_graph import transformer_module


def random_dag(num_nodes: int, edge_probability: float, seed: int) -> PrimitiveGraph:
    rng = random.Random(seed)
    edges = [(i, j) for j in range(num_nodes) for i in range(j) if rng.random() < edge_probability]
    kinds = [rng.choice(["elementwise"] * 4 + ["reduce", "linear", "layout", "opaque"])
             for _ in range(num_nodes)]
    return PrimitiveGraph.from_edges(num_nodes, edges, kinds)


def undirected_connected(graph, nodes) -> bool:
    nodes = set(nodes)
    start = next(iter(nodes))
    seen, stack = {start}, [start]
    while stack:
        node = graph.nodes[stack.pop()]
        for other in (set(node.inputs) | set(node.consumers)) & nodes:
            if other not in seen:
                seen.add(other)
                stack.append(other)
    return seen == nodes


def convex_by_paths(graph, nodes) -> bool:
    """No path leaves the set and comes back (plain DFS from the set's outside consumers)."""
    nodes = set(nodes)
    stack = [c for i in nodes for c in graph.nodes[i].consumers if c not in nodes]
    seen = set()
    while stack:
        j = stack.pop()
        if j in nodes:
            return False
        if j not in seen:
            seen.add(j)
            stack += graph.nodes[j].consumers
    return True


def obeys(graph, nodes, rules) -> bool:
    kinds = [graph.nodes[i].kind for i in nodes]
    return (len(nodes) <= rules.max_kernel_size and kinds.count("linear") <= rules.max_linear
            and ("opaque" not in kinds or len(nodes) == 1)
            and (rules.linear_with_reduce or not ("linear" in kinds and "reduce" in kinds))
            and (rules.linear_prologue or not any(
                graph.nodes[i].kind == "linear" and graph.ancestors[i] & graph.mask(nodes)
                for i in nodes)))


def brute_force(graph, rules, subset=None):
    universe = sorted(subset) if subset is not None else range(len(graph))
    return {frozenset(s) for k in range(1, rules.max_kernel_size + 1)
            for s in itertools.combinations(universe, k)
            if obeys(graph, s, rules) and undirected_connected(graph, s)
            and convex_by_paths(graph, s)}


@pytest.mark.parametrize("seed", range(12))
def test_enumeration_is_exactly_the_brute_force_set(seed):
    graph = random_dag(10, 0.3 if seed % 2 else 0.18, seed)
    rules = KernelRules(max_kernel_size=4 + seed % 3)
    candidates = enumerate_candidates(graph, rules)
    found = [c.nodes for c in candidates]
    assert len(found) == len(set(found)), "each candidate once"
    stock = set(graph.stock_fusion_groups())
    assert set(found) == brute_force(graph, rules) | stock
    for candidate in candidates:
        assert undirected_connected(graph, candidate.nodes)
        assert convex_by_paths(graph, candidate.nodes)
        members = candidate.nodes
        assert candidate.inputs == {p for i in members for p in graph.nodes[i].inputs} - members
        assert candidate.outputs == {i for i in members if i in graph.outputs
                                     or set(graph.nodes[i].consumers) - members}


def test_node_subset_and_max_outputs():
    graph = random_dag(12, 0.25, 99)
    subset = frozenset(range(3, 9))
    rules = KernelRules(max_kernel_size=5)
    inside = {c.nodes for c in enumerate_candidates(graph, rules, node_subset=subset)}
    assert inside == brute_force(graph, rules, subset)
    narrow = enumerate_candidates(graph, KernelRules(max_kernel_size=5, max_outputs=1))
    assert all(len(c.outputs) <= 1 for c in narrow if not c.is_stock)


@pytest.fixture(scope="module")
def two_layer_graph():
    return PrimitiveGraph.from_module(transformer_module(layers=2))


def test_stock_groups_are_candidates_even_when_large(two_layer_graph):
    graph = two_layer_graph
    rules = KernelRules(max_kernel_size=2)
    candidates = enumerate_candidates(graph, rules)
    stock = set(graph.stock_fusion_groups())
    assert any(len(g) > 2 for g in stock)
    marked = {c.nodes for c in candidates if c.is_stock}
    assert marked == stock
    assert all(len(c.nodes) <= 2 for c in candidates if not c.is_stock)
    for candidate in candidates:
        assert graph.is_convex(graph.mask(candidate.nodes))


def check_pieces(graph, pieces, max_nodes):
    assert sorted(i for p in pieces for i in p) == list(range(len(graph)))
    position = {i: k for k, piece in enumerate(pieces) for i in piece}
    for piece in pieces:
        assert convex_by_paths(graph, piece)
    for node in graph.nodes:
        assert all(position[p] <= position[node.index] for p in node.inputs), "pieces in order"
    stock = graph.stock_fusion_groups()
    for group in stock:
        assert len({position[i] for i in group}) == 1, "a stock group is never split"
    for piece in pieces:
        assert len(piece) <= max_nodes or any(piece == g for g in stock)


def test_partition_pieces_are_convex_disjoint_ordered_and_covering(two_layer_graph):
    graph = two_layer_graph
    for max_nodes in (1, 7, 20, len(graph)):
        pieces = partition_graph(graph, max_nodes)
        check_pieces(graph, pieces, max_nodes)
    assert len(partition_graph(graph, len(graph))) == 1
    for seed in range(5):
        dag = random_dag(30, 0.1, seed)
        check_pieces(dag, partition_graph(dag, 8), 8)


def test_partition_cuts_at_the_narrow_point():
    # a chain with skip connections everywhere except over 5 -> 6: cuts elsewhere cross 2 tensors
    skips = [(0, 2), (1, 3), (2, 4), (3, 5), (5, 7), (6, 8), (7, 9)]
    edges = [(i, i + 1) for i in range(9)] + skips
    graph = PrimitiveGraph.from_edges(10, edges)
    assert partition_graph(graph, 6) == [frozenset(range(6)), frozenset(range(6, 10))]


def test_a_large_kernel_size_leaves_the_recursion_limit_as_it_was(monkeypatch):
    """Enumeration recurses once per member; it may raise Python's limit while it runs, but a
    library call must leave the process's limit as it found it."""
    import sys

    graph = random_dag(10, 0.3, 7)
    before = sys.getrecursionlimit()
    raised = []
    real_set = sys.setrecursionlimit
    monkeypatch.setattr(sys, "setrecursionlimit", lambda n: (raised.append(n), real_set(n)))
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=before + 10))
    assert candidates and raised[0] == before + 110
    assert sys.getrecursionlimit() == before
