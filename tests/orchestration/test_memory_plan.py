"""Relax's storage planning replayed on a plan, and pieces put back on their stock plan."""

import dataclasses

import numpy as np
import pytest
from tvm import relax

from conftest import MODELS, REPO, host_has_shipped_logs
from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.costing.measure import KernelCost
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.orchestration.memory_plan import (Step, StorageModel, kernel_workspace_bytes,
                                                 node_bytes, planned_storage_bytes)
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups
from korch_tvm.orchestration.solver import solve_orchestration


def test_blocks_are_reused_grown_or_added_like_relaxs_planner():
    sizes = [100, 50, 80, 400, 10_000, 7]
    steps = [
        Step(frozenset(), frozenset({0})),  # block A (100)
        Step(frozenset({0}), frozenset({1})),  # block B (50): A is still read; then A is free
        Step(frozenset({1}), frozenset({2})),  # 80 fits in A; then B is free
        Step(frozenset({2}), frozenset({3})),  # 400: B (50) is the largest smaller block, grown
        Step(frozenset({3}), frozenset({4})),  # 10000: A (100) is under 1/16 of it: new block
        Step(frozenset({4}), frozenset({5})),  # a graph output takes no block
    ]
    assert planned_storage_bytes(steps, sizes, frozenset({5})) == 100 + 400 + 10_000


def test_a_view_shares_its_inputs_block():
    sizes = [1000, 1000, 1000, 4]
    steps = [Step(frozenset(), frozenset({0})),
             Step(frozenset({0}), frozenset({1}), view=True),  # a reshape of 0: 0's block
             Step(frozenset({0, 1}), frozenset({2})),  # reads both: one block is busy
             Step(frozenset({2}), frozenset({3}))]
    assert planned_storage_bytes(steps, sizes, frozenset({3})) == 2000
    copied = [steps[0], Step(frozenset({0}), frozenset({1})), *steps[2:]]
    assert planned_storage_bytes(copied, sizes, frozenset({3})) == 3000  # two blocks are busy


def _split_beats_fused(leave_out=()):
    """0 -> 1 -> 2 of 1000, 1000 and 10 floats; two kernels are faster than the stock plan
    that fuses all three, but store a 1000-float intermediate. `leave_out`: candidate ids the
    problem goes without."""
    graph = PrimitiveGraph.from_edges(3, [(0, 1), (1, 2)], outputs=[2])
    nodes = tuple(dataclasses.replace(node, out_shapes=((size,),), out_dtypes=("float32",))
                  for node, size in zip(graph.nodes, (1000, 1000, 10)))
    graph = dataclasses.replace(graph, nodes=nodes)
    candidates = [dataclasses.replace(c, is_stock=len(c.nodes) == 3)
                  for c in enumerate_candidates(graph, KernelRules(max_kernel_size=3))]
    keys = [f"k{i}" for i in range(len(candidates))]
    costs = {key: KernelCost(1.0 if len(c.nodes) == 3 else 0.4, "measured", 0)
             for key, c in zip(keys, candidates)}
    usable = [i for i in range(len(candidates)) if i not in leave_out]
    problems = orchestration_problems(graph, [frozenset(range(3))], candidates, usable, keys,
                                      costs)
    return graph, candidates, problems


def _storage_model(graph, candidates, outputs=None) -> StorageModel:
    steps = tuple(Step(frozenset(c.inputs), frozenset(c.outputs)) for c in candidates)
    return StorageModel(node_bytes(graph), frozenset(outputs or graph.outputs), steps)


def test_a_plan_storing_more_than_stock_goes_back_to_the_stock_plan():
    graph, candidates, problems = _split_beats_fused()
    plans = [solve_orchestration(p.problem) for p in problems]
    assert plans[0].objective == pytest.approx(0.8) and len(plans[0].chosen) == 2

    storage = _storage_model(graph, candidates)
    assert storage.report(problems, plans) == {"korch": 0.004, "stock": 0.0,
                                               "korch_workspace": 0.0, "stock_workspace": 0.0,
                                               "pieces_on_stock_plan": 0}
    kept = storage.within_stock(problems, plans)
    assert storage.report(problems, kept)["pieces_on_stock_plan"] == 1
    assert kept[0].status == "memory_limited"
    assert kept[0].objective == pytest.approx(1.0) == kept[0].stock_objective
    assert kept[0].gap == pytest.approx(0.2)  # against the unlimited optimum, still the bound
    assert [candidates[i].nodes for i in plan_groups(problems, kept)] == [frozenset({0, 1, 2})]


def test_a_plan_within_stock_storage_is_kept():
    graph, candidates, problems = _split_beats_fused()
    plans = [solve_orchestration(p.problem) for p in problems]
    assert [candidates[i].nodes for i in plan_groups(problems, plans)] == \
        [frozenset({0, 1}), frozenset({2})]
    storage = _storage_model(graph, candidates, outputs={1, 2})  # 1 takes no block now
    assert storage.within_stock(problems, plans) == plans


def _with_workspaces(graph, candidates, workspace_of_split) -> StorageModel:
    """Storage alike for both plans (1 and 2 are outputs); the split plan's first kernel keeps
    `workspace_of_split` bytes of its own, every other kernel 100."""
    steps = tuple(Step(frozenset(c.inputs), frozenset(c.outputs),
                       workspace=workspace_of_split if c.nodes == frozenset({0, 1}) else 100)
                  for c in candidates)
    return StorageModel(node_bytes(graph), frozenset({1, 2}), steps)


def test_a_kernel_whose_workspace_the_stock_plan_has_no_room_for_is_left_out():
    graph, candidates, problems = _split_beats_fused()
    plans = [solve_orchestration(p.problem) for p in problems]
    split = next(i for i, c in enumerate(candidates) if c.nodes == frozenset({0, 1}))
    storage = _with_workspaces(graph, candidates, 8000)
    assert storage.report(problems, plans)["korch_workspace"] == 0.008
    assert storage.report(problems, plans)["stock_workspace"] == 0.0  # 100 bytes, rounded
    assert storage.within_stock(problems, plans) == plans  # storage alone is within stock's
    assert storage.left_out_for_memory(problems, plans) == {split}  # not the piece's {2}


def test_kernels_are_left_out_until_the_storage_fits():
    """Every split of 0 -> 1 -> 2 stores a 1000-float intermediate: they are left out, round
    by round, until only the stock plan is left, as the planner solves."""
    graph, candidates, _ = _split_beats_fused()
    storage = _storage_model(graph, candidates)
    rounds = []

    def solve(left_out=frozenset()):
        assert not any(candidates[i].is_stock for i in left_out)
        rounds.append(left_out)
        _, _, problems = _split_beats_fused(leave_out=left_out)
        return problems, [solve_orchestration(p.problem) for p in problems]

    problems, plans = storage.cheapest_within_stock(solve)
    assert [candidates[i].nodes for i in plan_groups(problems, plans)] == [frozenset({0, 1, 2})]
    assert storage.report(problems, plans)["korch"] == 0.0
    assert len(rounds) > 2 and all(a < b for a, b in zip(rounds, rounds[1:]))  # ever narrower


def test_a_workspace_no_larger_than_the_stock_plans_is_always_room_enough():
    graph, candidates, problems = _split_beats_fused()
    plans = [solve_orchestration(p.problem) for p in problems]
    storage = _with_workspaces(graph, candidates, 100)
    assert storage.left_out_for_memory(problems, plans) == set()


def conv_concat_module():
    """relu(conv(x)) and x concatenated on channels, and x minus its row means."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(op.nn.conv2d(x, relax.const(rng.standard_normal((4, 4, 1, 1))
                                                       .astype("float32"))))
            joined = bb.emit(op.concat([op.nn.relu(conv), x], axis=1))
            centred = bb.emit(op.subtract(x, op.mean(x, axis=[3], keepdims=True)))
            out = bb.emit_output(relax.Tuple([joined, centred]))
        bb.emit_func_output(out)
    return bb.get()


def test_kernel_workspace_counts_what_no_schedule_can_tile_away():
    from korch_tvm.kernels.fused import distinct_kernels
    from korch_tvm.lowering.fission import lower_to_primitives

    graph = PrimitiveGraph.from_module(lower_to_primitives(conv_concat_module()))
    candidates = enumerate_candidates(graph)
    kernels = distinct_kernels(graph, candidates)
    workspace = {}
    for candidate, key in zip(candidates, kernels.keys):
        ops = tuple(sorted(graph.nodes[n].op_name.split(".")[-1] for n in candidate.nodes))
        workspace[ops] = kernel_workspace_bytes(kernels.modules[key]["main"])
    conv = 4 * 8 * 8 * 4  # the convolution's output, bytes
    assert workspace[("conv2d", "relu")] == 0  # an epilogue: computed tile by tile
    assert workspace[("concat", "conv2d", "relu")] == conv  # read within a wider domain
    assert workspace[("concat", "relu")] == 0  # injective: inlined
    assert workspace[("mean", "subtract")] == 4 * 8 * 4  # the means, read broadcast
    assert workspace[("conv2d",)] == workspace[("mean",)] == 0


def test_unknown_memory_limit_is_a_clear_error():
    from korch_tvm import KorchConfig
    from korch_tvm.errors import KorchError
    from korch_tvm.pipeline.korch import plan_korch

    # refused where the config is made, before any planning
    with pytest.raises(KorchError, match="--memory-limit must be one of stock, none, got 'tight'"):
        plan_korch(None, KorchConfig(memory_limit="tight"))


@pytest.mark.skipif(not host_has_shipped_logs(),
                    reason="the shipped logs are for another CPU (their tag differs from this one)")
@pytest.mark.parametrize("name", ["bert_layer.onnx", "segformer_block.onnx"])
def test_replay_matches_the_storage_relax_plans(name, tmp_path):
    """The model's number is what Relax's planner allocates for the rewritten plan."""
    import re
    import shutil

    import tvm
    from korch_tvm import KorchConfig
    from korch_tvm.backend.target import parse_target
    from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
    from korch_tvm.pipeline.korch import plan_korch, rewrite_plan

    shutil.copytree(REPO / "tuning_logs", tmp_path / "logs")
    target = parse_target("llvm")  # the host's tag, whose records the shipped logs hold
    plan = plan_korch(import_onnx(load_onnx(str(MODELS / name))),
                      KorchConfig(target=target, tuning_logs=str(tmp_path / "logs")))
    module, report = rewrite_plan(plan)
    with target:
        main = tvm.relax.get_pipeline("default")(module)["main"].script()
    allocated = sum(int(size) for size in re.findall(r"alloc_storage\(R\.shape\(\[(\d+)\]\)", main))
    outputs = sum(node_bytes(plan.graph)[node] for node in plan.graph.outputs)  # own blocks
    modelled = report["plan"]["planned_storage_mb"]["korch"] * 1e6
    assert modelled == pytest.approx(allocated - outputs, abs=500)  # the report rounds to 1 kB
