"""KorchPass: fission -> primitive graph -> candidates -> costing -> orchestration -> rewrite.

Each stage takes the previous stage's value and returns a new one; this file only composes
them, so reading `run_korch` tells the whole story of a Korch compile.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import tvm

from .candidates import KernelRules, enumerate_candidates
from .config import KorchConfig
from .cost_model import default_predictor
from .costing import (default_schedule_costs, measure_costs, open_tuning_log, summarize,
                      tune_costs)
from .fission import lower_to_primitives, lowering_stats
from .kernels import distinct_kernels
from .orchestration import solve_orchestration
from .partition import partition_graph
from .planning import orchestration_problems, plan_groups, plan_report, prune_by_prediction
from .primitive_graph import PrimitiveGraph
from .rewrite import rewrite_with_plan, scheduled_kernel_count
from .target import parse_target

logger = logging.getLogger("korch_tvm.passes")


class _StageClock:
    """Seconds spent per stage, for the report."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._last, 3)
        self._last = now


def run_korch(mod: tvm.IRModule, config: KorchConfig):
    """Orchestrate `main` of `mod`; returns (module ready for tvm.compile, report dict)."""
    target = parse_target(config.target)
    config = config.with_changes(target=target)
    clock = _StageClock()

    lowered = lower_to_primitives(mod)
    graph = PrimitiveGraph.from_module(lowered)
    clock.lap("lowering")

    rules = KernelRules(max_kernel_size=config.max_kernel_size)
    pieces = partition_graph(graph, config.max_subproblem_nodes)
    candidates = [candidate for piece in pieces
                  for candidate in enumerate_candidates(graph, rules, node_subset=piece)]
    kernels = distinct_kernels(graph, candidates)
    logger.info("%d primitives, %d candidates, %d distinct kernels, %d subproblems",
                len(graph.nodes), len(candidates), len(kernels.modules), len(pieces))
    clock.lap("candidates")

    tuning_log = open_tuning_log(config)
    predict = default_predictor(tuning_log, target)
    predicted = {key: predict(module) for key, module in kernels.modules.items()}
    kept = prune_by_prediction(candidates, kernels.keys, predicted, config.prune_margin)
    kept_kernels = {kernels.keys[i]: kernels.modules[kernels.keys[i]] for i in kept
                    if kernels.keys[i] is not None}
    clock.lap("prediction")

    def solve(costs):
        problems = orchestration_problems(graph, pieces, candidates, kept, kernels.keys, costs)
        plans = [solve_orchestration(problem.problem, time_limit=config.solver_time_limit)
                 for problem in problems]
        return problems, plans, plan_groups(problems, plans)

    costs = measure_costs(kept_kernels, config, tuning_log, predictor=predict)
    clock.lap("measurement")
    if config.trials > 0:
        # Tune where the time goes: the kernels of the plan chosen from default-schedule costs,
        # by their share of that plan's latency (the same plan on every compile, see costing).
        defaults = default_schedule_costs(kept_kernels, costs, tuning_log)
        _, _, first_choice = solve(defaults)
        shares = Counter()
        for i in first_choice:
            if kernels.keys[i] is not None:
                shares[kernels.keys[i]] += defaults[kernels.keys[i]].seconds
        remaining = None if config.time_budget is None else max(
            0.0, config.time_budget - clock.seconds["measurement"])
        costs = tune_costs(kept_kernels, shares, costs, config.with_changes(time_budget=remaining),
                           tuning_log)
        clock.lap("tuning")
    problems, plans, chosen = solve(costs)
    clock.lap("orchestration")

    optimized = rewrite_with_plan(graph, [candidates[i].nodes for i in chosen],
                                  tuning_log.database, target)
    clock.lap("rewrite")

    tuned, total = scheduled_kernel_count(optimized)
    report = {
        "lowering": lowering_stats(mod, lowered),
        "tuning": summarize(costs.values()),
        "plan": plan_report(graph, candidates, kept, problems, plans, chosen, kernels.keys,
                            costs),
        "kernels_with_tuned_schedule": f"{tuned}/{total}",
        "stage_seconds": clock.seconds,
    }
    report["modelled_ms"] = report["plan"]["modelled_ms"]
    return optimized, report


@tvm.transform.module_pass(opt_level=0, name="KorchPass")
class KorchPass:
    """Use in place of FuseOps/FuseTIR: rebuild `main` as the optimal set of tuned kernels.

    The result goes straight to `tvm.compile` (whose pipelines do not re-fuse). The report of
    the last run is kept in `last_report`.
    """

    def __init__(self, config: KorchConfig | None = None):
        self.config = config or KorchConfig()
        self.last_report: dict | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        optimized, self.last_report = run_korch(mod, self.config)
        return optimized
