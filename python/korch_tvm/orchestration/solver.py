"""Kernel orchestration: pick the cheapest set of candidate kernels as a binary integer program.

The program (Korch, section 5) has a binary x_k per candidate kernel and minimises the sum of the
chosen kernels' costs such that every graph output is produced and every input of a chosen kernel
is produced by a chosen kernel. A primitive may be computed by several chosen kernels
(recomputation). The program cannot express "the chosen kernels admit an execution order", so a
cyclic answer is cut off with a valid inequality and the program solved again.

This module runs the program on HiGHS; the records and the execution order are in `plans.py`,
the rows and cycle cuts in `formulation.py`, the warm start in `no_recompute.py`. It knows
nothing about TVM: kernels are sets of primitive ids with a cost.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from .formulation import ConstraintRows, cycle_cut_rows, orchestration_rows
from .no_recompute import no_recompute_plan
from .plans import KernelChoice, OrchestrationProblem, Plan, execution_order, plan_cost

# KernelChoice, OrchestrationProblem, Plan, execution_order and no_recompute_plan are imported
# from here by the problem builder, the memory check and the pipeline.
__all__ = ["KernelChoice", "OrchestrationProblem", "Plan", "execution_order", "no_recompute_plan",
           "solve_orchestration"]

logger = logging.getLogger(__name__)

# The public highspy.Highs subclass installs Python callbacks on construction, and that prints a
# banner on stdout before any option can silence it; the core class it wraps does not.
_HighsSolver = getattr(highspy, "_Highs", highspy.Highs)

# Costs are seconds (1e-6 .. 1e-2). HiGHS's absolute gap tolerance (1e-6) would call a plan
# "optimal" that is several kernels away from it, so costs are scaled to make the largest one 1
# and both gap tolerances are set far below any difference between two real plans.
_RELATIVE_GAP = 1e-7
_ABSOLUTE_GAP = 1e-9
# Branch-and-bound nodes the search for a plan using offered alternatives may take per run
# (`_solve_with_alternatives`); SegFormer's pieces now need one or two.
ALTERNATIVES_NODE_LIMIT = 500

# States the no-recompute DP may visit when it only seeds the program (about 20 ms): on large
# pieces a bigger budget costs more per solve than HiGHS needs for the whole program, and lazy
# costing solves every piece each round.
_WARM_START_STATES = 2_000

_STATUS_NAMES = {
    highspy.HighsModelStatus.kOptimal: "optimal",
    highspy.HighsModelStatus.kInfeasible: "infeasible",
    highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible",
    highspy.HighsModelStatus.kTimeLimit: "time_limit",
    highspy.HighsModelStatus.kIterationLimit: "iteration_limit",
    highspy.HighsModelStatus.kSolutionLimit: "node_limit",  # the one such limit set here
    highspy.HighsModelStatus.kInterrupt: "interrupted",
    highspy.HighsModelStatus.kMemoryLimit: "memory_limit",
    highspy.HighsModelStatus.kNotset: "solver_error",
    highspy.HighsModelStatus.kLoadError: "solver_error",
    highspy.HighsModelStatus.kModelError: "solver_error",
    highspy.HighsModelStatus.kPresolveError: "solver_error",
    highspy.HighsModelStatus.kSolveError: "solver_error",
    highspy.HighsModelStatus.kPostsolveError: "solver_error",
}


def _run(solver: highspy.Highs) -> None:
    """Run HiGHS; if the requested thread count clashes with its scheduler, use the scheduler's.

    HiGHS fixes its thread pool per process on first use and refuses a later, different
    `threads`; restarting the pool would disturb every other HiGHS user in the process.
    """
    status = solver.run()
    never_started = solver.getModelStatus() == highspy.HighsModelStatus.kNotset
    requested_threads = solver.getOptionValue("threads")[1]
    if status == highspy.HighsStatus.kError and never_started and requested_threads != 0:
        logger.warning("HiGHS runs a thread pool of another size; ignoring threads=%s", requested_threads)
        solver.setOptionValue("threads", 0)
        solver.run()


def _new_solver(
    problem: OrchestrationProblem,
    usable: Sequence[int],
    rows: ConstraintRows,
    cost_scale: float,
    integral: bool,
    threads: int | None,
) -> highspy.Highs:
    """A silent HiGHS instance holding the program (or its LP relaxation)."""
    solver = _HighsSolver()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("log_to_console", False)
    solver.setOptionValue("random_seed", 0)
    solver.setOptionValue("mip_rel_gap", _RELATIVE_GAP)
    solver.setOptionValue("mip_abs_gap", _ABSOLUTE_GAP)
    if threads is not None:
        solver.setOptionValue("threads", int(threads))
    columns = len(usable)
    lp = highspy.HighsLp()
    lp.num_col_ = columns
    lp.num_row_ = rows.count
    lp.col_cost_ = np.array([problem.kernels[k].cost * cost_scale for k in usable], dtype=np.float64)
    lp.col_lower_ = np.zeros(columns)
    lp.col_upper_ = np.ones(columns)
    lp.row_lower_ = rows.lower
    lp.row_upper_ = np.full(rows.count, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = columns
    lp.a_matrix_.num_row_ = rows.count
    lp.a_matrix_.start_ = rows.starts
    lp.a_matrix_.index_ = rows.indices
    lp.a_matrix_.value_ = rows.values
    if integral:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * columns
    solver.passModel(lp)
    return solver


def _add_rows(solver: highspy.Highs, rows: ConstraintRows) -> None:
    upper = np.full(rows.count, highspy.kHighsInf)
    nonzeros = len(rows.indices)
    solver.addRows(rows.count, rows.lower, upper, nonzeros, rows.starts[:-1], rows.indices, rows.values)


def _without_offered(problem: OrchestrationProblem) -> OrchestrationProblem:
    """`problem` with every kernel that holds an offered alternative's primitive left out."""
    return dataclasses.replace(problem, offered=frozenset(), kernels=tuple(
        dataclasses.replace(kernel, cost=math.inf) if k in problem.offered else kernel
        for k, kernel in enumerate(problem.kernels)))


def _cost_scale(problem: OrchestrationProblem, usable: Sequence[int]) -> float:
    largest = max((problem.kernels[k].cost for k in usable), default=0.0)
    return 1.0 / largest if largest > 0 else 1.0


def _warm_start(
    problem: OrchestrationProblem, deadline: float, with_dp: bool = True
) -> tuple[tuple[int, ...], float, str | None, float | None]:
    """The better of the stock plan and the no-recompute DP plan: (order, cost, name, stock cost).

    The DP only seeds the program, which is usually far faster, so it gets a small state budget
    and a deadline instead of running to its public default (`with_dp=False`: the stock plan
    only).
    """
    stock_objective = None
    best: tuple[tuple[int, ...], float, str | None] = ((), math.inf, None)
    if problem.stock_plan:
        stock_order = execution_order(problem, problem.stock_plan)
        if stock_order is None:
            raise ValueError("stock_plan is not a feasible plan: it is cyclic or misses a graph output")
        stock_objective = plan_cost(problem, stock_order)
        if math.isfinite(stock_objective):
            best = (stock_order, stock_objective, "stock")
    dp = _dp_seed(problem, deadline) if with_dp else None
    if dp is not None and dp[1] < best[1]:
        best = dp
    return (*best, stock_objective)


def _dp_seed(problem: OrchestrationProblem, deadline: float
             ) -> tuple[tuple[int, ...], float, str] | None:
    """(order, cost, "dp") of the no-recompute DP's plan within its small state budget, or
    None when it finds none by `deadline`."""
    order = no_recompute_plan(problem, _WARM_START_STATES, deadline)
    return None if order is None else (order, plan_cost(problem, order), "dp")


def solve_orchestration(
    problem: OrchestrationProblem, time_limit: float = 10.0, threads: int | None = None
) -> Plan:
    """The cheapest acyclic plan HiGHS finds within `time_limit` seconds (all re-solves together).

    The answer never costs more than the stock plan or the no-recompute DP plan (the warm
    start). Each cyclic answer adds valid cuts (see `cycle_cut_rows`) and the program is solved
    again. A plan is "optimal" only when HiGHS proved, within its gap tolerance, that no
    acyclic plan is cheaper. `threads` is HiGHS's thread count (None: its default).
    """
    return _solve(problem, time_limit, threads, frozenset({"dependency"}))


@dataclass(frozen=True)
class _Outcome:
    """Where the solve ended: the plan kept, its cost, HiGHS's bound and the work done."""

    status: str
    chosen: tuple[int, ...]
    objective: float
    bound: float
    nodes: int = 0
    cuts: int = 0


def _solve(
    problem: OrchestrationProblem,
    time_limit: float,
    threads: int | None,
    families: frozenset[str],
    seeded: bool = True,
) -> Plan:
    """`solve_orchestration` with the formulation's valid families and the warm start as knobs."""
    started = time.perf_counter()
    deadline = started + time_limit
    # a program with alternatives is seeded by the stock plan alone: it solves at the root, and
    # on SegFormer-b0 the DP took a fifth of its solve time for no change in plan or nodes
    alternatives = bool(problem.offered) and seeded
    incumbent, incumbent_cost, warm_start, stock_objective = _warm_start(
        problem, started + time_limit / 4, with_dp=not alternatives)
    if not seeded:
        incumbent, incumbent_cost, warm_start = (), math.inf, None
    if not problem.graph_outputs:
        outcome = _Outcome("optimal", (), 0.0, 0.0)
    elif alternatives:
        outcome, warm_start = _solve_with_alternatives(problem, time_limit, threads, families,
                                                       deadline, incumbent, incumbent_cost,
                                                       warm_start)
    else:
        outcome = _solve_program(problem, families, threads, deadline, incumbent, incumbent_cost)
    return _plan_of(outcome, time.perf_counter() - started, stock_objective, warm_start)


def _solve_with_alternatives(problem, time_limit, threads, families, deadline, incumbent,
                             incumbent_cost, warm_start) -> tuple[_Outcome, str | None]:
    """(outcome, warm start's name) of a program holding offered alternatives.

    A tensor computable two ways weakens the relaxation; with the required set closed over both
    ways (formulation._needed) SegFormer's pieces solve at the root, so the program is first
    solved as it is, within ALTERNATIVES_NODE_LIMIT nodes. Only where that proves nothing, the
    program without alternatives is solved exactly, and the cheapest of its plan, the first
    search's and the no-recompute DP's becomes the one to beat within the limit again: never
    worse than substitutions off, and bounded by nodes, not time (the same answer on any
    machine).
    """
    first = _solve_program(problem, families, threads, deadline, incumbent, incumbent_cost,
                           ALTERNATIVES_NODE_LIMIT)
    if first.status == "optimal":
        return first, warm_start
    plain = _solve(_without_offered(problem), time_limit, threads, families)
    seeds = [(first.chosen, first.objective, warm_start),
             (plain.chosen, plain.objective, "no alternatives")]
    dp = _dp_seed(problem, time.perf_counter() + time_limit / 4)
    if dp is not None:
        seeds.append(dp)
    best, best_cost, warm_start = min(seeds, key=lambda seed: seed[1])
    second = _solve_program(problem, families, threads, deadline, best, best_cost,
                            ALTERNATIVES_NODE_LIMIT)
    return dataclasses.replace(second, nodes=first.nodes + plain.nodes + second.nodes,
                               cuts=first.cuts + second.cuts), warm_start


def _solve_program(
    problem: OrchestrationProblem,
    families: frozenset[str],
    threads: int | None,
    deadline: float,
    incumbent: tuple[int, ...],
    incumbent_cost: float,
    node_limit: int | None = None,
) -> _Outcome:
    """The program on HiGHS with the warm start (`incumbent`, may be empty) as its cutoff,
    within `node_limit` branch-and-bound nodes per run (None: no limit)."""
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    rows = orchestration_rows(problem, usable, families)
    if rows is None:
        return _Outcome("infeasible", (), math.inf, math.inf)
    cost_scale = _cost_scale(problem, usable)
    solver = _new_solver(problem, usable, rows, cost_scale, integral=True, threads=threads)
    if node_limit is not None:  # the search with offered alternatives (the only limited one)
        solver.setOptionValue("mip_max_nodes", node_limit)
        # its time is the root's: without HiGHS's restart after root presolve and its symmetry
        # detection, SegFormer-b0's 111 such programs solved in 20-25 % less time, to the same
        # plans (programs without alternatives showed no difference)
        solver.setOptionValue("mip_allow_restart", False)
        solver.setOptionValue("mip_detect_symmetry", False)
    if incumbent:
        # The warm start enters as a cutoff, not a MIP start: HiGHS 1.16 maps a MIP start into
        # the presolved space without the objective of columns presolve removed, then takes that
        # too-low value for an incumbent and stops with a wrong "optimal" (seen on random
        # instances). A cutoff just below the warm start's cost prunes the same subtrees, and
        # "infeasible" then proves that nothing is cheaper than the warm start.
        solver.setOptionValue("objective_bound", incumbent_cost * cost_scale * (1.0 - _RELATIVE_GAP))
    return _solve_until_acyclic(problem, solver, usable, cost_scale, deadline, incumbent,
                                incumbent_cost)


def _solve_until_acyclic(
    problem: OrchestrationProblem,
    solver: highspy.Highs,
    usable: Sequence[int],
    cost_scale: float,
    deadline: float,
    best: tuple[int, ...],
    best_cost: float,
) -> _Outcome:
    """Solve, cut off a cyclic answer and solve again, until an acyclic answer or a limit.

    `best` is the cheapest acyclic plan known (the warm start; may be empty), kept unless beaten.
    """
    column_of = {k: column for column, k in enumerate(usable)}
    nodes = cuts = 0
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return _Outcome("time_limit", best, best_cost, -math.inf, nodes, cuts)
        solver.setOptionValue("time_limit", remaining)
        _run(solver)
        status, bound, chosen, round_nodes = _read_answer(solver, usable, cost_scale)
        nodes += round_nodes
        if status == "infeasible":
            if best:  # nothing beats the warm start by more than the gap tolerance
                return _Outcome("optimal", best, best_cost, best_cost, nodes, cuts)
            return _Outcome("infeasible", (), math.inf, math.inf, nodes, cuts)
        if chosen is None:
            return _Outcome(status, best, best_cost, bound, nodes, cuts)
        order = execution_order(problem, chosen)
        if order is not None:
            if plan_cost(problem, order) < best_cost:
                best, best_cost = order, plan_cost(problem, order)
            return _Outcome(status, best, best_cost, bound, nodes, cuts)
        cut_rows = cycle_cut_rows(problem, chosen, column_of)
        assert cut_rows, "a cyclic choice must yield at least one cut"
        _add_rows(solver, ConstraintRows.build(cut_rows))
        cuts += len(cut_rows)
        if status != "optimal":
            return _Outcome(status, best, best_cost, bound, nodes, cuts)


def _read_answer(
    solver: highspy.Highs, usable: Sequence[int], cost_scale: float
) -> tuple[str, float, set[int] | None, int]:
    """After a run: (status, bound in seconds, the kernels chosen or None, branch-and-bound nodes)."""
    model_status = solver.getModelStatus()
    info = solver.getInfo()
    nodes = max(int(info.mip_node_count), 0)
    status = _STATUS_NAMES.get(model_status, solver.modelStatusToString(model_status).lower())
    bound = (info.mip_dual_bound / cost_scale if status in ("optimal", "time_limit", "node_limit")
             else -math.inf)
    if status == "infeasible" or info.primal_solution_status != highspy.kSolutionStatusFeasible:
        return status, bound, None, nodes
    values = np.asarray(solver.getSolution().col_value)
    return status, bound, {usable[column] for column in np.flatnonzero(values > 0.5)}, nodes


def _plan_of(
    outcome: _Outcome, seconds: float, stock_objective: float | None, warm_start: str | None
) -> Plan:
    """The Plan of an outcome: its bound no higher than its objective, and the relative gap."""
    objective = outcome.objective
    bound = min(outcome.bound, objective)
    if objective - bound <= 1e-12 * abs(objective):  # float noise of a proven optimum
        bound = objective
    if objective == bound or outcome.status == "infeasible":
        gap = 0.0
    elif math.isfinite(objective) and objective > 0:
        gap = (objective - bound) / objective
    else:
        gap = math.inf
    return Plan(outcome.chosen, objective, outcome.status, bound, gap, outcome.nodes, seconds,
                outcome.cuts, stock_objective, warm_start)


def _lp_bound(problem: OrchestrationProblem, families: frozenset[str]) -> float:
    """The LP relaxation's optimum (a lower bound on every plan), for comparing formulations."""
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    rows = orchestration_rows(problem, usable, families)
    if rows is None:
        return math.inf
    cost_scale = _cost_scale(problem, usable)
    solver = _new_solver(problem, usable, rows, cost_scale, integral=False, threads=None)
    _run(solver)
    return solver.getInfo().objective_function_value / cost_scale
