"""Topological order with a tie-break, shared by the partitioner and the kernel rewrite."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def ordered_topologically(dependencies: Sequence[set[int]], priority: Sequence) -> list[int] | None:
    """Indices 0..n-1 in an order where each comes after its `dependencies`; None on a cycle.

    Among the ready ones the smallest `priority` goes first (e.g. the earliest binding), which
    keeps the result deterministic and close to the original program order.
    """
    waiting = [len(deps) for deps in dependencies]
    dependants: list[list[int]] = [[] for _ in dependencies]
    for unit, deps in enumerate(dependencies):
        for dependency in deps:
            dependants[dependency].append(unit)
    ready = [(priority[unit], unit) for unit in range(len(dependencies)) if waiting[unit] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, unit = heapq.heappop(ready)
        order.append(unit)
        for dependant in dependants[unit]:
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                heapq.heappush(ready, (priority[dependant], dependant))
    return order if len(order) == len(dependencies) else None
