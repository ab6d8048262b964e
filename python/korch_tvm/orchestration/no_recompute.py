"""The exact plan without recomputation (A* over execution states): the solver's warm start.

Kept apart from the program because it is a second, independent search: it needs only the
problem records and the required primitives, and it bounds what HiGHS must beat.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable, Sequence

from .formulation import required_nodes
from .plans import OrchestrationProblem


def no_recompute_plan(
    problem: OrchestrationProblem, max_states: int = 200_000, deadline: float = math.inf
) -> tuple[int, ...] | None:
    """The cheapest plan in which no primitive is computed twice, or None past `max_states`.

    A* over execution states (computed primitives, available primitives): a step runs a kernel
    whose inputs are available and whose primitives are not yet computed. The heuristic charges
    each required primitive not yet computed its cheapest share cost_k / |nodes_k|; a kernel's
    cost is the sum of its primitives' shares, so the heuristic is consistent and the first goal
    state popped is optimal. `max_states` bounds the states visited and `deadline` (a
    `time.perf_counter()` value) the time; past either the answer is None.
    """
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    _, required = required_nodes(problem, usable)
    share: dict[int, float] = {}
    for k in usable:
        kernel = problem.kernels[k]
        for node in kernel.nodes:  # an empty kernel has no nodes, so no division by zero
            share[node] = min(share.get(node, math.inf), kernel.cost / len(kernel.nodes))
    if any(node not in share for node in required):
        return None
    return _a_star(problem, usable, required, share, max_states, deadline)


def _mask(nodes: Iterable[int]) -> int:
    return sum(1 << node for node in set(nodes))


def _a_star(
    problem: OrchestrationProblem,
    usable: Sequence[int],
    required: frozenset[int],
    share: dict[int, float],
    max_states: int,
    deadline: float,
) -> tuple[int, ...] | None:
    """The search of `no_recompute_plan`, given each primitive's cheapest share of a kernel."""
    node_masks = [_mask(problem.kernels[k].nodes) for k in usable]
    input_masks = [_mask(problem.kernels[k].inputs) for k in usable]
    output_masks = [_mask(problem.kernels[k].outputs) for k in usable]
    goal = _mask(problem.graph_outputs)
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
