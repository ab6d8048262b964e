"""What an orchestration problem and its plan are, and whether chosen kernels can run.

The records the solver, the problem builder and the memory check share, and the greedy scheduler
that decides whether a set of chosen kernels admits an execution order. No TVM, no HiGHS.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass


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
    offered: frozenset[int] = frozenset()  # kernels holding an offered alternative's primitive


@dataclass(frozen=True)
class Plan:
    """The chosen kernels in execution order and how much the solver vouches for them."""

    chosen: tuple[int, ...]
    objective: float  # sum of the chosen kernels' costs (inf when no plan was found)
    # "optimal", "time_limit", "node_limit", "infeasible", ...; never "optimal" when limited
    status: str
    best_bound: float  # proven lower bound on any plan's cost
    gap: float  # (objective - best_bound) / objective
    nodes: int  # branch-and-bound nodes over all solves
    seconds: float
    cycle_cuts: int  # inequalities added to cut off cyclic choices
    stock_objective: float | None  # cost of the stock plan, when one was given
    warm_start: str | None  # the plan HiGHS had to beat: "stock", "dp", "no alternatives", None


def greedy_schedule(problem: OrchestrationProblem, chosen: Iterable[int]) -> tuple[list[int], set[int]]:
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
    """A valid execution order of `chosen`, or None if it is cyclic or misses a graph output.

    `chosen` holds indices into `problem.kernels`; an index outside them gives None too.
    """
    chosen = set(chosen)
    if any(not 0 <= k < len(problem.kernels) for k in chosen):
        return None
    order, available = greedy_schedule(problem, chosen)
    if len(order) != len(chosen) or not problem.graph_outputs <= available:
        return None
    return tuple(order)


def plan_cost(problem: OrchestrationProblem, chosen: Iterable[int]) -> float:
    """The summed cost of the kernels `chosen` (indices into `problem.kernels`), in seconds."""
    return math.fsum(problem.kernels[k].cost for k in chosen)


def problem_shape(problem: OrchestrationProblem) -> tuple:
    """`problem` with its primitives numbered by rank among those it names: two pieces that
    are copies of one another (a transformer's blocks) have the same shape, so one solve
    serves both, as the same kernel indices make the same plan of either."""
    named = set(problem.graph_outputs)
    for kernel in problem.kernels:
        named |= kernel.nodes | kernel.inputs | kernel.outputs
    rank = {node: position for position, node in enumerate(sorted(named))}

    def ranked(nodes: frozenset[int]) -> tuple[int, ...]:
        return tuple(sorted(rank[node] for node in nodes))

    return (tuple((ranked(k.nodes), ranked(k.inputs), ranked(k.outputs), k.cost)
                  for k in problem.kernels),
            ranked(problem.graph_outputs), problem.stock_plan, tuple(sorted(problem.offered)))
