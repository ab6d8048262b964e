"""From candidates and costs to orchestration problems, and from solved plans to kernel groups.

The primitive graph is cut into convex pieces (candidates/partition.py); each piece is one binary
integer program over the candidates that lie inside it. A piece's required outputs are its graph
outputs and every primitive a later piece reads, so the pieces' plans concatenate into one valid
plan.

Alternatives (graph/alternatives.py) enter as tensor classes: a kernel's nodes, inputs and
outputs are given to the program as classes (an offered node as the original it stands for), so
an input is supplied by any chosen kernel that outputs its class and the formulation itself
needs no change. With no alternatives every node is its own class: the program is today's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..costing.cost_model import prune_candidates
from ..costing.failed_costs import is_failed
from ..graph.alternatives import alternative_nodes, class_map, in_classes
from .solver import KernelChoice, OrchestrationProblem, Plan
from .substitution_report import program_size, substitution_report


# An opaque primitive (a binding that is no call_tir) always runs alone and always runs, so its
# cost is the same in every plan and cannot change the choice.
_OPAQUE_COST = 0.0


def _kernel_seconds(key: str | None, costs: Mapping[str, object], is_stock: bool,
                    call_seconds: float = 0.0) -> float:
    """The price a kernel enters the program at, its cost and the VM's `call_seconds` of
    calling it (costing/call_overhead.py); inf: never chosen.

    A failed kernel (costing/failed_costs.py: it did not build or its run died) is kept out of
    every plan unless it is a stock FuseOps group: the stock build builds those anyway, and the
    stock plan must stay feasible. A stock group then costs what costing put in for it, its
    prediction; one with no finite cost at all (a caller that skipped costing) is priced by
    `_stand_in_seconds` in `orchestration_problems`, never by a placeholder.
    """
    if key is None:
        return _OPAQUE_COST
    cost = costs[key]
    if is_failed(cost) and not is_stock:
        return math.inf
    return float(cost.seconds) + call_seconds


def _stand_in_seconds(choices: Sequence[KernelChoice], size: int) -> float:
    """For a stock group with no finite cost: `size` primitives at the median cost per
    primitive of the piece's finitely costed kernels (the scale of its neighbours)."""
    per_primitive = sorted(c.cost / len(c.nodes) for c in choices
                           if math.isfinite(c.cost) and c.cost > 0)
    assert per_primitive, "no kernel of this piece has a finite cost: it was never costed"
    return size * per_primitive[len(per_primitive) // 2]


@dataclass(frozen=True)
class Subproblem:
    piece: frozenset[int]              # primitive ids of this piece
    candidate_ids: tuple[int, ...]     # global candidate index of each KernelChoice
    problem: OrchestrationProblem


def prune_by_prediction(candidates, key_of_candidate: Sequence[str],
                        predicted: Mapping[str, float], margin: float) -> list[int]:
    """Indices of candidates worth costing for real.

    Uses predictions only (never measured values), so a second compile with the same log and
    cost model keeps exactly the same candidates and therefore measures nothing new. TVM's own
    fusion groups are always kept: the stock plan must stay feasible and be costed for real.
    """
    node_sets = [candidate.nodes for candidate in candidates]
    costs = [_OPAQUE_COST if key is None else predicted[key] for key in key_of_candidate]
    kept = set(prune_candidates(node_sets, costs, margin))
    kept |= {i for i, candidate in enumerate(candidates) if candidate.is_stock}
    return sorted(kept)


def orchestration_problems(graph, pieces: Sequence[frozenset[int]], candidates, kept: Sequence[int],
                           key_of_candidate: Sequence[str], costs: Mapping[str, object],
                           call_seconds: float = 0.0) -> list[Subproblem]:
    """One OrchestrationProblem per piece, over the kept candidates inside it, each kernel
    priced with the VM's `call_seconds` of calling it."""
    problems = []
    classes = class_map(graph.alternatives)
    offered = alternative_nodes(graph.alternatives)
    for piece in pieces:
        ids = tuple(i for i in kept if candidates[i].nodes <= piece)
        required = frozenset(
            node for node in piece
            if node in graph.outputs or any(c not in piece for c in graph.nodes[node].consumers))
        choices = [
            KernelChoice(nodes=in_classes(candidates[i].nodes, classes),
                         inputs=in_classes(frozenset(candidates[i].inputs) & piece, classes),
                         outputs=in_classes(candidates[i].outputs, classes),
                         cost=_kernel_seconds(key_of_candidate[i], costs,
                                              candidates[i].is_stock, call_seconds))
            for i in ids]
        choices = tuple(
            dataclasses.replace(choice, cost=_stand_in_seconds(choices, len(choice.nodes)))
            if candidates[i].is_stock and not math.isfinite(choice.cost) else choice
            for i, choice in zip(ids, choices))
        stock = tuple(local for local, i in enumerate(ids) if candidates[i].is_stock)
        if sorted(node for local in stock for node in choices[local].nodes) \
                != sorted(piece - offered):
            stock = ()  # a stock group straddles the cut: no stock plan for this piece
        problems.append(Subproblem(piece, ids, OrchestrationProblem(
            num_nodes=len(graph.nodes), kernels=choices, graph_outputs=required,
            stock_plan=stock,
            offered=frozenset(local for local, i in enumerate(ids)
                              if candidates[i].nodes & offered))))
    return problems


def plan_groups(problems: Sequence[Subproblem], plans: Sequence[Plan]) -> list[tuple[int, ...]]:
    """Global candidate ids of every chosen kernel, in execution order across pieces."""
    chosen = []
    for subproblem, plan in zip(problems, plans):
        if not plan.chosen:
            raise AssertionError(f"no plan for a piece of {len(subproblem.piece)} primitives "
                                 f"(solver status {plan.status})")
        chosen += [subproblem.candidate_ids[local] for local in plan.chosen]
    return chosen


def plan_report(graph, candidates, kept, problems, plans, chosen, key_of_candidate, costs,
                in_model_factors: Mapping[str, float] | None = None, storage=None,
                call_seconds: float = 0.0) -> dict:
    """What the solver did, per piece and in total; JSON-friendly. A kernel's "ms" is the cost
    the solver used (its isolated cost times its in-model factor) without the VM's
    `call_seconds` every price carries, "isolated_ms" the isolated cost."""
    computed = [node for i in chosen for node in candidates[i].nodes]
    priced = {i: choice.cost - call_seconds for p in problems
              for i, choice in zip(p.candidate_ids, p.problem.kernels)}
    stock_parts = [plan.stock_objective for plan in plans]
    stock_ms = (sum(stock_parts) * 1e3 if all(s is not None for s in stock_parts) else None)
    return {
        "primitives": len(graph.nodes),
        "candidates": len(candidates),
        "pruned": len(candidates) - len(kept),
        "subproblems": len(problems),
        "largest_subproblem": max((len(p.piece) for p in problems), default=0),
        "kernels_chosen": len(chosen),
        "recomputed_primitives": len(computed) - len(set(computed)),
        # activation storage Relax will plan for this plan and the stock plan
        # (orchestration/memory_plan.py)
        "planned_storage_mb": None if storage is None else storage.report(problems, plans),
        "modelled_ms": sum(plan.objective for plan in plans) * 1e3,
        "stock_modelled_ms": stock_ms,
        "solver_status": _overall_status(plans),
        "solver": [
            {"primitives": len(p.piece), "candidates": len(p.candidate_ids),
             "status": plan.status, "objective_ms": _finite_or_none(plan.objective * 1e3),
             "best_bound_ms": _finite_or_none(plan.best_bound * 1e3),
             "gap": _finite_or_none(plan.gap), "nodes": plan.nodes,
             "seconds": round(plan.seconds, 3), "cycle_cuts": plan.cycle_cuts,
             "warm_start": plan.warm_start, **program_size(p.problem)}
            for p, plan in zip(problems, plans)],
        # alternatives found, chosen and what each saved (orchestration/substitution_report.py)
        "substitutions": substitution_report(graph, candidates, problems, plans, chosen),
        # chosen kernels whose measurement failed: in the objective at their prediction
        "failed_kernels": sum(1 for i in chosen if key_of_candidate[i] is not None
                              and is_failed(costs[key_of_candidate[i]])),
        "kernels": [_kernel_entry(graph, candidates[i], key_of_candidate[i], costs,
                                  (in_model_factors or {}).get(key_of_candidate[i], 1.0),
                                  priced.get(i))
                    for i in chosen],
    }


def _kernel_entry(graph, candidate, key, costs, in_model_factor: float,
                  priced: float | None) -> dict:
    """One chosen kernel: its primitives, their ops, and its cost with where it came from. A
    failed kernel reports the price it entered the objective at (`priced`) and what that was."""
    cost = costs.get(key) if key is not None else None
    entry = {
        "primitives": sorted(candidate.nodes),
        "ops": [graph.nodes[i].op_name.removeprefix("relax.") for i in sorted(candidate.nodes)],
        "key": key,
        "ms": None if cost is None else _finite_or_none(cost.seconds * in_model_factor * 1e3),
        "isolated_ms": None if cost is None else _finite_or_none(cost.seconds * 1e3),
        "cost_source": "opaque" if cost is None else cost.source,
        "stock_group": bool(candidate.is_stock),
    }
    if cost is not None and is_failed(cost) and priced is not None:
        entry.update(ms=_finite_or_none(priced * 1e3),
                     isolated_ms=_finite_or_none(priced / in_model_factor * 1e3),
                     cost_source="failed",
                     costed_as="prediction" if math.isfinite(cost.seconds) else "stand-in",
                     error=cost.error)
    return entry


def _finite_or_none(value: float) -> float | None:
    """JSON has no infinities: unbounded or missing values are reported as null."""
    return value if math.isfinite(value) else None


def _overall_status(plans: Sequence[Plan]) -> str:
    statuses = {plan.status for plan in plans}
    if statuses <= {"optimal"}:
        return "optimal"
    return ",".join(sorted(statuses - {"optimal"}))
