"""The binary program's rows: output, supply and the valid tightening families, and cycle cuts.

Rows are built over the solver's columns (the usable kernels) as plain CSR arrays, so the
formulation can be read and tested without a solver.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .plans import OrchestrationProblem, greedy_schedule


@dataclass(frozen=True)
class ConstraintRows:
    """Constraint rows `lower <= A x` (no upper bounds) in CSR form over the solver's columns."""

    lower: np.ndarray
    starts: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @staticmethod
    def build(rows: Iterable[tuple[float, dict[int, float]]]) -> ConstraintRows:
        """Rows given as (lower bound, {column: coefficient})."""
        lower, starts, indices, values = [], [0], [], []
        for row_lower, coefficients in rows:
            lower.append(row_lower)
            for column in sorted(coefficients):
                indices.append(column)
                values.append(coefficients[column])
            starts.append(len(indices))
        return ConstraintRows(
            np.asarray(lower, dtype=np.float64),
            np.asarray(starts, dtype=np.int32),
            np.asarray(indices, dtype=np.int32),
            np.asarray(values, dtype=np.float64),
        )

    @property
    def count(self) -> int:
        return len(self.lower)


def required_nodes(
    problem: OrchestrationProblem, usable: Sequence[int]
) -> tuple[dict[int, frozenset[int]], frozenset[int]]:
    """Which primitives every plan must compute, and what each one depends on.

    `depends[u]` holds the primitives that every usable kernel computing u either computes or
    reads: whichever kernel computes u, v is computed in it or produced by another chosen
    kernel. Taken from the kernels themselves, so it needs no graph edges and stays valid for any
    input. The required set is the closure of the graph outputs under `depends` and `_needed`;
    every plan, cyclic or not, has a chosen kernel containing each required primitive.
    """
    depends: dict[int, frozenset[int]] = {}
    for k in usable:
        kernel = problem.kernels[k]
        reachable = kernel.nodes | kernel.inputs
        for node in kernel.nodes:
            known = depends.get(node)
            depends[node] = reachable if known is None else known & reachable
    depends = {node: deps - {node} for node, deps in depends.items()}
    # only a tensor computable two ways (an offered alternative) cuts the closure short
    needed = _needed(problem, usable) if problem.offered else None
    required: set[int] = set()
    frontier = list(problem.graph_outputs)
    while frontier:
        node = frontier.pop()
        if node not in required:
            required.add(node)
            frontier.extend(depends.get(node, ()))
            if needed is not None:
                frontier.extend(needed(node))
    return depends, frozenset(required)


def _needed(problem: OrchestrationProblem, usable: Sequence[int]):
    """need(u): the primitives every plan that computes u computes too.

    Whichever kernel k computes u, the plan computes k's nodes and its inputs, and what each
    input needs in turn: need(u) is the intersection over k of those sets. Where an offered
    alternative makes a tensor computable two ways, the direct `depends` of that tensor keeps
    only what both ways touch, and a closure under it stopped there, leaving everything above
    the site unrequired and the relaxation weak (SegFormer's pieces took a second and hundreds
    of branch-and-bound nodes instead of one); the transitive need sees that both ways read the
    same softmax. A kernel's nodes need not lie on one path (a horizontal fusion), so the
    relation can have cycles; an input met again on one is taken as needing nothing more.
    """
    holding: dict[int, list[int]] = {}  # node -> the usable kernels computing it
    for k in usable:
        for node in problem.kernels[k].nodes:
            holding.setdefault(node, []).append(k)
    memo: dict[int, frozenset[int]] = {}
    visiting: set[int] = set()

    def need(node: int) -> frozenset[int]:
        # iterative post-order over the kernels' inputs (pieces are hundreds of primitives deep)
        stack = [node]
        while stack:
            top = stack[-1]
            if top in memo:
                stack.pop()
                continue
            pending = [w for k in holding.get(top, ()) for w in problem.kernels[k].inputs
                       if w not in memo and w != top]
            if pending and top not in visiting:
                visiting.add(top)
                stack.extend(pending)
                continue
            # an input still open here lies on a cycle: it adds no more than itself, which
            # only weakens the claim
            shared = None
            for k in holding.get(top, ()):
                kernel = problem.kernels[k]
                term = set(kernel.nodes | kernel.inputs)
                for w in kernel.inputs:
                    term |= memo.get(w, frozenset())
                shared = term if shared is None else shared & term
            memo[top] = frozenset(shared or ()) - {top}
            visiting.discard(top)
            stack.pop()
        return memo[node]

    return need


def orchestration_rows(
    problem: OrchestrationProblem,
    usable: Sequence[int],
    families: frozenset[str] = frozenset({"dependency"}),
) -> ConstraintRows | None:
    """The program's rows over columns 0..len(usable)-1, or None when some row cannot hold.

    `usable` lists the kernels (indices into `problem.kernels`) the columns stand for.

    Always: (output) each graph output is an output of a chosen kernel; (supply) each input of
    a chosen kernel is an output of a chosen kernel. The optional families are valid for every
    plan (see `required_nodes`) and only tighten the LP relaxation:
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

    depends, required = required_nodes(problem, usable)
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
    return ConstraintRows.build(rows)


def cycle_cut_rows(
    problem: OrchestrationProblem, chosen: set[int], column_of: dict[int, int], first_producer: bool = True
) -> list[tuple[float, dict[int, float]]]:
    """Valid inequalities that cut off the cyclic choice `chosen` (kernel indices).

    `column_of` maps each usable kernel to its solver column; `first_producer=False` gives the
    weaker set cut below instead.

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
    order, available = greedy_schedule(problem, chosen)
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

