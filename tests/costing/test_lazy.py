"""Lazy costing: measure only what a plan chooses, and still find the fully costed optimum."""

import math
import random

import pytest

from korch_tvm.costing.lazy import (CALIBRATION_STEP, calibrated_predictions, calibration,
                                    solve_lazily)
from korch_tvm.costing.failed_costs import is_failed
from korch_tvm.costing.measure import KernelCost

HALF_STEP = math.exp(CALIBRATION_STEP / 2) - 1  # calibration factors lie on a 5 % grid


def cheapest_plan(plans, stock=frozenset()):
    """A stand-in solver: the plan (a set of kernel keys) of least total cost; a failed
    kernel costs infinity unless it is in `stock`, as in the orchestration programs."""
    def cost(costs, plan):
        return sum(math.inf if is_failed(costs[key]) and key not in stock
                   else costs[key].seconds for key in plan)

    def solve(costs):
        best = min(plans, key=lambda plan: (cost(costs, plan), sorted(plan)))
        return best, best, cost(costs, best)
    return solve


def measuring(true_seconds, calls):
    def measure(keys):
        calls.append(list(keys))
        return {key: KernelCost(true_seconds[key], "measured", 1) for key in keys}
    return measure


def random_instance(rng, kernels=60, plans=200):
    true = {f"k{i}": rng.uniform(1e-4, 1e-2) for i in range(kernels)}
    alternatives = [frozenset(rng.sample(sorted(true), rng.randint(2, 6))) for _ in range(plans)]
    return true, alternatives


@pytest.mark.parametrize("seed", range(20))
def test_finds_the_fully_costed_optimum_when_predictions_err_within_the_margin(seed):
    rng = random.Random(seed)
    true, plans = random_instance(rng)
    predicted = {key: seconds * rng.uniform(0.8, 1.2) for key, seconds in true.items()}
    calls = []
    result = solve_lazily(cheapest_plan(plans), predicted, {}, measuring(true, calls), margin=0.5)
    full_optimum = min(sum(true[key] for key in plan) for plan in plans)
    chosen = result.solution
    assert all(key in result.known for key in chosen)  # the plan is measured, not predicted
    assert sum(true[key] for key in chosen) == pytest.approx(full_optimum, rel=1e-12)
    measured = sum(len(batch) for batch in calls)
    assert measured == len(result.known) < len(true)  # each kernel at most once, never all
    # a second run on what the first one measured measures nothing and picks the same plan
    again_calls = []
    again = solve_lazily(cheapest_plan(plans), predicted, result.known,
                         measuring(true, again_calls), margin=0.5)
    assert again_calls == [] and again.solution == chosen and again.rounds == 1


@pytest.mark.parametrize("seed", range(10))
def test_a_library_ceiling_is_measured_past_only_where_a_plan_wants_tvm_below_it(seed):
    """Half the kernels have a library call's time (a ceiling: measuring TVM's kernel keeps
    the cheaper of the two). The plan is still the fully costed optimum, a kernel whose
    ceiling lies under every optimistic price it can have is never measured, and a second run
    on what the first measured measures nothing."""
    rng = random.Random(seed)
    true, plans = random_instance(rng)
    ceilings = {key: KernelCost(true[key] * rng.uniform(0.2, 2.0), "measured", 1,
                                implementation="openblas.sgemm") for key in sorted(true)[::2]}
    best = {key: min(seconds, ceilings[key].seconds) if key in ceilings else seconds
            for key, seconds in true.items()}
    predicted = {key: seconds * rng.uniform(0.8, 1.2) for key, seconds in true.items()}
    calls = []
    result = solve_lazily(cheapest_plan(plans), predicted, {}, measuring(best, calls),
                          margin=0.5, ceilings=ceilings)
    chosen = result.solution
    assert all(key in result.known or key in ceilings for key in chosen)
    full_optimum = min(sum(best[key] for key in plan) for plan in plans)
    assert sum(best[key] for key in chosen) == pytest.approx(full_optimum, rel=1e-12)
    # optimistic prices are at least 0.8 x (calibration >= 0.8) / 1.5 = 0.43 x the true time
    below_every_price = {key for key, cost in ceilings.items() if cost.seconds < 0.42 * true[key]}
    measured = [key for batch in calls for key in batch]
    assert not below_every_price & set(measured) and len(measured) == len(set(measured))
    again_calls = []
    again = solve_lazily(cheapest_plan(plans), predicted, result.known,
                         measuring(best, again_calls), margin=0.5, ceilings=ceilings)
    assert again_calls == [] and again.solution == chosen


def test_calibration_rescales_a_roofline_that_is_ten_times_too_low():
    rng = random.Random(0)
    true, plans = random_instance(rng)
    roofline = {key: seconds / 10 for key, seconds in true.items()}
    known = {key: KernelCost(true[key], "measured", 1) for key in sorted(true)[:5]}
    assert calibration(known, roofline) == pytest.approx(10.0, rel=HALF_STEP)
    assert calibration(dict(list(known.items())[:2]), roofline) == 1.0  # too few to tell
    calls = []
    solve_lazily(cheapest_plan(plans), roofline, known, measuring(true, calls), 0.5)
    assert sum(len(batch) for batch in calls) < len(true) - len(known)


def test_siblings_sharing_the_heavy_primitive_correct_each_other():
    # two variants of one big matmul "mm" (plain, with its epilogue fused) that the model
    # underrates 4x, and a memory-bound kernel it rates right
    predicted = {"mm": 1.0, "mm+add": 1.1, "add": 0.5, "relu": 0.5, "exp": 0.5}
    known = {"mm": KernelCost(4.0, "measured", 1), "add": KernelCost(0.5, "measured", 1),
             "relu": KernelCost(0.5, "measured", 1)}
    anchors = {"mm": {"matmul0"}, "mm+add": {"matmul0"}, "add": {"add0"}, "relu": {"relu0"},
               "exp": {"exp0"}}
    scaled = calibrated_predictions(predicted, known, anchors)
    assert scaled == {"mm+add": pytest.approx(4.4, rel=HALF_STEP),
                      "exp": pytest.approx(0.5)}  # global: 1
    assert calibrated_predictions(predicted, known, {})["mm+add"] == pytest.approx(1.1)
    # so the fused variant (about 4.4 / 1.1 = 4.0 optimistic) does not beat mm + add (4.5) by
    # prediction alone, and with a true cost of 4.2 it is measured and chosen
    plans = [{"mm", "add"}, {"mm+add"}]
    calls = []
    result = solve_lazily(cheapest_plan(plans), predicted, known,
                          measuring({"mm+add": 4.2}, calls), margin=0.1, anchors=anchors)
    assert calls == [["mm+add"]] and result.solution == {"mm+add"}


def test_failed_kernels_are_known_but_never_chosen():
    true = {"a": 1.0, "b": 1.0, "ab": math.inf}
    calls = []
    result = solve_lazily(cheapest_plan([{"ab"}, {"a", "b"}]), {"a": 1.0, "b": 1.0, "ab": 0.1},
                          {}, measuring(true, calls), margin=0.0)
    assert calls == [["ab"], ["a", "b"]] and result.solution == {"a", "b"}
    assert math.isinf(result.known["ab"].seconds)


def test_a_measurer_that_cannot_measure_ends_the_loop_with_predictions():
    def cannot(keys):
        return {key: KernelCost(1.0, "predicted", 0) for key in keys}

    result = solve_lazily(cheapest_plan([{"a"}, {"b"}]), {"a": 1.0, "b": 2.0}, {}, cannot, 0.5)
    assert result.solution == {"a"} and result.known == {} and result.rounds == 1


def test_kernels_are_calibrated_by_their_conv_else_their_pool_else_as_memory_bound():
    """Lazy costing's anchors: a kernel holding the convolution is its sibling, one holding
    only the max pool is the pool's, and the rest are their largest primitive's."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from korch_tvm.config import KorchConfig
    from korch_tvm.frontend.onnx_import import import_onnx
    from korch_tvm.pipeline.korch import plan_korch
    from korch_tvm.pipeline.korch_costs import MEMORY_BOUND, work_anchors

    weight = numpy_helper.from_array(np.full((8, 8, 1, 1), 0.1, dtype="float32"), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["p"], ["y"])]
    shape = [1, 8, 6, 6]
    graph = helper.make_graph(nodes, "conv_pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    plan = plan_korch(import_onnx(model), KorchConfig(trials=0, layout="NCHW"), predict_only=True)
    anchors = work_anchors(plan.graph, plan.candidates, plan.kept, plan.kernel_keys)
    expected_kinds = set()
    for i in plan.kept:
        if plan.kernel_keys[i] is None:
            continue
        nodes = plan.candidates[i].nodes
        ops = {plan.graph.nodes[n].op_name: n for n in nodes}
        largest = max(sorted(nodes), key=lambda n: np.prod(plan.graph.nodes[n].shape))
        expected = ops.get("relax.nn.conv2d", ops.get("relax.nn.max_pool2d",
                                                      (MEMORY_BOUND, largest)))
        assert anchors[plan.kernel_keys[i]] == {expected}, sorted(ops)
        expected_kinds.add("conv" if "relax.nn.conv2d" in ops else
                           "pool" if "relax.nn.max_pool2d" in ops else "memory")
    assert expected_kinds == {"conv", "pool", "memory"}


def test_a_small_move_of_the_calibration_leaves_every_price_as_it_was():
    """Each measurement moves the median a little; unsnapped, every unknown kernel's price moved
    with it and every piece of the program was solved again each round."""
    predicted = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "unknown": 2.0}
    known = {"a": KernelCost(3.00, "measured", 1), "b": KernelCost(3.01, "measured", 1),
             "c": KernelCost(3.02, "measured", 1)}
    before = calibrated_predictions(predicted, known, {})
    after = calibrated_predictions(predicted, {**known, "d": KernelCost(3.03, "measured", 1)}, {})
    assert before["unknown"] == after["unknown"] == pytest.approx(6.0, rel=HALF_STEP)
    steps = math.log(before["unknown"] / 2.0) / CALIBRATION_STEP
    assert steps == pytest.approx(round(steps))  # a whole number of steps


def test_a_measured_plan_within_the_gap_of_the_optimistic_one_ends_the_rounds():
    # "ab" is predicted 2 % cheaper than the measured "a" + "b": within a 5 % gap it is not
    # worth measuring; with no gap it is measured (and loses)
    known = {"a": KernelCost(1.0, "measured", 1), "b": KernelCost(1.0, "measured", 1)}
    plans = [{"a", "b"}, {"ab"}]
    calls = []
    result = solve_lazily(cheapest_plan(plans), {"a": 1.0, "b": 1.0, "ab": 1.96}, known,
                          measuring({"ab": 2.5}, calls), margin=0.0, gap=0.05)
    assert calls == [] and result.solution == {"a", "b"} and result.rounds == 1
    strict = solve_lazily(cheapest_plan(plans), {"a": 1.0, "b": 1.0, "ab": 1.96}, known,
                          measuring({"ab": 2.5}, calls), margin=0.0)
    assert calls == [["ab"]] and strict.solution == {"a", "b"} and strict.rounds == 2
    # 10 % cheaper by prediction is more than the gap: measured
    calls.clear()
    solve_lazily(cheapest_plan(plans), {"a": 1.0, "b": 1.0, "ab": 1.8}, known,
                 measuring({"ab": 2.5}, calls), margin=0.0, gap=0.05)
    assert calls == [["ab"]]


def test_the_gap_never_settles_on_kernels_nothing_measured():
    """Without a device the stock kernels are predictions too: the plan of measured kernels
    does not exist, and the rounds go on to the measurer, which says it cannot."""
    calls = []

    def cannot(keys):
        calls.append(list(keys))
        return {key: KernelCost(1.0, "predicted", 0) for key in keys}

    # "a" is the stock group: priced at its prediction in the plan of measured kernels too
    result = solve_lazily(cheapest_plan([{"a"}, {"b"}], stock={"a"}), {"a": 1.0, "b": 1.02},
                          {}, cannot, 0.0, gap=0.05)
    assert calls == [["a"]]
    assert result.solution == {"a"} and result.known == {} and result.rounds == 1


def test_each_round_says_how_far_the_plan_of_measured_kernels_is_from_the_optimistic_one(caplog):
    # "ab" predicted at 1.8 against the measured "a" + "b" at 2.0: 11.1 % apart, so measured
    known = {"a": KernelCost(1.0, "measured", 1), "b": KernelCost(1.0, "measured", 1)}
    with caplog.at_level("INFO", logger="korch_tvm.lazy_costing"):
        solve_lazily(cheapest_plan([{"a", "b"}, {"ab"}]), {"a": 1.0, "b": 1.0, "ab": 1.8}, known,
                     measuring({"ab": 2.5}, []), margin=0.0, gap=0.05)
    first = caplog.records[0].getMessage()
    assert first.startswith("round 1: measuring 1 kernels")
    assert "models 11.1 % above the optimistic 1800.000 ms" in first
