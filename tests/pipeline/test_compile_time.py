"""What a cold compile does only once: each piece's program built and solved.

Counts, never timings: the planning of a zoo model rebuilt and re-solved every piece of the
model each lazy-costing round and each memory round, most of its compile time.
"""

import dataclasses
import math
from collections import Counter

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.config import KorchConfig
from korch_tvm.costing.cost_model import analytic_estimate
from korch_tvm.costing.measure import KernelCost
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.orchestration.plans import KernelChoice, OrchestrationProblem, problem_shape
from korch_tvm.pipeline import layout_plan
from korch_tvm.pipeline.layout_plan import Orchestrator, Priced, find_candidates


def two_layer_module(width: int = 32, layers: int = 2) -> tvm.IRModule:
    """Two dense + bias + ReLU + layer-norm blocks: several pieces, each with choices."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((16, width), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = x
            for _ in range(layers):
                weight = relax.const(rng.standard_normal((width, width)).astype("float32"))
                y = builder.emit(relax.op.nn.relu(relax.op.matmul(y, weight)))
                y = builder.emit(relax.op.nn.layer_norm(
                    y, relax.const(np.ones(width, "float32")),
                    relax.const(np.zeros(width, "float32")),
                    axes=[-1]))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def orchestrator(monkeypatch, memory_limit="none"):
    """An Orchestrator over two_layer_module's candidates, costs at the roofline, and a count
    of the pieces it hands orchestration_problems."""
    config = KorchConfig(memory_limit=memory_limit, max_subproblem_nodes=8)
    graph = PrimitiveGraph.from_module(lower_to_primitives(two_layer_module()))
    found = find_candidates(graph, config)
    keys = found.kernels.keys
    predicted = {key: analytic_estimate(module) for key, module in found.kernels.modules.items()}
    kept = list(range(len(found.candidates)))
    kept_kernels = {keys[i]: found.kernels.modules[keys[i]] for i in kept if keys[i] is not None}
    built = Counter()
    original = layout_plan.orchestration_problems

    def counted(graph, pieces, *args):
        built["pieces"] += len(pieces)
        return original(graph, pieces, *args)

    monkeypatch.setattr(layout_plan, "orchestration_problems", counted)
    costs = {key: KernelCost(predicted[key], "measured", 1) for key in kept_kernels}
    return Orchestrator(found, Priced(predicted, kept, kept_kernels, {}), config), costs, built


def test_a_piece_is_built_and_solved_again_only_when_its_costs_change(monkeypatch):
    solve, costs, built = orchestrator(monkeypatch)
    pieces = len(solve.found.pieces)
    assert pieces >= 2
    first = solve(costs)
    assert built["pieces"] == pieces
    again = solve(dict(costs))  # the same costs: nothing is built or solved again
    assert built["pieces"] == pieces and again[2] == first[2]
    # one kernel's cost changes: only the pieces holding a candidate of it are built again
    key = solve.found.kernels.keys[first[2][0]]
    holding = {p for p, piece in enumerate(solve.found.pieces)
               for i, candidate in enumerate(solve.found.candidates)
               if solve.found.kernels.keys[i] == key and candidate.nodes <= piece}
    solve({**costs, key: KernelCost(costs[key].seconds * 3, "measured", 1)})
    assert built["pieces"] == pieces + len(holding) < 2 * pieces


def test_the_plan_after_reuse_is_the_plan_solved_afresh(monkeypatch):
    solve, costs, _ = orchestrator(monkeypatch)
    key = solve.found.kernels.keys[solve(costs)[2][0]]
    changed = {**costs, key: KernelCost(costs[key].seconds * 5, "measured", 1)}
    reused = solve(changed)
    fresh, _, _ = orchestrator(monkeypatch)
    expected = fresh(changed)
    assert reused[2] == expected[2]
    assert math.isclose(sum(p.objective for p in reused[1]),
                        sum(p.objective for p in expected[1]))


def test_a_copy_of_a_piece_takes_its_plan_without_a_solve(monkeypatch):
    """two_layer_module's blocks are copies: four pieces, two problems up to numbering."""
    solve, costs, built = orchestrator(monkeypatch)
    solves = []
    original = layout_plan.solve_orchestration
    monkeypatch.setattr(layout_plan, "solve_orchestration",
                        lambda problem, **options: solves.append(problem)
                        or original(problem, **options))
    problems, plans, _ = solve(costs)
    assert built["pieces"] == len(problems) == 4 and len(solves) == 2
    assert [plan.chosen for plan in plans[:2]] == [plan.chosen for plan in plans[2:]]
    for first, copy in zip(problems[:2], problems[2:]):
        assert first.piece != copy.piece  # other primitives, the same program
        assert problem_shape(first.problem) == problem_shape(copy.problem)
    # the copies' kernels at other prices are another program, solved on its own
    key = solve.found.kernels.keys[problems[2].candidate_ids[plans[2].chosen[0]]]
    second = {p for p, problem in enumerate(problems)
              if key in {solve.found.kernels.keys[i] for i in problem.candidate_ids}}
    solve({**costs, key: KernelCost(costs[key].seconds * 3, "measured", 1)})
    assert len(solves) == 2 + len({problem_shape(problems[p].problem) for p in second})


def test_a_problem_shape_keeps_what_the_plan_depends_on():
    choice = KernelChoice(frozenset({10, 11}), frozenset({10}), frozenset({11}), 1e-3)
    problem = OrchestrationProblem(40, (KernelChoice(frozenset({10}), frozenset(),
                                                     frozenset({10}), 2e-3), choice),
                                   frozenset({11}), stock_plan=(0,))
    moved = OrchestrationProblem(40, tuple(
        KernelChoice(frozenset(n + 20 for n in k.nodes), frozenset(n + 20 for n in k.inputs),
                     frozenset(n + 20 for n in k.outputs), k.cost) for k in problem.kernels),
        frozenset({31}), stock_plan=(0,))
    assert problem_shape(moved) == problem_shape(problem)
    dearer = dataclasses.replace(problem, kernels=(problem.kernels[0],
                                                   dataclasses.replace(choice, cost=2e-3)))
    other_output = dataclasses.replace(problem, graph_outputs=frozenset({10, 11}))
    no_stock = dataclasses.replace(problem, stock_plan=())
    assert len({problem_shape(p) for p in (problem, dearer, other_output, no_stock)}) == 4


class Logged:
    """A tuning log that knows `seconds` of the modules given, by identity."""

    def __init__(self, seconds_by_module=None):
        self.seconds = seconds_by_module or {}

    def best_seconds(self, module):
        return self.seconds.get(id(module))

    def default_seconds_of(self, modules):
        return [self.best_seconds(module) for module in modules]


def test_lazy_costing_settles_the_plan_before_solving_within_memory(monkeypatch):
    """Solving within the memory limit re-solves a piece per round of kernels it leaves out,
    so lazy costing first settles the plan without the limit, then goes on within it; a
    compile whose log holds the plan's kernels solves once each way and measures nothing."""
    from korch_tvm.pipeline.korch_costs import cost_what_plans_need

    solve, costs, _ = orchestrator(monkeypatch, memory_limit="stock")
    priced, keys = solve.priced, solve.found.kernels.keys
    truth = {key: KernelCost(cost.seconds * 3, "measured", 0) for key, cost in costs.items()}
    calls, measured, new = [], set(), []

    def recording(costs, usable=None, *, within_memory=True):
        answer = solve(costs, usable, within_memory=within_memory)
        chosen = {keys[i] for i in answer[2] if keys[i] is not None}
        calls.append((within_memory, chosen <= measured))
        return answer

    def measure(modules):
        new.extend(key for key in modules if key not in measured)
        measured.update(modules)
        return {key: truth[key] for key in modules}

    config = KorchConfig(memory_limit="stock", max_subproblem_nodes=8)

    def compile_once(log):
        calls.clear()
        new.clear()
        return cost_what_plans_need(priced.kept_kernels, priced.predicted, set(), {},
                                    recording, keys, config, log, measure)

    best, first_choice = compile_once(Logged())
    limits = [within for within, _ in calls]
    first_limited = limits.index(True)
    # a cold log: no solve within the limit before the unlimited rounds, whose first plan is
    # not measured yet
    assert first_limited >= 3 and not calls[0][1]
    assert limits == [False] * first_limited + [True] * (len(limits) - first_limited)
    # the unlimited rounds end on a measured plan; the limited ones with one
    assert calls[first_limited - 1][1] and calls[-1][1]
    assert set(best) == measured and all(best[key] == truth[key] for key in measured)
    assert {keys[i] for i in first_choice if keys[i] is not None} <= measured
    logged = Logged({id(priced.kept_kernels[key]): truth[key].seconds for key in measured})
    _, again = compile_once(logged)
    # checked without the limit, then within it; that plan is the one round within it
    assert new == [] and [within for within, _ in calls] == [False, True, True]
    assert all(settled for _, settled in calls)
    assert again == first_choice


def test_a_layout_that_cannot_beat_a_plan_already_made_measures_nothing(monkeypatch):
    """Before the fusion groups of a layout are measured, its plan on the optimistic prices
    (predictions lowered by the lazy margin) is compared with the plan another layout made:
    above it, the layout cannot win and nothing of it is measured; below, the fusion groups
    are measured and the plan compared again on predictions they calibrated; below both, it
    is costed as without the comparison."""
    from korch_tvm.pipeline.korch_costs import cost_what_plans_need

    solve, costs, _ = orchestrator(monkeypatch)
    priced, keys = solve.priced, solve.found.kernels.keys
    stock = {keys[i] for i in priced.kept
             if solve.found.candidates[i].is_stock and keys[i] is not None}
    truth = {key: KernelCost(cost.seconds * 3, "measured", 0) for key, cost in costs.items()}
    measured = []

    def measure(modules):
        measured.extend(modules)
        return {key: truth[key] for key in modules}

    def cost(beat_seconds):
        measured.clear()
        return cost_what_plans_need(priced.kept_kernels, priced.predicted, stock, {}, solve,
                                    keys, KorchConfig(max_subproblem_nodes=8), Logged(), measure,
                                    beat_seconds=beat_seconds)

    best, first_choice = cost(None)
    everything = sorted(measured)
    assert stock and stock <= set(everything)
    modelled = sum(truth[keys[i]].seconds for i in first_choice if keys[i] is not None)
    optimistic = sum(priced.predicted[keys[i]] for i in first_choice
                     if keys[i] is not None) / (1 + KorchConfig().lazy_margin)
    # every kernel costs 3x its prediction: the optimistic plan models under a third of it
    assert optimistic < modelled / 3
    assert cost(modelled) == (best, first_choice) and sorted(measured) == everything
    assert cost(modelled / 100) is None and measured == []
    # above the first bound, below the second: calibrated by the groups, kernels cost 3x more
    assert optimistic < modelled / 2 and cost(modelled / 2) is None
    assert sorted(measured) == sorted(stock)


def test_kernels_built_for_one_graph_are_taken_for_another(monkeypatch):
    """The regions of a model repeat its candidates: with one `built` memo a second graph of
    the same model builds no kernel, a part of it (one layer) fewer than alone, and a model of
    other shapes as many; in each its keys and kernels are those it would build alone."""
    from korch_tvm.kernels import fused
    from korch_tvm.support.memo import KeyedMemo

    config = KorchConfig(memory_limit="none", max_subproblem_nodes=8)
    built_count = Counter()
    original = fused.candidate_kernel

    def counted(graph, nodes, block=None):
        built_count["kernels"] += 1
        return original(graph, nodes, block)

    monkeypatch.setattr(fused, "candidate_kernel", counted)

    def found(built=None, **shape):
        built_count.clear()
        graph = PrimitiveGraph.from_module(lower_to_primitives(two_layer_module(**shape)))
        return find_candidates(graph, config, built), built_count["kernels"]

    whole, whole_built = found()
    assert whole_built == len(whole.kernels.modules) > 5
    builds, new_kernels = {}, {}
    for name, shape in (("again", {}), ("part", {"layers": 1}), ("other", {"width": 48})):
        memo = KeyedMemo()
        found(memo)
        alone, builds[name + " alone"] = found(**shape)
        shared, builds[name] = found(memo, **shape)
        assert shared.kernels.keys == alone.kernels.keys
        assert all(tvm_ffi.structural_equal(shared.kernels.modules[key], module)
                   for key, module in alone.kernels.modules.items())
        new_kernels[name] = len(set(alone.kernels.modules) - set(whole.kernels.modules))
    assert builds["again"] == 0 and builds["again alone"] == whole_built
    assert builds["part"] == new_kernels["part"] < builds["part alone"]
    # at another width only the kernels on the layer norm's per-row (16 x 1) variance are equal
    assert builds["other"] == new_kernels["other"] == builds["other alone"] - 3
