"""Kernel orchestration: pick the cheapest set of candidate kernels as a binary integer program.

The program (Korch, section 5) has a binary x_k per candidate kernel and minimises the sum of the
chosen kernels' costs such that every graph output is produced and every input of a chosen kernel
is produced by a chosen kernel. A primitive may be computed by several chosen kernels
(recomputation). The program cannot express "the chosen kernels admit an execution order", so a
cyclic answer is cut off with a valid inequality and the program solved again.

This module knows nothing about TVM: kernels are sets of primitive ids with a cost.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import highspy
import numpy as np

logger = logging.getLogger(__name__)

# The public highspy.Highs subclass installs Python callbacks on construction, and that prints a
# banner on stdout before any option can silence it; the core class it wraps does not.
_HighsSolver = getattr(highspy, "_Highs", highspy.Highs)

# Costs are seconds (1e-6 .. 1e-2). HiGHS's absolute gap tolerance (1e-6) would call a plan
# "optimal" that is several kernels away from it, so costs are scaled to make the largest one 1
# and both gap tolerances are set far below any difference between two real plans.
_RELATIVE_GAP = 1e-7
_ABSOLUTE_GAP = 1e-9

# States the no-recompute DP may visit when it only seeds the program (about 20 ms). Small
# pieces finish in far fewer; on Candy's large ones 20,000 states took 0.1-0.3 s a solve, found
# nothing, and HiGHS then solved them in 0.03 s (lazy costing solves every piece each round).
_WARM_START_STATES = 2_000


@dataclass(frozen=True)
class KernelChoice:
    """One candidate kernel as the solver sees it."""

    nodes: frozenset[int]  # primitive ids it computes
    inputs: frozenset[int]  # primitive ids it reads but does not compute (graph inputs not listed)
    outputs: frozenset[int]  # primitive ids it makes available to other kernels (subset of nodes)
    cost: float  # seconds; math.inf means unusable, never chosen


@dataclass(frozen=True)
class OrchestrationProblem:
    """Candidates over primitives 0..num_nodes-1 and the primitives the graph must produce."""

    num_nodes: int
    kernels: tuple[KernelChoice, ...]
    graph_outputs: frozenset[int]
    stock_plan: tuple[int, ...] = ()  # a known feasible plan (TVM's FuseOps groups); may be empty


@dataclass(frozen=True)
class Plan:
    """The chosen kernels in execution order and how much the solver vouches for them."""

    chosen: tuple[int, ...]
    objective: float  # sum of the chosen kernels' costs (inf when no plan was found)
    status: str  # "optimal", "time_limit", "infeasible", ...; never "optimal" when time-limited
    best_bound: float  # proven lower bound on any plan's cost
    gap: float  # (objective - best_bound) / objective
    nodes: int  # branch-and-bound nodes over all solves
    seconds: float
    cycle_cuts: int  # inequalities added to cut off cyclic choices
    stock_objective: float | None  # cost of the stock plan, when one was given
    warm_start: str | None  # the plan HiGHS had to beat: "stock", "dp" or None


@dataclass(frozen=True)
class _Rows:
    """Constraint rows `lower <= A x` (no upper bounds) in CSR form over the solver's columns."""

    lower: np.ndarray
    starts: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @staticmethod
    def build(rows: Iterable[tuple[float, dict[int, float]]]) -> _Rows:
        lower, starts, indices, values = [], [0], [], []
        for row_lower, coefficients in rows:
            lower.append(row_lower)
            for column in sorted(coefficients):
                indices.append(column)
                values.append(coefficients[column])
            starts.append(len(indices))
        return _Rows(
            np.asarray(lower, dtype=np.float64),
            np.asarray(starts, dtype=np.int32),
            np.asarray(indices, dtype=np.int32),
            np.asarray(values, dtype=np.float64),
        )

    @property
    def count(self) -> int:
        return len(self.lower)


# ---------------------------------------------------------------------------------------------
# Scheduling


def _schedule(problem: OrchestrationProblem, chosen: Iterable[int]) -> tuple[list[int], set[int]]:
    """Greedy list scheduling: run any chosen kernel whose inputs are available, smallest first.

    With recomputation allowed, running a kernel only ever adds available primitives, so this
    greedy schedules every chosen kernel iff some execution order exists. Returns the order it
    found and the primitives available at the end.
    """
    pending = sorted(set(chosen))
    missing = {k: set(problem.kernels[k].inputs) for k in pending}
    waiting_on: dict[int, list[int]] = {}
    for k in pending:
        for node in missing[k]:
            waiting_on.setdefault(node, []).append(k)
    ready = [k for k in pending if not missing[k]]
    heapq.heapify(ready)
    order: list[int] = []
    available: set[int] = set()
    while ready:
        kernel = heapq.heappop(ready)
        order.append(kernel)
        for node in problem.kernels[kernel].outputs - available:
            available.add(node)
            for waiter in waiting_on.get(node, ()):
                missing[waiter].discard(node)
                if not missing[waiter]:
                    heapq.heappush(ready, waiter)
    return order, available


def execution_order(problem: OrchestrationProblem, chosen: Iterable[int]) -> tuple[int, ...] | None:
    """A valid execution order of `chosen`, or None if it is cyclic or misses a graph output."""
    chosen = set(chosen)
    if any(not 0 <= k < len(problem.kernels) for k in chosen):
        return None
    order, available = _schedule(problem, chosen)
    if len(order) != len(chosen) or not problem.graph_outputs <= available:
        return None
    return tuple(order)


def _plan_cost(problem: OrchestrationProblem, chosen: Iterable[int]) -> float:
    return math.fsum(problem.kernels[k].cost for k in chosen)


# ---------------------------------------------------------------------------------------------
# Structure shared by the program and the DP


def _required_nodes(
    problem: OrchestrationProblem, usable: Sequence[int]
) -> tuple[dict[int, frozenset[int]], frozenset[int]]:
    """Which primitives every plan must compute, and what each one depends on.

    `depends[u]` holds the primitives that every usable kernel computing u either computes or
    reads: whichever kernel computes u, v is computed in it or produced by another chosen
    kernel. Taken from the kernels themselves, so it needs no graph edges and stays valid for any
    input. The required set is the closure of the graph outputs under `depends`; every plan,
    cyclic or not, has a chosen kernel containing each required primitive.
    """
    depends: dict[int, frozenset[int]] = {}
    for k in usable:
        kernel = problem.kernels[k]
        reachable = kernel.nodes | kernel.inputs
        for node in kernel.nodes:
            known = depends.get(node)
            depends[node] = reachable if known is None else known & reachable
    depends = {node: deps - {node} for node, deps in depends.items()}
    required: set[int] = set()
    frontier = list(problem.graph_outputs)
    while frontier:
        node = frontier.pop()
        if node in required:
            continue
        required.add(node)
        frontier.extend(depends.get(node, ()))
    return depends, frozenset(required)


def _orchestration_rows(
    problem: OrchestrationProblem,
    usable: Sequence[int],
    families: frozenset[str] = frozenset({"dependency"}),
) -> _Rows | None:
    """The program's rows over columns 0..len(usable)-1, or None when some row cannot hold.

    Always: (output) each graph output is an output of a chosen kernel; (supply) each input of
    a chosen kernel is an output of a chosen kernel. The optional families are valid for every
    plan (see `_required_nodes`) and only tighten the LP relaxation:
    "cover": each required primitive lies in some chosen kernel;
    "dependency": for required u and v in depends[u], some chosen kernel contains u and v, or
    one outputs v (for a graph output u, the kernel containing u must be one that outputs u).
    The supply rows alone let many half-chosen readers of v share one half-chosen producer;
    "dependency" demands a whole unit of "v is there" for u. It implies "cover" for every
    required primitive that is some other's dependency; see `_compare_formulations` in the
    tests for what each family does to the LP bound.
    """
    column_of = {k: column for column, k in enumerate(usable)}
    producers: dict[int, list[int]] = {}
    containers: dict[int, list[int]] = {}
    for k in usable:
        for node in problem.kernels[k].outputs:
            producers.setdefault(node, []).append(column_of[k])
        for node in problem.kernels[k].nodes:
            containers.setdefault(node, []).append(column_of[k])

    rows: list[tuple[float, dict[int, float]]] = []
    for node in sorted(problem.graph_outputs):
        rows.append((1.0, dict.fromkeys(producers.get(node, ()), 1.0)))
    for k in usable:
        for node in sorted(problem.kernels[k].inputs):
            supply = dict.fromkeys(producers.get(node, ()), 1.0)
            supply[column_of[k]] = -1.0
            rows.append((0.0, supply))

    depends, required = _required_nodes(problem, usable)
    if "cover" in families:
        for node in sorted(required - problem.graph_outputs):
            rows.append((1.0, dict.fromkeys(containers.get(node, ()), 1.0)))
    if "dependency" in families:
        for node in sorted(required):
            holders = producers if node in problem.graph_outputs else containers
            for dependency in sorted(depends.get(node, ())):
                row = dict.fromkeys(producers.get(dependency, ()), 1.0)
                for column in holders.get(node, ()):
                    if dependency in problem.kernels[usable[column]].nodes:
                        row[column] = 1.0
                rows.append((1.0, row))

    if any(lower > 0 and not coefficients for lower, coefficients in rows):
        return None  # a required primitive no usable kernel can provide
    return _Rows.build(rows)


def _cycle_cut_rows(
    problem: OrchestrationProblem, chosen: set[int], column_of: dict[int, int], first_producer: bool = True
) -> list[tuple[float, dict[int, float]]]:
    """Valid inequalities that cut off the cyclic choice `chosen`.

    Scheduling stops with kernels S that each miss an input. Group them by "k needs an output of
    k'" and take each group G closed under that relation (a sink strongly connected component):
    the chosen producers of G's missing inputs T are all in G, and each of them reads T.

    First-producer cut, for each k in G that outputs T:
        x_k <= sum_{j outputs some node of T and reads none} x_j.
    Valid: in an execution order, the first kernel to output a node of T runs before any node of
    T is available, so it reads none. Violated now: its right side is 0.
    Set cut (the weaker textbook form, kept for the bench):
        sum_{k in G} (1 - x_k) + sum_{j not in G, j outputs some node of T} x_j >= 1.
    Valid by the same first-kernel argument; the first-producer cut implies it on integer points.
    A cut "not all of G" would be wrong: a plan may hold G plus a kernel that breaks the cycle.
    """
    order, available = _schedule(problem, chosen)
    stuck = sorted(chosen - set(order))
    missing = {k: problem.kernels[k].inputs - available for k in stuck}
    needs = {k: sorted(j for j in stuck if problem.kernels[j].outputs & missing[k]) for k in stuck}

    cuts = []
    for group in _closed_components(stuck, needs):
        trapped = set().union(*(missing[k] for k in group))
        trapped_producers = [k for k in group if problem.kernels[k].outputs & trapped]
        if first_producer and trapped_producers:
            starters = {
                column: 1.0
                for j, column in column_of.items()
                if problem.kernels[j].outputs & trapped and not problem.kernels[j].inputs & trapped
            }
            cuts.extend((0.0, {**starters, column_of[k]: -1.0}) for k in trapped_producers)
            continue
        row = {column_of[k]: -1.0 for k in group}
        for j, column in column_of.items():
            if j not in group and problem.kernels[j].outputs & trapped:
                row[column] = 1.0
        cuts.append((1.0 - len(group), row))
    return cuts


def _closed_components(vertices: list[int], successors: dict[int, list[int]]) -> list[list[int]]:
    """The smallest vertex sets closed under `successors`: the sink strongly connected components.

    Each vertex's reachable set is closed; the minimal ones are exactly the sink components.
    Stuck sets are a handful of kernels, so the quadratic search is cheap.
    """
    reachable = {}
    for vertex in vertices:
        seen, frontier = {vertex}, [vertex]
        while frontier:
            for successor in successors[frontier.pop()]:
                if successor not in seen:
                    seen.add(successor)
                    frontier.append(successor)
        reachable[vertex] = frozenset(seen)
    groups = set(reachable.values())
    minimal = {group for group in groups if not any(other < group for other in groups)}
    return sorted(sorted(group) for group in minimal)


# ---------------------------------------------------------------------------------------------
# Exact plan without recomputation (warm start)


def no_recompute_plan(problem: OrchestrationProblem, max_states: int = 200_000) -> tuple[int, ...] | None:
    """The cheapest plan in which no primitive is computed twice, or None past `max_states`.

    A* over execution states (computed primitives, available primitives): a step runs a kernel
    whose inputs are available and whose primitives are not yet computed. The heuristic charges
    each required primitive not yet computed its cheapest share cost_k / |nodes_k|; a kernel's
    cost is the sum of its primitives' shares, so the heuristic is consistent and the first goal
    state popped is optimal.
    """
    return _no_recompute_plan(problem, max_states, deadline=math.inf)


def _no_recompute_plan(
    problem: OrchestrationProblem, max_states: int, deadline: float
) -> tuple[int, ...] | None:
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    _, required = _required_nodes(problem, usable)
    share: dict[int, float] = {}
    for k in usable:
        kernel = problem.kernels[k]
        for node in kernel.nodes:  # an empty kernel has no nodes, so no division by zero
            share[node] = min(share.get(node, math.inf), kernel.cost / len(kernel.nodes))
    if any(node not in share for node in required):
        return None

    def mask(nodes: Iterable[int]) -> int:
        return sum(1 << node for node in set(nodes))

    node_masks = [mask(problem.kernels[k].nodes) for k in usable]
    input_masks = [mask(problem.kernels[k].inputs) for k in usable]
    output_masks = [mask(problem.kernels[k].outputs) for k in usable]
    goal = mask(problem.graph_outputs)
    # What running each kernel takes off the heuristic (its primitives are not yet computed).
    heuristic_drop = [math.fsum(share[n] for n in problem.kernels[k].nodes & required) for k in usable]

    start = (0, 0)
    best_cost = {start: 0.0}
    came_from: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
    frontier = [(0.0, 0, 0.0, math.fsum(share[n] for n in required), start)]
    pushes = 0
    while frontier:
        _, _, cost, remaining_estimate, state = heapq.heappop(frontier)
        if cost > best_cost[state]:
            continue
        computed, available = state
        if goal & ~available == 0:
            path = []
            while state != start:
                state, position = came_from[state]
                path.append(usable[position])
            return tuple(reversed(path))
        for position, k in enumerate(usable):
            if node_masks[position] & computed or input_masks[position] & ~available:
                continue
            child = (computed | node_masks[position], available | output_masks[position])
            child_cost = cost + problem.kernels[k].cost
            if child_cost >= best_cost.get(child, math.inf):
                continue
            if child not in best_cost and len(best_cost) >= max_states:
                return None
            if len(best_cost) % 1024 == 0 and time.perf_counter() > deadline:
                return None
            best_cost[child] = child_cost
            came_from[child] = (state, position)
            child_estimate = max(0.0, remaining_estimate - heuristic_drop[position])
            pushes += 1
            heapq.heappush(frontier, (child_cost + child_estimate, pushes, child_cost, child_estimate, child))
    return None


# ---------------------------------------------------------------------------------------------
# The program on HiGHS

_STATUS_NAMES = {
    highspy.HighsModelStatus.kOptimal: "optimal",
    highspy.HighsModelStatus.kInfeasible: "infeasible",
    highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible",
    highspy.HighsModelStatus.kTimeLimit: "time_limit",
    highspy.HighsModelStatus.kIterationLimit: "iteration_limit",
    highspy.HighsModelStatus.kSolutionLimit: "solution_limit",
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
    rows: _Rows,
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


def _add_rows(solver: highspy.Highs, rows: _Rows) -> None:
    upper = np.full(rows.count, highspy.kHighsInf)
    nonzeros = len(rows.indices)
    solver.addRows(rows.count, rows.lower, upper, nonzeros, rows.starts[:-1], rows.indices, rows.values)


def _cost_scale(problem: OrchestrationProblem, usable: Sequence[int]) -> float:
    largest = max((problem.kernels[k].cost for k in usable), default=0.0)
    return 1.0 / largest if largest > 0 else 1.0


def _warm_start(
    problem: OrchestrationProblem, deadline: float
) -> tuple[tuple[int, ...], float, str | None, float | None]:
    """The better of the stock plan and the no-recompute DP plan: (order, cost, name, stock cost).

    The DP only seeds the program, which is usually far faster, so it gets a small state budget
    and a deadline instead of running to its public default.
    """
    stock_objective = None
    best: tuple[tuple[int, ...], float, str | None] = ((), math.inf, None)
    if problem.stock_plan:
        stock_order = execution_order(problem, problem.stock_plan)
        if stock_order is None:
            raise ValueError("stock_plan is not a feasible plan: it is cyclic or misses a graph output")
        stock_objective = _plan_cost(problem, stock_order)
        if math.isfinite(stock_objective):
            best = (stock_order, stock_objective, "stock")
    dp_order = _no_recompute_plan(problem, _WARM_START_STATES, deadline)
    if dp_order is not None and _plan_cost(problem, dp_order) < best[1]:
        best = (dp_order, _plan_cost(problem, dp_order), "dp")
    return (*best, stock_objective)


def solve_orchestration(
    problem: OrchestrationProblem, time_limit: float = 10.0, threads: int | None = None
) -> Plan:
    """The cheapest acyclic plan HiGHS finds within `time_limit` seconds (all re-solves together).

    The answer never costs more than the stock plan or the no-recompute DP plan (the warm
    start). Each cyclic answer adds valid cuts (see `_cycle_cut_rows`) and the program is solved
    again. A plan is "optimal" only when HiGHS proved, within its gap tolerance, that no
    acyclic plan is cheaper.
    """
    return _solve(problem, time_limit, threads, frozenset({"dependency"}))


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
    incumbent, incumbent_cost, warm_start, stock_objective = _warm_start(problem, started + time_limit / 4)
    if not seeded:
        incumbent, incumbent_cost, warm_start = (), math.inf, None

    def finish(
        status: str, chosen: tuple[int, ...], objective: float, bound: float, nodes: int, cuts: int
    ) -> Plan:
        bound = min(bound, objective)
        if objective - bound <= 1e-12 * abs(objective):  # float noise of a proven optimum
            bound = objective
        if objective == bound or status == "infeasible":
            gap = 0.0
        elif math.isfinite(objective) and objective > 0:
            gap = (objective - bound) / objective
        else:
            gap = math.inf
        seconds = time.perf_counter() - started
        return Plan(chosen, objective, status, bound, gap, nodes, seconds, cuts, stock_objective, warm_start)

    if not problem.graph_outputs:
        return finish("optimal", (), 0.0, 0.0, 0, 0)
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    rows = _orchestration_rows(problem, usable, families)
    if rows is None:
        return finish("infeasible", (), math.inf, math.inf, 0, 0)

    column_of = {k: column for column, k in enumerate(usable)}
    cost_scale = _cost_scale(problem, usable)
    solver = _new_solver(problem, usable, rows, cost_scale, integral=True, threads=threads)
    if incumbent:
        # The warm start enters as a cutoff, not a MIP start: HiGHS 1.16 maps a MIP start into
        # the presolved space without the objective of columns presolve removed, then takes that
        # too-low value for an incumbent and stops with a wrong "optimal" (seen on random
        # instances). A cutoff just below the warm start's cost prunes the same subtrees, and
        # "infeasible" then proves that nothing is cheaper than the warm start.
        solver.setOptionValue("objective_bound", incumbent_cost * cost_scale * (1.0 - _RELATIVE_GAP))
    nodes = cuts = 0
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return finish("time_limit", incumbent, incumbent_cost, -math.inf, nodes, cuts)
        solver.setOptionValue("time_limit", remaining)
        _run(solver)
        model_status = solver.getModelStatus()
        info = solver.getInfo()
        nodes += max(int(info.mip_node_count), 0)
        status = _STATUS_NAMES.get(model_status, solver.modelStatusToString(model_status).lower())
        if status == "infeasible":
            if incumbent:  # nothing beats the warm start by more than the gap tolerance
                return finish("optimal", incumbent, incumbent_cost, incumbent_cost, nodes, cuts)
            return finish("infeasible", (), math.inf, math.inf, nodes, cuts)
        bound = info.mip_dual_bound / cost_scale if status in ("optimal", "time_limit") else -math.inf
        if info.primal_solution_status != highspy.kSolutionStatusFeasible:
            return finish(status, incumbent, incumbent_cost, bound, nodes, cuts)
        values = np.asarray(solver.getSolution().col_value)
        chosen = {usable[column] for column in np.flatnonzero(values > 0.5)}
        order = execution_order(problem, chosen)
        if order is not None:
            if _plan_cost(problem, order) < incumbent_cost:
                incumbent, incumbent_cost = order, _plan_cost(problem, order)
            return finish(status, incumbent, incumbent_cost, bound, nodes, cuts)
        cut_rows = _cycle_cut_rows(problem, chosen, column_of)
        assert cut_rows, "a cyclic choice must yield at least one cut"
        _add_rows(solver, _Rows.build(cut_rows))
        cuts += len(cut_rows)
        if status != "optimal":
            return finish(status, incumbent, incumbent_cost, bound, nodes, cuts)


def _lp_bound(problem: OrchestrationProblem, families: frozenset[str]) -> float:
    """The LP relaxation's optimum (a lower bound on every plan), for comparing formulations."""
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    rows = _orchestration_rows(problem, usable, families)
    if rows is None:
        return math.inf
    cost_scale = _cost_scale(problem, usable)
    solver = _new_solver(problem, usable, rows, cost_scale, integral=False, threads=None)
    _run(solver)
    return solver.getInfo().objective_function_value / cost_scale
