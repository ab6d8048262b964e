"""From candidates and costs to solved plans, on a pure graph (no TVM build)."""

import dataclasses
import math

from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.costing.measure import KernelCost
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups
from korch_tvm.orchestration.solver import solve_orchestration


def _chain():
    graph = PrimitiveGraph.from_edges(3, [(0, 1), (1, 2)], outputs=[2])
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=2))
    return graph, candidates


def test_unmeasurable_stock_group_keeps_the_plan_feasible():
    graph, candidates = _chain()
    keys = [f"k{i}" for i in range(len(candidates))]
    # node 2 alone is the only candidate that computes it without its producer ... and it failed
    costs = {key: KernelCost(1e-3, "measured", 0) for key in keys}
    only_two = [i for i, c in enumerate(candidates) if 2 in c.nodes]
    for i in only_two:
        costs[keys[i]] = KernelCost(math.inf, "failed", 1, "timed out")
        candidates[i] = dataclasses.replace(candidates[i], is_stock=True)
    pieces = [frozenset(range(3))]
    problems = orchestration_problems(graph, pieces, candidates, range(len(candidates)), keys,
                                      costs)
    plans = [solve_orchestration(p.problem) for p in problems]
    chosen = plan_groups(problems, plans)
    assert plans[0].status == "optimal"
    assert 2 in {node for i in chosen for node in candidates[i].nodes}
    assert math.isfinite(plans[0].objective)


def test_measured_costs_pick_the_cheaper_fusion():
    graph, candidates = _chain()
    keys = [f"k{i}" for i in range(len(candidates))]
    costs = {key: KernelCost(1.0 * len(c.nodes), "measured", 0)
             for key, c in zip(keys, candidates)}
    fused = next(i for i, c in enumerate(candidates) if c.nodes == frozenset({1, 2}))
    costs[keys[fused]] = KernelCost(0.5, "measured", 0)
    problems = orchestration_problems(graph, [frozenset(range(3))], candidates,
                                      range(len(candidates)), keys, costs)
    plans = [solve_orchestration(p.problem) for p in problems]
    assert [candidates[i].nodes for i in plan_groups(problems, plans)] == \
        [frozenset({0}), frozenset({1, 2})]
    assert plans[0].objective == 1.5
