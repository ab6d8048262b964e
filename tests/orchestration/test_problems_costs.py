"""What a failed kernel costs in the orchestration problem and its report (pure graph, no TVM)."""

import dataclasses
import math

import pytest

from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.costing.kernel_costs import KernelCost
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups, plan_report
from korch_tvm.orchestration.solver import solve_orchestration

MEASURED = 1e-3  # seconds per primitive of every measured kernel


def _chain_with_failed_last_node(failed_cost: KernelCost):
    """0 -> 1 -> 2; every kernel holding node 2 failed; those are stock groups when alone."""
    graph = PrimitiveGraph.from_edges(3, [(0, 1), (1, 2)], outputs=[2])
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=2))
    keys = [f"k{i}" for i in range(len(candidates))]
    costs = {key: KernelCost(MEASURED * len(c.nodes), "measured", 1)
             for key, c in zip(keys, candidates)}
    for i, candidate in enumerate(candidates):
        if 2 in candidate.nodes:
            costs[keys[i]] = failed_cost
        if len(candidate.nodes) == 1:
            candidates[i] = dataclasses.replace(candidate, is_stock=True)
    return graph, candidates, keys, costs


def _solved(graph, candidates, keys, costs):
    kept = list(range(len(candidates)))
    problems = orchestration_problems(graph, [frozenset(range(3))], candidates, kept, keys, costs)
    plans = [solve_orchestration(p.problem) for p in problems]
    chosen = plan_groups(problems, plans)
    return plan_report(graph, candidates, kept, problems, plans, chosen, keys, costs), chosen


def test_a_failed_stock_group_enters_the_objective_at_its_prediction():
    failed = KernelCost(4e-6, "failed", 1, "run failed: Subprocess terminated")
    graph, candidates, keys, costs = _chain_with_failed_last_node(failed)
    report, chosen = _solved(graph, candidates, keys, costs)
    # the fused {1, 2} failed too, so node 2 runs alone (stock) at its prediction
    assert [sorted(candidates[i].nodes) for i in chosen] in ([[0], [1], [2]], [[0, 1], [2]])
    assert report["modelled_ms"] == pytest.approx((2 * MEASURED + 4e-6) * 1e3)
    entry = report["kernels"][-1]
    assert entry["primitives"] == [2]
    assert entry["cost_source"] == "failed" and entry["costed_as"] == "prediction"
    assert entry["ms"] == pytest.approx(4e-3) and entry["isolated_ms"] == pytest.approx(4e-3)
    assert entry["error"] == "run failed: Subprocess terminated"
    assert report["failed_kernels"] == 1


def test_a_failed_fused_kernel_is_never_chosen_even_when_predicted_cheap():
    graph, candidates, keys, costs = _chain_with_failed_last_node(
        KernelCost(1e-4, "measured", 1))
    fused = next(i for i, c in enumerate(candidates) if c.nodes == frozenset({1, 2}))
    costs[keys[fused]] = KernelCost(1e-9, "failed", 1, "build failed: x")  # it may not build
    report, chosen = _solved(graph, candidates, keys, costs)
    assert fused not in chosen
    assert report["failed_kernels"] == 0
    assert report["modelled_ms"] == pytest.approx((2 * MEASURED + 1e-4) * 1e3)


def test_a_stock_group_without_any_finite_cost_gets_its_neighbours_scale_not_a_placeholder():
    failed = KernelCost(math.inf, "measured", 0, "run failed: Subprocess terminated")
    graph, candidates, keys, costs = _chain_with_failed_last_node(failed)
    report, _ = _solved(graph, candidates, keys, costs)
    # the finite kernels ({0}, {1}, {0, 1}) cost MEASURED per primitive: node 2 alone the same
    assert report["modelled_ms"] == pytest.approx(3 * MEASURED * 1e3)
    assert report["kernels"][-1]["costed_as"] == "stand-in"
    assert report["kernels"][-1]["ms"] == pytest.approx(MEASURED * 1e3)


def test_a_failed_kernel_reports_its_prediction_without_the_call_in_its_price():
    """Every price carries the VM's time per call (costing/call_overhead.py); the report's
    kernel entry gives the kernel's own time, as for measured kernels, and the plan's modelled
    latency counts one call per kernel."""
    call = 0.5e-6
    failed = KernelCost(4e-6, "failed", 1, "run failed: Subprocess terminated")
    graph, candidates, keys, costs = _chain_with_failed_last_node(failed)
    kept = list(range(len(candidates)))
    problems = orchestration_problems(graph, [frozenset(range(3))], candidates, kept, keys, costs,
                                      call)
    plans = [solve_orchestration(p.problem) for p in problems]
    chosen = plan_groups(problems, plans)
    report = plan_report(graph, candidates, kept, problems, plans, chosen, keys, costs,
                         call_seconds=call)
    entry = report["kernels"][-1]
    assert entry["cost_source"] == "failed" and entry["ms"] == pytest.approx(4e-3)
    assert report["modelled_ms"] == pytest.approx(
        (2 * MEASURED + 4e-6 + len(chosen) * call) * 1e3)
