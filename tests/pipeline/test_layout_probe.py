"""The layout probe: a layout whose heaviest kernels lose clearly is not planned."""

import pytest

from korch_tvm.config import KorchConfig
from korch_tvm.costing.kernel_costs import KernelCost
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import layout_variants
from korch_tvm.pipeline import layout_probe
from korch_tvm.pipeline.layout_plan import lower_layout
from korch_tvm.pipeline.layout_probe import (MINOR_SHARE, PROBE_MAX_KERNELS, SCREEN_RATIO,
                                             Probe, StockKernel, differing_share,
                                             layout_specific, layouts_to_plan,
                                             layouts_worth_planning, probe_result, probe_set,
                                             regions_may_pay, screen_layouts, stock_kernels)
from test_weight_packing import conv_block_onnx


def kernel(flops, uses=1, kind="conv1x1"):
    return StockKernel(None, uses, flops, kind)


def test_probe_set_takes_the_heaviest_until_half_the_flops():
    kernels = {"a": kernel(10), "b": kernel(40), "c": kernel(5, uses=6), "d": kernel(20)}
    # by FLOPs times uses: b 40, c 30, d 20, a 10 (of 100): b alone is 40 %, b and c 70 %
    assert probe_set(kernels) == ["b", "c"]
    many = {f"k{i}": kernel(1) for i in range(40)}
    assert len(probe_set(many)) == PROBE_MAX_KERNELS


def test_each_kind_is_probed_and_stands_for_its_own_flops():
    """SSDlite's depthwise convolutions hold 8 % of the FLOPs and, in NCHW, half the time: a
    probe of the heaviest kernels alone never measured one."""
    kernels = {"pw1": kernel(50), "pw2": kernel(40), "dw1": kernel(4, kind="conv_depthwise"),
               "dw2": kernel(3, uses=2, kind="conv_depthwise"), "t": kernel(0, kind="memory")}
    assert probe_set(kernels) == ["pw1", "dw2"]   # half of each kind; a transpose has no FLOPs
    probe = probe_result(kernels, {"pw1": 0.5, "dw2": 0.3})
    # 1x1: 50 of 90 FLOPs in 0.5 s stands for 0.9 s; depthwise: 6 of 10 in 2 x 0.3 s for 1 s
    assert probe.flops == 100 and probe.rate == pytest.approx(100 / 1.9)
    assert probe.seconds_by_flops == {50.0: 0.5, 3.0: 0.6}


def test_a_kernel_every_layout_shares_is_not_probed():
    """LeViT-128S's heaviest kernels are token matmuls, the same kernel in either layout: they
    brought NCHW's probe rate to 0.8x NHWC's, so NCHW was planned, and lost."""
    matmul, shuffle = kernel(100), kernel(0)
    kernels = {"NCHW": {"mm": matmul, "conv_nchw": kernel(30), "to_tokens": shuffle},
               "NHWC": {"mm": matmul, "conv_nhwc": kernel(30)}}
    specific = layout_specific(kernels)
    assert specific == {"NCHW": {"conv_nchw": kernel(30), "to_tokens": shuffle},
                        "NHWC": {"conv_nhwc": kernel(30)}}
    assert probe_set(specific["NCHW"]) == ["conv_nchw"]
    assert layout_specific({}) == {}


def test_memory_bound_kernels_count_in_the_rate_but_win_no_region():
    """DenseNet-121: NCHW's pooling and norm kernels ran 0.1-0.8 ms each faster than NHWC's,
    which kept NCHW planned at 1.7x below NHWC's rate and its regions costed, for a plan all
    in NHWC; a region starts at a convolution, and its convolutions decide it."""
    conv, pool = kernel(100, kind="conv3x3"), kernel(2, kind="memory")
    stock = {"conv": conv, "pool": pool}
    nchw = probe_result(stock, {"conv": 2.0, "pool": 0.5})   # 2.5 s, the pool 3x faster
    nhwc = probe_result(stock, {"conv": 1.0, "pool": 1.2})   # 2.2 s
    assert nchw.rate == pytest.approx(102 / 2.5) and nhwc.rate == pytest.approx(102 / 2.2)
    assert nchw.seconds_by_flops == {100.0: 2.0} and nhwc.seconds_by_flops == {100.0: 1.0}
    # within the screening ratio: both planned, but no region is costed
    assert layouts_worth_planning({"NCHW": nchw, "NHWC": nhwc}) == ["NCHW", "NHWC"]
    assert not regions_may_pay({"NCHW": nchw, "NHWC": nhwc})
    slow = probe_result(stock, {"conv": 3.5, "pool": 0.5})   # 1.8x below: not planned
    assert layouts_worth_planning({"NCHW": slow, "NHWC": nhwc}) == ["NHWC"]


def test_probe_counts_each_use_and_keys_kernels_by_flops():
    kernels = {"a": kernel(1e9, uses=3), "b": kernel(2e9), "c": kernel(2.0004e9)}
    probe = probe_result(kernels, {"a": 0.01, "b": 0.02, "c": 0.03})
    # 7e9 FLOPs in 3 * 0.01 + 0.02 + 0.03 s; b and c are one convolution to three digits
    assert probe.rate == pytest.approx(7.0004e9 / 0.08)
    assert probe.seconds_by_flops == {1e9: 0.03, 2e9: 0.02}


def probe(rate, flops=600.0, **seconds):
    return Probe(rate, {float(f[1:]): taken for f, taken in seconds.items()}, flops)


def test_layouts_worth_planning():
    fast = probe(200.0, f1=1.0, f2=2.0)   # 600 FLOPs at 200/s: 3 s
    assert layouts_worth_planning({"NCHW": probe(100.0, f1=2.0, f2=4.0), "NHWC": fast}) == [
        "NHWC"]
    # within the ratio both are planned, and the order is kept
    close = 200.0 / SCREEN_RATIO + 1
    assert layouts_worth_planning({"NCHW": probe(close, f1=2.0), "NHWC": fast}) == [
        "NCHW", "NHWC"]
    # slower overall, but clearly faster on one convolution (it may win a region): both
    assert layouts_worth_planning({"NCHW": probe(100.0, f1=0.7, f2=4.0), "NHWC": fast}) == [
        "NCHW", "NHWC"]
    # ... unless what it wins is under REGION_GAIN of the fastest layout's time (0.3 s of 30 s)
    assert layouts_worth_planning({"NCHW": probe(10.0, f1=0.7, f2=4.0),
                                   "NHWC": probe(20.0, f1=1.0, f2=2.0)}) == ["NHWC"]
    # a few percent faster on one is a tie: screened
    assert layouts_worth_planning({"NCHW": probe(100.0, f1=0.95, f2=4.0), "NHWC": fast}) == [
        "NHWC"]
    # no convolution measured in both, or one not measured at all: both planned
    assert layouts_worth_planning({"NCHW": probe(100.0, f3=2.0), "NHWC": fast}) == [
        "NCHW", "NHWC"]
    assert layouts_worth_planning({"NCHW": None, "NHWC": fast}) == ["NCHW", "NHWC"]


def test_a_layout_per_region_is_costed_only_where_another_layout_clearly_wins_one():
    fast = probe(200.0, f1=1.0, f2=2.0)   # 3 s
    # DenseNet-121: NCHW within the screening ratio (planned), but faster on no convolution
    assert not regions_may_pay({"NCHW": probe(180.0, f1=1.1, f2=2.1), "NHWC": fast})
    assert not regions_may_pay({"NHWC": fast, "NCHW": probe(180.0, f1=0.9, f2=2.1)})  # a tie
    # clearly faster on one convolution, saving REGION_GAIN of the fastest's time or more
    assert regions_may_pay({"NCHW": probe(180.0, f1=0.7, f2=2.1), "NHWC": fast})
    assert not regions_may_pay({"NCHW": probe(10.0, f1=0.7, f2=4.0),  # 0.3 s of 30 s
                                "NHWC": probe(20.0, f1=1.0, f2=2.0)})
    # nothing to tell: a probe missing, or no convolution measured in both
    assert regions_may_pay({"NCHW": None, "NHWC": fast})
    assert regions_may_pay({"NCHW": probe(180.0, f3=2.0), "NHWC": fast})


def test_the_share_of_flops_in_the_kernels_that_differ():
    """A ViT: token matmuls in both layouts, the patch embedding's convolution in one."""
    kernels = {"mm": kernel(100, uses=2), "conv_nchw": kernel(10), "to_tokens": kernel(0)}
    specific = layout_specific({"NCHW": kernels, "NHWC": {"mm": kernel(100, uses=2)}})
    assert differing_share(kernels, specific["NCHW"]) == pytest.approx(10 / 210)
    assert differing_share({"mm": kernel(100)}, {}) == 0.0
    assert differing_share({"copy": kernel(0)}, {"copy": kernel(0)}) == 1.0  # nothing to tell


def test_layouts_differing_in_few_flops_plan_only_the_faster():
    close = {"NCHW": probe(190.0, f1=1.05), "NHWC": probe(200.0, f1=1.0)}
    assert layouts_worth_planning(close) == ["NCHW", "NHWC"]
    assert layouts_to_plan(close, share=MINOR_SHARE / 2) == ["NHWC"]
    assert layouts_to_plan(dict(reversed(list(close.items()))), MINOR_SHARE / 2) == ["NHWC"]
    # where the layouts differ in much of the model, both are planned as before
    assert layouts_to_plan(close, share=MINOR_SHARE * 2) == ["NCHW", "NHWC"]
    # a probe that could not measure says nothing of which is faster: both
    assert layouts_to_plan({"NCHW": None, "NHWC": probe(200.0, f1=1.0)},
                           MINOR_SHARE / 2) == ["NCHW", "NHWC"]


class ScriptedSession:
    """Measures each layout's probe in turn at the rate given for it (FLOPs per second);
    "predicted" for a layout whose rate is None (nothing could measure there)."""

    built_kernels = None  # each stock kernel built afresh

    def __init__(self, rates):
        self.rates, self.calls = list(rates), []

    def measure(self, modules):
        from korch_tvm.kernels.kernel_facts import kernel_flops

        rate = self.rates[len(self.calls)]
        self.calls.append(sorted(modules))
        return {key: KernelCost(kernel_flops(module) / (rate or 1e9),
                                "predicted" if rate is None else "measured", 0)
                for key, module in modules.items()}


@pytest.mark.parametrize("rates,kept", [
    ((50e9, 200e9), ["NHWC"]),
    ((200e9, 50e9), ["NCHW"]),
    ((180e9, 200e9), ["NHWC", "NCHW"]),  # both, the faster first
    ((None, 200e9), ["NCHW", "NHWC"]),  # both, as given: one probe could not measure
])
def test_screen_layouts_on_a_convolution_block(rates, kept, monkeypatch, caplog):
    variants = layout_variants(import_onnx(conv_block_onnx(32, 28), None), "auto")
    config = KorchConfig(trials=0)
    lowered = {layout: lower_layout(variant, config) for layout, variant in variants.items()}
    session = ScriptedSession(rates)
    # three convolutions: a model this small is planned in both layouts unprobed
    assert screen_layouts(lowered, session) == (lowered, True)  # regions as before
    assert session.calls == []
    monkeypatch.setattr(layout_probe, "PROBE_MIN_KERNELS", 1)
    with caplog.at_level("INFO", logger=layout_probe.logger.name):
        screened, regions = screen_layouts(lowered, session)
    assert list(screened) == kept
    # NCHW and NHWC measure the same convolutions at one rate each: neither clearly wins one
    # that the other runs faster, so a layout per region is not worth costing
    assert regions == (len(kept) == 1 or rates[0] is None)
    # the probe says what it found whether or not it drops a layout
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("layout probe")]
    dropped = [layout for layout in variants if layout not in kept]
    assert len(said) == 1 and (f"{dropped[0]} not planned" if dropped
                               else "every layout planned") in said[0]
    assert ("no layout per region" in said[0]) == (not regions)
    assert ("NCHW unmeasured" in said[0]) == (rates[0] is None)
    assert all(screened[layout] is lowered[layout] for layout in kept)  # handed on as it is
    # each layout's probe: its heaviest stock kernel (the 3x3 convolution) first
    specific = layout_specific({layout: stock_kernels(lowered[layout]) for layout in variants})
    for layout, measured in zip(variants, session.calls):
        kernels = specific[layout]
        assert measured == sorted(probe_set(kernels))
        assert max(kernels.values(), key=lambda k: k.flops * k.uses).flops in {
            kernels[key].flops for key in measured}
        # a 32-channel 3x3 convolution on 28x28 is 2 * 28 * 28 * 32 * 32 * 9 FLOPs
        assert max(kernels[key].flops for key in measured) >= 2 * 28 * 28 * 32 * 32 * 9


@pytest.mark.parametrize("rates,kept", [((180e9, 200e9), ["NHWC"]), ((200e9, 180e9), ["NCHW"])])
def test_screen_layouts_plans_the_faster_alone_when_the_difference_is_minor(rates, kept,
                                                                            monkeypatch):
    """The convolution block differs in all its FLOPs; a share taken as minor shows the
    wiring: probes within the screening ratio, and only the faster layout is planned."""
    variants = layout_variants(import_onnx(conv_block_onnx(32, 28), None), "auto")
    lowered = {layout: lower_layout(variant, KorchConfig(trials=0))
               for layout, variant in variants.items()}
    monkeypatch.setattr(layout_probe, "PROBE_MIN_KERNELS", 1)
    both = list(screen_layouts(lowered, ScriptedSession(rates)).lowered)
    assert both == kept + [layout for layout in ("NCHW", "NHWC") if layout not in kept]
    monkeypatch.setattr(layout_probe, "MINOR_SHARE", 1.01)
    assert list(screen_layouts(lowered, ScriptedSession(rates)).lowered) == kept


def test_a_layout_that_cannot_win_is_left_out_and_regions_are_still_tried(monkeypatch):
    """plan_korch's wiring: untuned, each layout after the first is planned against the best
    plan made so far (`beat_ms`); one that cannot beat it (None) is left out of the plans,
    and a layout per region is still tried, as with both planned, unless the probe found that
    it cannot pay."""
    import dataclasses

    from korch_tvm.pipeline import korch

    @dataclasses.dataclass(frozen=True)
    class Plan:
        layout: str
        modelled_ms: float
        costs: dict = dataclasses.field(default_factory=dict)
        layouts: dict = dataclasses.field(default_factory=dict)
        tuning: dict = dataclasses.field(default_factory=dict)
        layouts_stopped: tuple = ()

    class Pending:
        def __init__(self, layout, ms):
            self.plan = Plan(layout, ms)

        def finish(self, tuned, seconds):
            return self.plan

    asked, regions_tried = [], []

    def plan_in_layout(source, variant, layout, config, beat_ms=None, **_):
        asked.append((layout, beat_ms))
        return None if beat_ms is not None else Pending(layout, 5.0)  # the later cannot win

    class Session:
        built_kernels = None  # kernels built afresh for each layout

        def seconds_left(self):
            return None

    monkeypatch.setattr(korch, "plan_in_layout", plan_in_layout)
    monkeypatch.setattr(korch, "_try_region_layouts",
                        lambda *args, **kwargs: regions_tried.append(True))
    mod = import_onnx(conv_block_onnx(32, 28), None)
    plan = korch.plan_korch(mod, KorchConfig(trials=0), session=Session())
    assert asked == [("NCHW", None), ("NHWC", 5.0)]  # small: unprobed, in the order given
    assert plan.layout == "NCHW" and list(plan.layouts) == ["NCHW"] and regions_tried == [True]
    assert plan.layouts_stopped == ("NHWC",)  # said in the report, not silently missing
    asked.clear()
    monkeypatch.setattr(korch, "tune_once", lambda planned, session: ({}, 0.0))
    korch.plan_korch(mod, KorchConfig(trials=8), session=Session())
    assert asked == [("NCHW", None), ("NHWC", None)]  # tuned: every layout is planned in full
    # a probe that finds no layout clearly faster on a convolution: no layout per region
    regions_tried.clear()
    asked.clear()
    monkeypatch.setattr(korch, "lower_layout", lambda variant, config: variant)
    monkeypatch.setattr(korch, "screen_layouts", lambda lowered, session: layout_probe.Screened(
        dict(reversed(list(lowered.items()))), regions_may_pay=False))
    plan = korch.plan_korch(mod, KorchConfig(trials=0), session=Session())
    assert asked == [("NHWC", None), ("NCHW", 5.0)] and regions_tried == []
