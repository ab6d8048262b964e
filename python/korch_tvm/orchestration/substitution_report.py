"""What the substitutions did: the sites found, those the plan chose, what each saved; the
program's size.

"Saved" is the plan against the best plan without that one alternative: the site's piece solved
again with every kernel holding one of the alternative's nodes left out, minus the piece's plan.
It is modelled time under the same cost table, so it counts what the alternative lets the other
kernels do too (a fusion it opens), which the kernels' own costs alone would miss; one solve of
one piece per chosen site keeps it cheap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..graph.alternatives import alternative_nodes
from .formulation import orchestration_rows
from .solver import Plan, solve_orchestration


def program_size(problem) -> dict:
    """Columns (usable kernels) and rows of the piece's program as the solver builds it (before
    cycle cuts)."""
    usable = [k for k, kernel in enumerate(problem.kernels) if math.isfinite(kernel.cost)]
    rows = orchestration_rows(problem, usable)
    return {"columns": len(usable), "rows": None if rows is None else rows.count}


def substitution_report(graph, candidates, problems, plans: Sequence[Plan], chosen,
                        time_limit: float = 10.0) -> dict:
    """The sites found (rule, the primitives they replace, whether a piece offered them), those
    the plan uses, and each one's modelled saving in ms (see the module docstring)."""
    chosen_nodes = [candidates[i].nodes for i in chosen]
    in_piece = {node: k for k, p in enumerate(problems) for node in p.piece}
    sites = []
    for site in graph.alternatives:
        used = any(nodes & site.nodes for nodes in chosen_nodes)
        entry = {
            "rule": site.rule,
            "replaces": [graph.nodes[i].name for i in site.replaced],
            "primitives": len(site.nodes),
            "offered": all(node in in_piece for node in site.nodes),
            "chosen": used,
        }
        if used:
            piece = in_piece[min(site.nodes)]
            entry["saved_ms"] = _saved_ms(problems[piece], plans[piece], candidates,
                                          site.nodes, time_limit)
        sites.append(entry)
    offered = alternative_nodes(graph.alternatives)
    return {
        "found": len(sites),
        "chosen": sum(1 for s in sites if s["chosen"]),
        "alternative_primitives": len(offered),
        "sites": sites,
    }


def _saved_ms(subproblem, plan: Plan, candidates, site_nodes: frozenset[int],
              time_limit: float) -> float | None:
    """The piece's cost without the alternative minus with it, in ms (None: not comparable,
    e.g. the solve without it found no plan)."""
    problem = subproblem.problem  # its kernels are in classes: tell them apart by candidate
    holding = {local for local, i in enumerate(subproblem.candidate_ids)
               if candidates[i].nodes & site_nodes}
    without = dataclasses.replace(problem, kernels=tuple(
        dataclasses.replace(kernel, cost=math.inf) if local in holding else kernel
        for local, kernel in enumerate(problem.kernels)))
    other = solve_orchestration(without, time_limit=time_limit)
    if not (math.isfinite(other.objective) and math.isfinite(plan.objective)):
        return None
    return round((other.objective - plan.objective) * 1e3, 6)
