"""The orchestration program: known optima, recomputation, cycle cuts, limits, and brute force."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from korch_tvm.orchestration.formulation import cycle_cut_rows, orchestration_rows
from korch_tvm.orchestration.solver import (KernelChoice, OrchestrationProblem, _lp_bound, _solve,
                                            execution_order, no_recompute_plan,
                                            solve_orchestration)


def kernel(nodes, inputs, outputs, cost) -> KernelChoice:
    return KernelChoice(frozenset(nodes), frozenset(inputs), frozenset(outputs), float(cost))


# ---------------------------------------------------------------------------------------------
# Instance generators (shared with the formulation bench below)


def random_dag(num_nodes: int, rng: random.Random, window: int = 6) -> list[list[int]]:
    """Predecessor lists of a random DAG in topological order; the first nodes read graph inputs."""
    predecessors = []
    for node in range(num_nodes):
        if node < 2:
            predecessors.append([])
            continue
        candidates = list(range(max(0, node - window), node))
        predecessors.append(sorted(rng.sample(candidates, min(len(candidates), rng.choice((1, 1, 2))))))
    return predecessors


def fusion_problem(num_nodes: int, seed: int, max_kernel_size: int = 4) -> OrchestrationProblem:
    """Candidates are the connected convex subsets of a random DAG, priced so fusion pays.

    A kernel costs a launch, its primitives' work, and memory traffic for the tensors it reads
    and writes; fusing saves launches and traffic, so overlapping fused kernels (recomputation)
    sometimes win. The stock plan is one kernel per primitive.
    """
    rng = random.Random(seed)
    predecessors = random_dag(num_nodes, rng)
    successors = [[] for _ in range(num_nodes)]
    for node, preds in enumerate(predecessors):
        for pred in preds:
            successors[pred].append(node)
    graph_outputs = frozenset(node for node in range(num_nodes) if not successors[node])
    descendants = [0] * num_nodes
    for node in reversed(range(num_nodes)):
        for succ in successors[node]:
            descendants[node] |= descendants[succ] | (1 << succ)
    work = [rng.uniform(0.2, 2.0) for _ in range(num_nodes)]
    traffic = [rng.uniform(0.5, 3.0) for _ in range(num_nodes)]

    def convex(group: frozenset[int]) -> bool:
        below = 0
        for node in group:
            below |= descendants[node]
        group_mask = sum(1 << node for node in group)
        outside = below & ~group_mask
        return not any(outside >> node & 1 and descendants[node] & group_mask for node in range(num_nodes))

    groups = {frozenset({node}) for node in range(num_nodes)}
    layer = set(groups)
    for _ in range(max_kernel_size - 1):
        grown = set()
        for group in layer:
            for node in group:
                for neighbour in predecessors[node] + successors[node]:
                    if neighbour not in group:
                        grown.add(group | {neighbour})
        layer = {group for group in grown if convex(group)}
        groups |= layer

    kernels = []
    for group in sorted(groups, key=lambda g: (len(g), sorted(g))):
        inputs = {pred for node in group for pred in predecessors[node]} - group
        outputs = {node for node in group if node in graph_outputs or set(successors[node]) - group}
        cost = 1.0 + sum(work[n] for n in group) + sum(traffic[n] for n in inputs | outputs)
        kernels.append(kernel(group, inputs, outputs, cost * rng.uniform(0.9, 1.1)))
    stock = tuple(i for i, k in enumerate(kernels) if len(k.nodes) == 1)
    return OrchestrationProblem(num_nodes, tuple(kernels), graph_outputs, stock)


def abstract_problem(seed: int, num_nodes: int = 6, num_kernels: int = 12) -> OrchestrationProblem:
    """Kernels with arbitrary node, input and output sets: cycles and odd structure included."""
    rng = random.Random(seed)
    kernels = []
    for _ in range(num_kernels):
        nodes = set(rng.sample(range(num_nodes), rng.randint(1, 3)))
        others = [n for n in range(num_nodes) if n not in nodes]
        inputs = set(rng.sample(others, rng.randint(0, min(2, len(others)))))
        outputs = set(rng.sample(sorted(nodes), rng.randint(1, len(nodes))))
        cost = math.inf if rng.random() < 0.1 else rng.uniform(1.0, 5.0)
        kernels.append(kernel(nodes, inputs, outputs, cost))
    graph_outputs = frozenset(rng.sample(range(num_nodes), 2))
    return OrchestrationProblem(num_nodes, tuple(kernels), graph_outputs)


def brute_force_optimum(problem: OrchestrationProblem) -> float:
    """The cheapest subset of kernels with an execution order, by enumeration in cost order."""
    usable = [k for k, c in enumerate(problem.kernels) if math.isfinite(c.cost)]
    subsets = []
    for size in range(len(usable) + 1):
        for subset in itertools.combinations(usable, size):
            subsets.append((math.fsum(problem.kernels[k].cost for k in subset), subset))
    subsets.sort()
    for cost, subset in subsets:
        if execution_order(problem, subset) is not None:
            return cost
    return math.inf


def is_valid_order(problem: OrchestrationProblem, order) -> bool:
    available = set()
    for k in order:
        if not problem.kernels[k].inputs <= available:
            return False
        available |= problem.kernels[k].outputs
    return problem.graph_outputs <= available


# ---------------------------------------------------------------------------------------------
# Hand-made graphs


def test_chain_prefers_the_fused_kernel():
    problem = OrchestrationProblem(
        3,
        (
            kernel({0}, (), {0}, 1.0),
            kernel({1}, {0}, {1}, 1.0),
            kernel({2}, {1}, {2}, 1.0),
            kernel({0, 1, 2}, (), {2}, 2.5),
            kernel({1, 2}, {0}, {2}, 1.2),
        ),
        frozenset({2}),
        stock_plan=(0, 1, 2),
    )
    plan = solve_orchestration(problem)
    assert plan.status == "optimal"
    assert plan.chosen == (0, 4)
    assert plan.objective == pytest.approx(2.2)
    assert plan.stock_objective == pytest.approx(3.0)
    assert plan.gap == pytest.approx(0.0, abs=1e-9)
    assert plan.cycle_cuts == 0


def test_recomputation_wins_on_a_diamond():
    # p feeds a and b (both graph outputs). Materialising p costs a kernel plus traffic;
    # recomputing it inside {p,a} and {p,b} is cheaper. The no-recompute DP cannot do that.
    problem = OrchestrationProblem(
        3,
        (
            kernel({0}, (), {0}, 3.0),  # p alone
            kernel({1}, {0}, {1}, 2.0),  # a reading p
            kernel({2}, {0}, {2}, 2.0),  # b reading p
            kernel({0, 1}, (), {0, 1}, 4.5),  # p+a, exports p
            kernel({0, 2}, (), {0, 2}, 4.6),  # p+b, exports p
            kernel({0, 1}, (), {1}, 3.0),  # p+a, p internal
            kernel({0, 2}, (), {2}, 3.0),  # p+b, p internal
        ),
        frozenset({1, 2}),
        stock_plan=(0, 1, 2),
    )
    plan = solve_orchestration(problem)
    assert plan.status == "optimal"
    assert sorted(plan.chosen) == [5, 6]
    assert plan.objective == pytest.approx(6.0)
    dp_plan = no_recompute_plan(problem)
    assert dp_plan == (3, 2)  # p+a exporting p, then b: 6.5 beats the stock 7.0
    assert plan.objective < sum(problem.kernels[k].cost for k in dp_plan)


def cyclic_trap() -> OrchestrationProblem:
    """Two cheap kernels that feed each other; the cheapest acyclic plan needs a third.

    A computes {0, 1} reading 2 and exports 1; B computes {2, 3} reading 1 and exports 2 and 3
    (3 is the graph output). {A, B} satisfies every BIP row at cost 2 but has no order.
    The acyclic optimum is C ({2} alone, cost 1.5) + A + B = 3.5, against 5.0 for D (all fused).
    """
    return OrchestrationProblem(
        4,
        (
            kernel({0, 1}, {2}, {1}, 1.0),  # A
            kernel({2, 3}, {1}, {2, 3}, 1.0),  # B
            kernel({2}, (), {2}, 1.5),  # C
            kernel({0, 1, 2, 3}, (), {3}, 5.0),  # D
        ),
        frozenset({3}),
    )


def test_cyclic_cheapest_choice_is_cut_off():
    problem = cyclic_trap()
    assert execution_order(problem, (0, 1)) is None  # the trap is indeed cyclic
    plan = solve_orchestration(problem)
    assert plan.status == "optimal"
    assert plan.cycle_cuts >= 1
    assert sorted(plan.chosen) == [0, 1, 2]
    assert plan.chosen == (2, 0, 1)
    assert is_valid_order(problem, plan.chosen)
    assert plan.objective == pytest.approx(3.5)
    # "Not both A and B" would be wrong here: the optimum contains both.
    assert brute_force_optimum(problem) == pytest.approx(3.5)


def test_infinite_cost_kernels_are_never_chosen():
    problem = OrchestrationProblem(
        2,
        (
            kernel({0, 1}, (), {1}, math.inf),
            kernel({0}, (), {0}, 2.0),
            kernel({1}, {0}, {1}, 2.0),
        ),
        frozenset({1}),
        stock_plan=(1, 2),
    )
    plan = solve_orchestration(problem)
    assert plan.status == "optimal"
    assert plan.chosen == (1, 2)
    assert plan.objective == pytest.approx(4.0)


def test_infeasible_problem_reports_so():
    only_unusable = OrchestrationProblem(1, (kernel({0}, (), {0}, math.inf),), frozenset({0}))
    plan = solve_orchestration(only_unusable)
    assert (plan.status, plan.chosen) == ("infeasible", ())
    only_cyclic = OrchestrationProblem(
        2, (kernel({0}, {1}, {0}, 1.0), kernel({1}, {0}, {1}, 1.0)), frozenset({0})
    )
    plan = solve_orchestration(only_cyclic)
    assert (plan.status, plan.chosen) == ("infeasible", ())
    assert plan.cycle_cuts >= 1


def test_no_graph_outputs_needs_no_kernels():
    plan = solve_orchestration(OrchestrationProblem(1, (kernel({0}, (), {0}, 1.0),), frozenset()))
    assert (plan.status, plan.chosen, plan.objective) == ("optimal", (), 0.0)


def test_execution_order_validity():
    problem = cyclic_trap()
    assert execution_order(problem, (1, 0, 2)) == (2, 0, 1)
    assert execution_order(problem, (0, 1)) is None  # cyclic
    assert execution_order(problem, (2,)) is None  # misses the graph output
    assert execution_order(problem, (3,)) == (3,)
    assert execution_order(problem, (7,)) is None  # no such kernel


def test_stock_plan_that_is_not_feasible_is_rejected():
    problem = OrchestrationProblem(4, cyclic_trap().kernels, frozenset({3}), stock_plan=(0, 1))
    with pytest.raises(ValueError, match="stock_plan"):
        solve_orchestration(problem)


# ---------------------------------------------------------------------------------------------
# Random instances


def chain_problem(num_nodes: int, seed: int, max_kernel_size: int = 4) -> OrchestrationProblem:
    """A chain whose candidates are all segments up to a length, each exporting every node.

    A segment's cost (launch + work and traffic of its nodes + the tensor it reads) only grows
    when the segment grows, so a kernel that overlaps an earlier one can be trimmed to a cheaper
    candidate segment: recomputation cannot help on this family.
    """
    rng = random.Random(seed)
    work = [rng.uniform(0.2, 2.0) for _ in range(num_nodes)]
    traffic = [rng.uniform(0.5, 3.0) for _ in range(num_nodes)]
    kernels = []
    for first in range(num_nodes):
        for last in range(first, min(num_nodes, first + max_kernel_size)):
            nodes = set(range(first, last + 1))
            inputs = {first - 1} if first else set()
            cost = 1.0 + sum(work[n] + traffic[n] for n in nodes) + sum(traffic[n] for n in inputs)
            kernels.append(kernel(nodes, inputs, nodes, cost))
    stock = tuple(i for i, k in enumerate(kernels) if len(k.nodes) == 1)
    return OrchestrationProblem(num_nodes, tuple(kernels), frozenset({num_nodes - 1}), stock)


@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_bip_when_recomputation_cannot_help(seed):
    problem = chain_problem(14, seed)
    plan = solve_orchestration(problem)
    dp_plan = no_recompute_plan(problem)
    assert plan.status == "optimal"
    assert is_valid_order(problem, dp_plan)
    assert sum(problem.kernels[k].cost for k in dp_plan) == pytest.approx(plan.objective, rel=1e-9)


def test_no_recompute_plan_gives_up_at_its_deadline_and_its_state_budget():
    # Twelve independent outputs, one equal-cost kernel each: every order ties, so the search
    # visits thousands of states (subsets computed) before it pops the goal.
    kernels = tuple(kernel({i}, (), {i}, 1.0) for i in range(12))
    problem = OrchestrationProblem(12, kernels, frozenset(range(12)))
    assert sorted(no_recompute_plan(problem)) == list(range(12))
    assert no_recompute_plan(problem, deadline=time.perf_counter() - 1.0) is None
    assert no_recompute_plan(problem, max_states=1_000) is None


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_on_small_abstract_instances(seed):
    problem = abstract_problem(seed)
    expected = brute_force_optimum(problem)
    plan = solve_orchestration(problem)
    if math.isinf(expected):
        assert (plan.status, plan.chosen) == ("infeasible", ())
        return
    assert plan.status == "optimal"
    assert is_valid_order(problem, plan.chosen)
    assert all(math.isfinite(problem.kernels[k].cost) for k in plan.chosen)
    assert plan.objective == pytest.approx(expected, rel=1e-6)


def satisfies_supply_and_outputs(problem: OrchestrationProblem, subset) -> bool:
    """The BIP's own rows, which a cyclic choice can meet."""
    produced = set().union(*(problem.kernels[k].outputs for k in subset))
    return problem.graph_outputs <= produced and all(problem.kernels[k].inputs <= produced for k in subset)


@pytest.mark.parametrize("seed", [205, 208, 211, 217, 226, 228])  # each has cyclic and acyclic plans
def test_cuts_and_valid_families_keep_every_acyclic_plan(seed):
    # Every cut made from any cyclic choice, and every row of the strengthened program, must
    # hold at every plan that has an execution order; and each cut must cut its cyclic choice.
    problem = abstract_problem(seed, num_nodes=6, num_kernels=10)
    usable = [k for k, c in enumerate(problem.kernels) if math.isfinite(c.cost)]
    column_of = {k: column for column, k in enumerate(usable)}
    subsets = [set(s) for size in range(len(usable) + 1) for s in itertools.combinations(usable, size)]
    acyclic = [s for s in subsets if execution_order(problem, s) is not None]
    cyclic = [s for s in subsets if satisfies_supply_and_outputs(problem, s) and s not in acyclic]
    assert acyclic and cyclic

    def holds(row, subset) -> bool:
        lower, coefficients = row
        return sum(coefficients.get(column_of[k], 0.0) for k in subset) >= lower - 1e-9

    rows = orchestration_rows(problem, usable, frozenset({"cover", "dependency"}))
    program = []
    for r in range(rows.count):
        span = slice(rows.starts[r], rows.starts[r + 1])
        program.append((rows.lower[r], dict(zip(rows.indices[span].tolist(), rows.values[span].tolist()))))
    assert all(holds(row, plan) for row in program for plan in acyclic)
    for choice in cyclic:
        for first_producer in (True, False):
            cuts = cycle_cut_rows(problem, choice, column_of, first_producer)
            assert cuts and not all(holds(cut, choice) for cut in cuts)
            assert all(holds(cut, plan) for cut in cuts for plan in acyclic)


def test_threads_option_gives_the_same_plan():
    problem = fusion_problem(12, seed=5)
    assert solve_orchestration(problem, threads=1).chosen == solve_orchestration(problem).chosen


@pytest.mark.parametrize("seed", range(3))
def test_matches_brute_force_on_small_fusion_instances(seed):
    problem = fusion_problem(5, seed, max_kernel_size=3)
    assert len(problem.kernels) <= 14
    plan = solve_orchestration(problem)
    assert plan.status == "optimal"
    assert plan.objective == pytest.approx(brute_force_optimum(problem), rel=1e-6)
    assert plan.objective <= plan.stock_objective


def test_never_worse_than_the_stock_plan():
    problem = fusion_problem(30, seed=7)
    plan = solve_orchestration(problem, time_limit=5.0)
    assert plan.status == "optimal"
    assert is_valid_order(problem, plan.chosen)
    assert plan.objective <= plan.stock_objective
    assert plan.best_bound <= plan.objective


def test_time_limited_answer_is_never_called_optimal():
    problem = fusion_problem(60, seed=3)
    plan = solve_orchestration(problem, time_limit=0.05)
    assert plan.status != "optimal" or plan.gap == 0.0
    assert plan.objective <= plan.stock_objective
    assert is_valid_order(problem, plan.chosen)
    assert plan.seconds < 2.0


def test_same_problem_same_plan():
    problem = fusion_problem(20, seed=11)
    first, second = solve_orchestration(problem), solve_orchestration(problem)
    assert (first.chosen, first.objective, first.status) == (second.chosen, second.objective, second.status)


# ---------------------------------------------------------------------------------------------
# Formulation bench (not a test): does each valid family raise the LP bound and speed the MIP?


FAMILIES = {
    "base": frozenset(),
    "+cover": frozenset({"cover"}),
    "+dependency": frozenset({"dependency"}),
    "+both": frozenset({"cover", "dependency"}),
}


def _compare_formulations(time_limit: float = 30.0) -> None:
    """Print LP bound and unseeded MIP effort per formulation on random fusion DAGs.

    The MIP runs without the warm start's cutoff so that only the formulation differs; lp/opt
    compares each LP bound with the optimum that the default solver proves.
    """
    instances = [(size, 4, seed) for size in (30, 45, 60) for seed in range(3)]
    instances += [(40, 6, seed) for seed in range(2)]
    header = ("instance", "kernels", "family", "lp", "lp/opt", "found", "status", "nodes", "sec")
    print("{:>13} {:>7} {:>12} {:>8} {:>6} {:>8} {:>10} {:>6} {:>6}".format(*header))
    for size, max_kernel_size, seed in instances:
        problem = fusion_problem(size, seed, max_kernel_size)
        optimum = solve_orchestration(problem, time_limit).objective
        for name, families in FAMILIES.items():
            lp = _lp_bound(problem, families)
            started = time.perf_counter()
            plan = _solve(problem, time_limit, None, families, seeded=False)
            seconds = time.perf_counter() - started
            print(
                f"{f'n{size}/k{max_kernel_size}/s{seed}':>13} {len(problem.kernels):>7} {name:>12}"
                f" {lp:8.2f} {lp / optimum:6.3f} {plan.objective:8.2f} {plan.status:>10}"
                f" {plan.nodes:>6} {seconds:6.2f}"
            )


if __name__ == "__main__":
    _compare_formulations()
