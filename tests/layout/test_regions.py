"""A layout per region (region_layout.py): regions, the stitched model, the choice of layouts."""

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.config import KorchConfig
from korch_tvm.layout.activations import convert_layout
from korch_tvm.layout.regions import (MAX_CUT_WIDTH, MIN_PREDICTED_SAVING, MIXED,
                                      cheapest_layouts, region_module, split_regions,
                                      stitched_module, switch_module, worth_stitching)
from korch_tvm.pipeline.korch import plan_korch, rewrite_plan

from test_activations import activation_transposes, conv_data_layouts, costs_penalising

WIDE, NARROW = 16, 8
FIRST_STAGE = (1, WIDE, 14, 14)  # NCHW shape of the first stage's activations
SECOND_STAGE_NHWC = (1, 7, 7, NARROW)  # NHWC shape of the second stage's


def two_stage_module(residual: bool = False) -> tvm.IRModule:
    """Stage 1 at 16x14x14 (three 3x3 convs, the last two optionally a residual block), a
    stride-2 conv to 16x7x7, stage 2 at 8x7x7 (a 1x1 and a 3x3 conv); bias + ReLU after each."""
    rng = np.random.default_rng(0)

    def conv(builder, x, c_in, c_out, kernel=3, stride=1):
        weight = relax.const((0.3 * rng.standard_normal((c_out, c_in, kernel, kernel))
                              ).astype("float32"))
        bias = relax.const((0.1 * rng.standard_normal((1, c_out, 1, 1))).astype("float32"))
        y = builder.emit(relax.op.nn.conv2d(x, weight, strides=stride, padding=kernel // 2))
        return builder.emit(relax.op.nn.relu(builder.emit(relax.op.add(y, bias))))

    x = relax.Var("x", relax.TensorType(FIRST_STAGE, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = conv(builder, x, WIDE, WIDE)
            z = conv(builder, conv(builder, y, WIDE, WIDE), WIDE, WIDE)
            if residual:
                z = builder.emit(relax.op.add(z, y))
            y = conv(builder, z, WIDE, WIDE, stride=2)
            y = conv(builder, y, WIDE, NARROW, kernel=1)
            out = builder.emit_output(conv(builder, y, NARROW, NARROW))
        builder.emit_func_output(out)
    return builder.get()


def run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_regions_tile_the_model_and_cut_only_where_few_tensors_live():
    mod, regions = split_regions(two_stage_module(residual=True), min_bindings=2)
    bindings = mod["main"].body.blocks[0].bindings
    assert [r.start for r in regions] == [0] + [r.stop for r in regions[:-1]]
    assert regions[-1].stop == len(bindings) and len(regions) == 6  # one per convolution
    assert all(bindings[r.start].value.op.name == "relax.nn.conv2d" for r in regions)
    assert [p.name for p in regions[0].inputs] == ["x"]
    for before, after in zip(regions, regions[1:]):
        assert 1 <= len(before.live_after) <= MAX_CUT_WIDTH
        assert set(after.inputs) <= set(before.live_after)
    # the skip connection is live across the cut inside the residual block
    assert [len(r.live_after) for r in regions] == [1, 2, 1, 1, 1, 1]
    assert set(regions[2].inputs) == set(regions[1].live_after)  # the skip and the branch
    # regions of at least 6 bindings: cuts before the 3rd and 5th convolutions only (the tail
    # would be shorter than 6)
    _, regions = split_regions(two_stage_module(residual=True), min_bindings=6)
    assert [(r.start, r.stop) for r in regions] == [(0, 6), (6, 13), (13, len(bindings))]


def test_a_model_with_weights_as_parameters_is_not_split():
    func = two_stage_module()["main"].with_attr("num_input", 0)  # x counted as a weight
    _, regions = split_regions(tvm.IRModule({"main": func}))
    assert regions == []


@pytest.mark.parametrize("residual", [False, True])
def test_layouts_assigned_to_regions_compute_the_model(residual):
    mod = two_stage_module(residual)
    folded, regions = split_regions(mod, min_bindings=2)
    assert len(regions) == 6
    x = np.random.default_rng(1).standard_normal(FIRST_STAGE).astype("float32")
    expected = run(mod, x)
    n, h = "NCHW", "NHWC"
    for layouts in [(n, n, n, n, n, n), (h, h, h, h, h, h), (h, n, h, n, h, n),
                    (n, h, n, h, n, h), (h, h, h, h, n, n), (n, n, n, h, h, h)]:
        stitched = stitched_module(folded, regions, layouts)
        np.testing.assert_allclose(run(stitched, x), expected, rtol=1e-4, atol=1e-4)
        assert conv_data_layouts(stitched) == list(layouts)


def test_cut_tensors_in_nhwc_cost_no_transposes_between_nhwc_regions():
    mod = two_stage_module(residual=True)
    folded, regions = split_regions(mod, min_bindings=2)
    all_nhwc = stitched_module(folded, regions, ["NHWC"] * len(regions))
    # only at the model's input and output, as when the whole model is converted
    assert activation_transposes(all_nhwc) == activation_transposes(
        convert_layout(mod, "NHWC")) == 2
    # a switch to NCHW for the last region: the model's input and the switch
    switched = ["NHWC"] * (len(regions) - 1) + ["NCHW"]
    assert activation_transposes(stitched_module(folded, regions, switched)) == 2
    # the skip connection skips a region: with that region in NCHW between NHWC ones, the
    # input, the branch into it and out of it, and the output are transposed, but not the skip,
    # which the region that adds it reads as the first region wrote it
    assert activation_transposes(stitched_module(folded, regions, ["NHWC", "NCHW"] + ["NHWC"] * 4)
                                 ) == 4


def test_region_and_switch_modules_take_and_give_their_layout():
    folded, regions = split_regions(two_stage_module(), min_bindings=2)
    stride_two = region_module(folded, regions[3], "NHWC")
    [param] = stride_two["main"].params
    assert [int(d) for d in param.ty.shape.values] == [1, 14, 14, WIDE]
    assert [int(d) for d in stride_two["main"].ret_ty.shape.values] == [1, 7, 7, WIDE]
    assert activation_transposes(stride_two) == 0
    assert conv_data_layouts(region_module(folded, regions[3], "NCHW")) == ["NCHW"]
    switch = switch_module(folded, regions[3])["main"]
    assert [int(d) for d in switch.params[0].ty.shape.values] == [1, WIDE, 7, 7]
    assert switch_module(folded, regions[-1]) is None  # the model's output is not converted


def brute_force(region_ms, switch_ms):
    best = None
    for layouts in itertools.product(["NCHW", "NHWC"], repeat=len(region_ms)):
        total = sum(costs[layout] for costs, layout in zip(region_ms, layouts))
        total += sum(switch for switch, a, b in zip(switch_ms, layouts, layouts[1:]) if a != b)
        if best is None or total < best[1]:
            best = (layouts, total)
    return best


def test_cheapest_layouts_pays_for_a_switch_only_where_it_saves_more():
    region_ms = [{"NCHW": 5.0, "NHWC": 1.0}, {"NCHW": 1.0, "NHWC": 5.0},
                 {"NCHW": 5.0, "NHWC": 1.0}]
    assert cheapest_layouts(region_ms, [1.0, 1.0]) == (("NHWC", "NCHW", "NHWC"), 5.0)
    assert cheapest_layouts(region_ms, [3.0, 3.0]) == (("NHWC", "NHWC", "NHWC"), 7.0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        count = int(rng.integers(1, 7))
        regions = [{"NCHW": float(a), "NHWC": float(b)} for a, b in rng.uniform(0, 4, (count, 2))]
        switches = [float(s) for s in rng.uniform(0, 2, count - 1)]
        layouts, total = cheapest_layouts(regions, switches)
        assert total == pytest.approx(brute_force(regions, switches)[1])
        assert total == pytest.approx(
            sum(costs[layout] for costs, layout in zip(regions, layouts))
            + sum(switch for switch, a, b in zip(switches, layouts, layouts[1:]) if a != b))


def test_auto_plans_each_stage_in_the_layout_that_is_cheaper_there():
    """The first stage is slow in NCHW and the second in NHWC: the stitched model, NHWC then
    NCHW, models cheaper than either layout throughout, and computes the model."""
    mod = two_stage_module()
    plan = plan_korch(mod, KorchConfig(layout="auto"),
                      measure_with=costs_penalising(FIRST_STAGE, SECOND_STAGE_NHWC))
    totals = {layout: entry["modelled_ms"] for layout, entry in plan.layouts.items()}
    assert set(totals) == {"NCHW", "NHWC", MIXED}
    assert plan.layout == MIXED and plan.modelled_ms == pytest.approx(totals[MIXED])
    assert totals[MIXED] < min(totals["NCHW"], totals["NHWC"]) - 4.0  # a slow buffer less
    assert conv_data_layouts(plan.lowered) == ["NHWC"] * 4 + ["NCHW"] * 2
    regions = plan.layouts[MIXED]["regions"]
    assert [r["layout"] for r in regions][0] == "NHWC" and regions[-1]["layout"] == "NCHW"
    assert plan.report()["layout"] == MIXED
    x = np.random.default_rng(2).standard_normal(FIRST_STAGE).astype("float32")
    optimized, _ = rewrite_plan(plan)
    np.testing.assert_allclose(run(optimized, x), run(mod, x), rtol=1e-4, atol=1e-4)


def test_a_model_cheapest_in_one_layout_is_not_stitched():
    plan = plan_korch(two_stage_module(), KorchConfig(layout="auto"),
                      measure_with=costs_penalising(FIRST_STAGE, (1, NARROW, 7, 7)))
    assert plan.layout == "NHWC" and set(plan.layouts) == {"NCHW", "NHWC"}


def test_a_failing_layout_per_region_leaves_the_single_layout_plans(monkeypatch, caplog):
    import korch_tvm.pipeline.korch as passes

    def broken(*args):
        raise RuntimeError("ConvertLayout gave up\nInternalError: no rule for this operator")

    monkeypatch.setattr(passes, "region_module", broken)
    plan = plan_korch(two_stage_module(), KorchConfig(layout="auto"),
                      measure_with=costs_penalising(FIRST_STAGE, SECOND_STAGE_NHWC))
    assert plan.layout in ("NCHW", "NHWC") and set(plan.layouts) == {"NCHW", "NHWC"}
    assert ("a layout per region failed, so it is not considered: InternalError: no rule for "
            "this operator") in caplog.text


def two_stage_onnx():
    """two_stage_module as an ONNX model, for tracing a plan back to ONNX operators."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    convs = [(WIDE, WIDE, 3, 1), (WIDE, WIDE, 3, 1), (WIDE, WIDE, 3, 1), (WIDE, WIDE, 3, 2),
             (WIDE, NARROW, 1, 1), (NARROW, NARROW, 3, 1)]
    nodes, inits, x = [], [], "x"
    for k, (c_in, c_out, kernel, stride) in enumerate(convs):
        inits += [numpy_helper.from_array((0.3 * rng.standard_normal(
                      (c_out, c_in, kernel, kernel))).astype("float32"), f"w{k}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(c_out)).astype("float32"),
                                          f"b{k}")]
        pad = kernel // 2
        nodes += [helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], name=f"conv{k}",
                                   strides=[stride] * 2, pads=[pad] * 4),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
    graph = helper.make_graph(
        nodes, "two_stage", [helper.make_tensor_value_info("x", TensorProto.FLOAT, FIRST_STAGE)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, (1, NARROW, 7, 7))],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_plan_with_a_layout_per_region_is_traced_to_the_onnx_operators():
    from korch_tvm.frontend.onnx_trace import import_onnx_traced
    from korch_tvm.tools.explain import describe_plan

    module, trace = import_onnx_traced(two_stage_onnx(), None)
    plan = plan_korch(module, KorchConfig(layout="auto"),
                      measure_with=costs_penalising(FIRST_STAGE, SECOND_STAGE_NHWC))
    assert plan.layout == MIXED
    explanation = describe_plan(plan, trace)
    traced = [(p["op"], p["onnx"]) for p in explanation["primitives"]
              if p["op"] in ("nn.conv2d", "nn.relu")]
    assert traced == [(op, f"{kind} {kind.lower()}{k}") for k in range(6)
                      for op, kind in (("nn.conv2d", "Conv"), ("nn.relu", "Relu"))]
    assert explanation["layout"] == MIXED


def test_a_layout_per_region_is_planned_only_where_predicted_to_save_enough():
    nchw_then_nhwc = [{"NCHW": 1.0, "NHWC": 2.0}, {"NCHW": 2.0, "NHWC": 1.0}]
    layouts, total = cheapest_layouts(nchw_then_nhwc, [0.1])
    assert layouts == ("NCHW", "NHWC") and worth_stitching(layouts, total, nchw_then_nhwc)
    # 2.1 against 3.0 throughout saves 30 %; a switch that leaves less than the margin does not
    small_gain = 3.0 * (1 - MIN_PREDICTED_SAVING) - 2.0 + 0.01
    layouts, total = cheapest_layouts(nchw_then_nhwc, [small_gain])
    assert len(set(layouts)) == 2 and not worth_stitching(layouts, total, nchw_then_nhwc)
    uniform = [{"NCHW": 1.0, "NHWC": 2.0}] * 2
    assert not worth_stitching(*cheapest_layouts(uniform, [0.0]), uniform)


def test_regions_are_costed_without_the_memory_limit_the_stitched_plan_keeps(monkeypatch):
    """A region's cost only says which layout it prefers: its plans skip the activation-storage
    rounds, which the whole stitched plan, like each single-layout plan, still goes through."""
    import korch_tvm.pipeline.korch as passes

    limits = []
    original = passes.plan_in_layout

    def recorded(source, mod, layout, config, **kwargs):
        limits.append((layout, source is mod, config.memory_limit))
        return original(source, mod, layout, config, **kwargs)

    monkeypatch.setattr(passes, "plan_in_layout", recorded)
    plan = plan_korch(two_stage_module(), KorchConfig(layout="auto"),
                      measure_with=costs_penalising(FIRST_STAGE, SECOND_STAGE_NHWC))
    assert plan.layout == MIXED
    pieces = [limit for layout, piece, limit in limits if piece]
    assert len(pieces) >= 5 and set(pieces) == {"none"}  # two regions, two layouts, a switch
    assert sorted((layout, limit) for layout, piece, limit in limits if not piece) == [
        ("NCHW", "stock"), ("NHWC", "stock"), (MIXED, "stock")]
