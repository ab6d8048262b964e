"""Alternatives in the orchestration program: tensors as classes, chosen only where cheaper.

Hand-made graphs (no TVM module) with one alternative site, a cost table per node set, and the
real enumerator, problem builder and solver."""

import dataclasses
import json
import pathlib

import pytest

from korch_tvm.candidates.enumerate import enumerate_candidates
from korch_tvm.candidates.partition import partition_graph
from korch_tvm.costing.measure import KernelCost
from korch_tvm.graph.alternatives import AlternativeSite
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.orchestration.formulation import orchestration_rows, required_nodes
from korch_tvm.orchestration.plans import KernelChoice, OrchestrationProblem, execution_order
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups, plan_report
from korch_tvm.orchestration.solver import solve_orchestration

# 0 -> 1 -> 2 -> 3 (the model's output); the alternative 4 -> 5 reads 0 and offers 5 for 2.
EDGES = [(0, 1), (1, 2), (2, 3), (0, 4), (4, 5)]
SITE = AlternativeSite("test_rule", frozenset({4, 5}), (2,), (5,))


def _graph(with_site: bool) -> PrimitiveGraph:
    graph = PrimitiveGraph.from_edges(6, EDGES, outputs=[3])
    return dataclasses.replace(graph, alternatives=(SITE,)) if with_site else graph


def _solved(graph, node_cost, kept=None):
    """The plan for per-node costs plus a launch cost per kernel; (groups, problems, plans)."""
    pieces = partition_graph(graph, 100)
    candidates = [c for piece in pieces for c in enumerate_candidates(graph, node_subset=piece)]
    keys = [f"k{i}" for i in range(len(candidates))]
    costs = {key: KernelCost(1e-3 + sum(node_cost[n] for n in c.nodes), "measured", 1)
             for key, c in zip(keys, candidates)}
    kept = list(range(len(candidates))) if kept is None else kept(candidates)
    problems = orchestration_problems(graph, pieces, candidates, kept, keys, costs)
    plans = [solve_orchestration(p.problem) for p in problems]
    chosen = plan_groups(problems, plans)
    for problem, plan in zip(problems, plans):
        assert execution_order(problem.problem, plan.chosen) is not None
    return [candidates[i].nodes for i in chosen], problems, plans, candidates, chosen


def test_the_alternative_is_chosen_where_it_is_cheaper_and_only_there():
    cheap = {0: 1e-3, 1: 1e-3, 2: 9e-3, 3: 1e-3, 4: 1e-3, 5: 1e-3}
    groups, problems, plans, candidates, chosen = _solved(_graph(True), cheap)
    computed = set().union(*groups)
    assert {4, 5} <= computed and not {1, 2} & computed
    # {0, 4, 5} then {3}: 1 + 3 and 1 + 1 ms; the original's best is {0, 1, 2, 3}, 1 + 12 ms
    assert plans[0].objective == pytest.approx(6e-3)
    report = plan_report(_graph(True), candidates, range(len(candidates)), problems, plans,
                         chosen, [f"k{i}" for i in range(len(candidates))],
                         {f"k{i}": KernelCost(1.0, "measured", 1) for i in range(len(candidates))})
    site = report["substitutions"]["sites"][0]
    assert site["chosen"] and site["replaces"] == ["n2"]
    assert site["saved_ms"] == pytest.approx(13.0 - 6.0)  # the best plan without it: 13 ms

    dear = {**cheap, 2: 1e-3, 5: 9e-3}
    groups, *_ = _solved(_graph(True), dear)
    computed = set().union(*groups)
    assert {1, 2} <= computed and not {4, 5} & computed


def test_no_kernel_holds_a_replaced_node_and_its_alternative():
    graph = _graph(True)
    candidates = enumerate_candidates(graph)
    assert candidates and not any(c.nodes & {4, 5} and 2 in c.nodes for c in candidates)
    assert any(c.nodes == frozenset({0, 4, 5}) for c in candidates)  # a read fuses in
    # an offered node is an output although nothing reads it in the graph; an original kernel
    # does not export a tensor for the alternative that reads it
    assert all(5 in c.outputs for c in candidates if 5 in c.nodes)
    assert next(c for c in candidates if c.nodes == frozenset({0, 1})).outputs == {1}


def test_an_offered_tensor_supplies_the_original_readers_as_its_class():
    graph = _graph(True)
    problem = _solved(graph, dict.fromkeys(range(6), 1e-3))[1][0].problem
    kernel = next(k for k in problem.kernels if k.nodes == frozenset({0, 4, 2}))  # 5 as class 2
    assert kernel.outputs == {0, 2}  # 0 for the original 1, 5 (as class 2) for 3
    assert next(k for k in problem.kernels if k.nodes == {3}).inputs == {2}
    assert problem.stock_plan  # the stock plan covers the original nodes only


def test_without_alternatives_the_program_is_todays():
    costs = {0: 1e-3, 1: 2e-3, 2: 3e-3, 3: 1e-3, 4: 1e-3, 5: 9e-3}
    plain = PrimitiveGraph.from_edges(4, EDGES[:3], outputs=[3])
    groups, problems, plans, *_ = _solved(plain, costs)
    # the same model with the alternative in the graph but none of its candidates kept
    offered_groups, offered_problems, offered_plans, *_ = _solved(
        _graph(True), costs,
        kept=lambda cands: [i for i, c in enumerate(cands) if not c.nodes & SITE.nodes])
    assert offered_groups == groups
    ours, theirs = problems[0].problem, offered_problems[0].problem
    assert ours.kernels == theirs.kernels and ours.graph_outputs == theirs.graph_outputs
    usable = list(range(len(ours.kernels)))
    rows, offered_rows = orchestration_rows(ours, usable), orchestration_rows(theirs, usable)
    for field in ("lower", "starts", "indices", "values"):
        assert getattr(rows, field).tolist() == getattr(offered_rows, field).tolist()
    assert offered_plans[0].chosen == plans[0].chosen
    assert offered_plans[0].objective == plans[0].objective


def test_an_alternative_straddling_a_cut_is_left_out():
    graph = dataclasses.replace(PrimitiveGraph.from_edges(6, EDGES, outputs=[3]),
                                alternatives=(AlternativeSite("t", frozenset({4, 5}), (1, 3),
                                                              (4, 5)),))
    pieces = partition_graph(graph, 2)  # 0,1 | 2,3: the replaced 1 and 3 in two pieces
    assert len(pieces) == 2 and not any(p & {4, 5} for p in pieces)
    assert partition_graph(graph, 100) == [frozenset(range(6))]


@pytest.mark.parametrize("alternative_cheaper", [True, False])
def test_offered_kernels_are_marked_and_never_make_a_piece_dearer(alternative_cheaper, monkeypatch):
    """The program with alternatives is solved within a node limit, and where that proves
    nothing, searched again from the exact plan without them; so whatever the limit, a piece
    never costs more with substitutions on than with them off."""
    from korch_tvm.orchestration import solver

    costs = ({0: 1e-3, 1: 1e-3, 2: 9e-3, 3: 1e-3, 4: 1e-3, 5: 1e-3} if alternative_cheaper
             else {0: 1e-3, 1: 1e-3, 2: 1e-3, 3: 1e-3, 4: 1e-3, 5: 9e-3})
    for node_limit in (solver.ALTERNATIVES_NODE_LIMIT, 0):
        monkeypatch.setattr(solver, "ALTERNATIVES_NODE_LIMIT", node_limit)
        _, problems, plans, candidates, _ = _solved(_graph(True), costs)
        subproblem, plan = problems[0], plans[0]
        offered = subproblem.problem.offered
        assert offered == {local for local, i in enumerate(subproblem.candidate_ids)
                           if candidates[i].nodes & {4, 5}} and offered
        plain = solve_orchestration(solver._without_offered(subproblem.problem))
        # without it {0, 1, 2, 3} at 1 + 12 ms or 1 + 4 ms; with it {0, 4, 5} and {3}, 6 ms
        assert plain.status == "optimal"
        assert plain.objective == pytest.approx(13e-3 if alternative_cheaper else 5e-3)
        assert plan.objective == pytest.approx(6e-3 if alternative_cheaper else 5e-3)


def test_what_both_ways_read_is_required():
    """Class 2 is computed by the original 1 -> 2 or by the alternative 4 -> 5, and both read 0:
    every plan computes 0, though no single kernel holding 2 touches it (the closure under the
    direct dependencies alone stopped at 2 and left the relaxation weak)."""
    costs = dict.fromkeys(range(6), 1e-3)
    problem = _solved(_graph(True), costs)[1][0].problem
    _, required = required_nodes(problem, range(len(problem.kernels)))
    assert {0, 2, 3} <= required and not {1, 4} & required  # 1 and 4: one way each
    plain = PrimitiveGraph.from_edges(4, EDGES[:3], outputs=[3])
    plain_problem = _solved(plain, costs)[1][0].problem
    assert required_nodes(plain_problem, range(len(plain_problem.kernels)))[1] == {0, 1, 2, 3}


def _segformer_piece() -> OrchestrationProblem:
    """A real piece (SegFormer-b0 at 256x256, substitutions on): 239 kernels over 55 classes,
    54 of them holding an offered alternative's primitive; costs as measured."""
    data = json.loads((pathlib.Path(__file__).parent / "segformer_piece.json").read_text())
    kernels = tuple(KernelChoice(frozenset(nodes), frozenset(inputs), frozenset(outputs),
                                 micros * 1e-6) for nodes, inputs, outputs, micros in
                    data["kernels"])
    return OrchestrationProblem(data["num_nodes"], kernels, frozenset(data["graph_outputs"]),
                                tuple(data["stock_plan"]), frozenset(data["offered"]))


def test_a_real_piece_with_alternatives_is_solved_without_the_plain_detour(monkeypatch):
    from korch_tvm.orchestration import solver

    problem = _segformer_piece()
    plain = solve_orchestration(solver._without_offered(problem))
    # its LP bound was 8 % of the optimum; 86 % now, and HiGHS's root cuts close the rest
    assert solver._lp_bound(problem, frozenset({"dependency"})) >= 0.8 * plain.objective

    def no_detour(_):
        raise AssertionError("the program with alternatives was not solved directly")

    monkeypatch.setattr(solver, "_without_offered", no_detour)
    plan = solve_orchestration(problem)
    assert plan.status == "optimal" and execution_order(problem, plan.chosen) is not None
    assert plan.objective < plain.objective  # it takes an alternative, and that pays
    assert set(plan.chosen) & problem.offered


def test_a_limited_first_solve_falls_back_to_the_plain_plan_as_the_bar(monkeypatch):
    """Where the node-limited solve proves nothing (here: made to), the plan without
    alternatives is solved exactly and the program searched again from it."""
    from korch_tvm.orchestration import solver

    real = solver._solve_program
    calls = []

    def first_proves_nothing(problem, *args, **kwargs):
        calls.append(bool(problem.offered))
        if len(calls) == 1:
            return solver._Outcome("node_limit", (), float("inf"), float("-inf"))
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(solver, "_solve_program", first_proves_nothing)
    costs = {0: 1e-3, 1: 1e-3, 2: 9e-3, 3: 1e-3, 4: 1e-3, 5: 1e-3}
    _, problems, plans, *_ = _solved(_graph(True), costs)
    assert calls == [True, False, True]  # limited, the plain program, the search from it
    assert plans[0].objective == pytest.approx(6e-3) and plans[0].status == "optimal"
