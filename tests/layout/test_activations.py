"""Activation layout as an implementation choice (data_layout.py) on both compile paths."""

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.config import KorchConfig
from korch_tvm.costing.measure import KernelCost
from korch_tvm.errors import KorchError
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import (convert_layout, has_convolution, in_best_layout,
                                          layout_variants)
from korch_tvm.pipeline.compile import compile_model
from korch_tvm.pipeline.korch import plan_korch
from korch_tvm.pipeline.stock import run_stock

from conftest import make_tiny_onnx
from test_weight_packing import conv_block_onnx

CHANNELS, SIZE = 16, 14
NCHW_SHAPE = (1, CHANNELS, SIZE, SIZE)
NHWC_SHAPE = (1, SIZE, SIZE, CHANNELS)


def conv_module():
    return import_onnx(conv_block_onnx(CHANNELS, SIZE), None)


def conv_calls(mod) -> list[relax.Call]:
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.name == "relax.nn.conv2d":
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return calls


def conv_data_layouts(mod) -> list[str]:
    return [str(call.attrs.data_layout) for call in conv_calls(mod)]


def test_variants_offer_both_layouts_only_where_there_is_a_convolution():
    mod = conv_module()
    variants = layout_variants(mod, "auto")
    assert list(variants) == ["NCHW", "NHWC"]
    assert conv_data_layouts(variants["NCHW"]) == ["NCHW"] * 3  # as given, constants folded
    assert conv_data_layouts(variants["NHWC"]) == ["NHWC"] * 3
    # the user still feeds and reads NCHW
    main = variants["NHWC"]["main"]
    assert [int(d) for d in main.params[0].ty.shape] == list(NCHW_SHAPE)
    assert [int(d) for d in main.ret_ty.shape] == list(NCHW_SHAPE)
    assert list(layout_variants(mod, "NHWC")) == ["NHWC"]
    matmul_only = import_onnx(make_tiny_onnx(), None)
    assert not has_convolution(matmul_only)
    assert list(layout_variants(matmul_only, "auto")) == ["NCHW"]
    with pytest.raises(KorchError, match="unknown layout 'NCWH'"):
        convert_layout(mod, "NCWH")


def test_nhwc_weights_have_output_channels_last():
    """HWIO, so that a default schedule's vector of output channels is one contiguous load
    (OHWI made it a gather: 1.4-2.7x slower on YOLOX-nano's convolutions)."""
    convs = conv_calls(convert_layout(conv_module(), "NHWC"))
    assert [str(conv.attrs.kernel_layout) for conv in convs] == ["HWIO"] * 3
    for conv in convs:
        weight = [int(d) for d in conv.args[1].ty.shape]
        assert weight[-1] == int(conv.ty.shape[-1]) == CHANNELS


def test_weight_transposes_are_folded_into_constants():
    converted = convert_layout(conv_module(), "NHWC")
    transposed = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.name == "relax.permute_dims":
            transposed.append(expr.args[0])

    relax.analysis.post_order_visit(converted["main"], visit)
    # only the activations at the boundary: the model input, and the last result back to NCHW
    assert len(transposed) == 2
    assert not any(isinstance(x, tvm.ir.expr.Constant) for x in transposed)


def costs_penalising(*shapes):
    """A measurement that charges 1 ms per kernel plus 4 ms per buffer of one of `shapes`."""
    def measure(modules):
        costs = {}
        for key, module in modules.items():
            func = module["main"]
            hits = sum(tuple(int(d) for d in p.ty.shape) in shapes
                       for p in func.params)
            costs[key] = KernelCost(1e-3 + 4e-3 * hits, "measured", 0)
        return costs
    return measure


@pytest.mark.parametrize("slow_shape,expected", [(NCHW_SHAPE, "NHWC"), (NHWC_SHAPE, "NCHW")])
def test_auto_keeps_the_layout_whose_plan_models_cheaper(slow_shape, expected):
    plan = plan_korch(conv_module(), KorchConfig(layout="auto"),
                      measure_with=costs_penalising(slow_shape))
    totals = {layout: entry["modelled_ms"] for layout, entry in plan.layouts.items()}
    assert set(totals) == {"NCHW", "NHWC"}
    assert plan.layout == expected == min(totals, key=totals.get)
    assert plan.modelled_ms == pytest.approx(totals[expected])
    # each of the three convolutions is its own kernel (one linear primitive per kernel) and
    # every kernel of the losing layout touches at least one slow buffer
    assert totals["NCHW" if expected == "NHWC" else "NHWC"] >= 3 * 5.0
    report = plan.report()
    assert report["layout"] == expected
    assert conv_data_layouts(plan.lowered) == ["NHWC" if expected == "NHWC" else "NCHW"] * 3


def test_both_paths_compile_nhwc_to_the_same_numbers(tmp_path):
    model = conv_block_onnx(CHANNELS, SIZE)
    for korch in (False, True):
        _, report = compile_model(model, "llvm", korch=korch, tuning_logs=str(tmp_path),
                                  config=KorchConfig(layout="NHWC"))
        assert report["layout"] == "NHWC"
        assert report["verification"]["passed"]
        assert report["verification"]["max_rel_error"] < 1e-5


def test_stock_auto_reports_every_layout_and_adds_up_their_costing(tmp_path):
    config = KorchConfig(target=tvm.target.Target({"kind": "llvm", "num-cores": 2}),
                         tuning_logs=str(tmp_path), layout="auto")
    _, report = run_stock(conv_module(), config)
    layouts = report["layouts"]
    assert set(layouts) == {"NCHW", "NHWC"}
    assert report["layout"] == min(layouts, key=lambda name: layouts[name]["modelled_ms"])
    assert report["modelled_ms"] == layouts[report["layout"]]["modelled_ms"]
    assert report["tuning"]["kernels"] == sum(e["tuning"]["kernels"] for e in layouts.values())
    assert all(np.isfinite(e["modelled_ms"]) for e in layouts.values())


def activation_transposes(mod) -> int:
    found = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and expr.op.name == "relax.permute_dims"
                and not isinstance(expr.args[0], tvm.ir.expr.Constant)):
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return len(found)


def clip_and_scale_module():
    """conv -> clip(0, 6) -> multiply by a (C, 1, 1) constant -> conv: the two patterns
    ConvertLayout would otherwise transpose around."""
    rng = np.random.default_rng(0)
    c = CHANNELS
    x = relax.Var("x", relax.TensorType(NCHW_SHAPE, "float32"))
    w1, w2 = (relax.const(rng.standard_normal((c, c, 1, 1)).astype("float32")) for _ in "ab")
    scale = relax.const(rng.standard_normal((c, 1, 1)).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.nn.conv2d(x, w1))
            y = builder.emit(relax.op.clip(y, 0.0, 6.0))
            y = builder.emit(relax.op.multiply(y, scale))
            out = builder.emit_output(relax.op.nn.conv2d(y, w2))
        builder.emit_func_output(out)
    return builder.get()


def run_module(mod, x):
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_clip_and_low_rank_constants_do_not_force_transposes():
    mod = clip_and_scale_module()
    converted = convert_layout(mod, "NHWC")
    assert conv_data_layouts(converted) == ["NHWC", "NHWC"]
    assert activation_transposes(converted) == 2  # only the input and the output
    x = np.random.default_rng(1).standard_normal(NCHW_SHAPE).astype("float32") * 4
    expected = run_module(mod, x)
    np.testing.assert_allclose(run_module(converted, x), expected, rtol=1e-5, atol=1e-5)


def test_a_failing_optional_layout_is_left_out_but_the_first_must_work(caplog):
    mod = conv_module()
    budgets = []

    def compile_in(layout, variant, budget):
        budgets.append(budget)
        if layout == "NHWC":
            raise RuntimeError("no schedule\nmore detail")
        return 3.0

    best, results = in_best_layout(mod, "auto", compile_in, float, time_budget=100.0)
    assert best == "NCHW" and results == {"NCHW": 3.0}
    assert "layout NHWC failed, so it is not considered: no schedule" in caplog.text
    assert budgets[0] == pytest.approx(50.0, abs=1.0) and budgets[1] > 49.0  # an even share

    def first_fails(layout, variant, budget):
        raise RuntimeError(f"{layout} broke")

    with pytest.raises(RuntimeError, match="NCHW broke"):
        in_best_layout(mod, "auto", first_fails, float)


@pytest.mark.parametrize("korch", [False, True])
def test_one_trial_budget_for_the_whole_compile_whatever_the_layouts(tmp_path, monkeypatch,
                                                                     korch):
    """`--layout auto --trials 16` used to give each layout (and Korch's layout per region)
    16 trials of its own: 26 ran. The trials asked of MetaSchedule over the whole compile now
    add up to at most the budget (tuning is counted, not run)."""
    import korch_tvm.costing.measure as profiler

    asked = []
    monkeypatch.setattr(profiler, "_tune_group",
                        lambda names, *_args: asked.append(_args[5] * len(names)) or {})
    _, report = compile_model(conv_block_onnx(8, 8), "llvm", korch=korch,
                              tuning_logs=str(tmp_path), trials=16, verify=False,
                              config=KorchConfig(layout="auto"))
    assert set(report["layouts"]) >= {"NCHW", "NHWC"}
    assert 0 < sum(asked) <= 16, asked
