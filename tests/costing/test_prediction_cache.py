"""Cached cost-model predictions: computed once per kernel and model, never used across models,
an unreadable cache rebuilt, and a warm plan that extracts no features."""

import json
import logging
import shutil

import pytest

from conftest import REPO, make_tiny_onnx
from korch_tvm.backend.target import parse_target, target_tag
from korch_tvm.config import KorchConfig
from korch_tvm.costing import cost_model
from korch_tvm.costing.prediction_cache import CACHE_FILE, PredictionCache
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.pipeline.korch import plan_korch


class CountingPredictor:
    """predict_many stand-in: seconds = 1e-3 * (position of the module in `order`) + 1e-3."""

    def __init__(self, order):
        self.order = order
        self.asked = []

    def __call__(self, modules):
        self.asked.extend(modules)
        return [1e-3 * (self.order.index(module) + 1) for module in modules]


MODULES = {"k1": "module-1", "k2": "module-2", "k3": "module-3"}  # any value stands for a kernel


def test_each_kernel_is_predicted_once_per_model(tmp_path):
    predictor = CountingPredictor(list(MODULES.values()))
    first = PredictionCache(str(tmp_path), "digest-a").predict_all(MODULES, predictor)
    assert first == {"k1": 1e-3, "k2": 2e-3, "k3": 3e-3} and len(predictor.asked) == 3
    again = PredictionCache(str(tmp_path), "digest-a").predict_all(
        {"k2": "module-2", "k4": "module-4"}, CountingPredictor(["module-2", "module-4"]))
    assert again == {"k2": 2e-3, "k4": 2e-3}  # k2 from the cache (its first value), k4 fresh
    saved = json.loads((tmp_path / CACHE_FILE).read_text())
    assert saved["cost_model_sha256"] == "digest-a" and sorted(saved["seconds"]) == [
        "k1", "k2", "k3", "k4"]


def test_another_model_does_not_use_the_cache(tmp_path):
    PredictionCache(str(tmp_path), "digest-a").predict_all(
        MODULES, CountingPredictor(list(MODULES.values())))
    predictor = CountingPredictor(list(reversed(MODULES.values())))
    seconds = PredictionCache(str(tmp_path), "digest-b").predict_all(MODULES, predictor)
    assert len(predictor.asked) == 3 and seconds["k1"] == 3e-3


@pytest.mark.parametrize("content", ["{not json", '{"seconds": 3}', '[1, 2]',
                                     '{"cost_model_sha256": "digest-a", "seconds": {"k1": "x"}}'])
def test_an_unreadable_cache_is_warned_about_and_rebuilt(tmp_path, caplog, content):
    (tmp_path / CACHE_FILE).write_text(content)
    predictor = CountingPredictor(list(MODULES.values()))
    with caplog.at_level(logging.WARNING, logger="korch_tvm.prediction_cache"):
        seconds = PredictionCache(str(tmp_path), "digest-a").predict_all(MODULES, predictor)
    assert seconds["k3"] == 3e-3 and len(predictor.asked) == 3
    if content != '{"seconds": 3}':  # another model's stamp (here: none) is not an error
        assert "unreadable" in caplog.text
    assert json.loads((tmp_path / CACHE_FILE).read_text())["seconds"]["k1"] == 1e-3


@pytest.fixture
def counted_features(tmp_path, monkeypatch) -> list:
    """A log directory (tmp_path) holding the shipped cost model; returns the list that gets an
    entry for every kernel whose features are extracted."""
    tag = target_tag(parse_target("llvm"))
    shipped_model = REPO / "tuning_logs" / tag / cost_model.MODEL_FILE
    if not shipped_model.exists():
        pytest.skip("the shipped cost model is for another CPU")
    (tmp_path / tag).mkdir()
    for suffix in ("", ".meta.json"):
        shutil.copy(str(shipped_model) + suffix, tmp_path / tag / (cost_model.MODEL_FILE + suffix))
    extracted = []
    original = cost_model.kernel_features_many
    monkeypatch.setattr(cost_model, "kernel_features_many",
                        lambda mods, *args, **kwargs: extracted.extend([1] * len(mods))
                        or original(mods, *args, **kwargs))
    return extracted


def test_a_warm_plan_extracts_no_features_and_plans_the_same(tmp_path, counted_features):
    """With the shipped cost model: the first plan predicts every distinct kernel, the second
    reads them all from the cache and comes to the same plan."""
    mod = import_onnx(make_tiny_onnx(rows=32, cols=64))
    config = KorchConfig(tuning_logs=str(tmp_path), trials=0)
    first = plan_korch(mod, config, predict_only=True)
    assert len(counted_features) == len(first.kernel_modules) > 0
    counted_features.clear()
    second = plan_korch(mod, config, predict_only=True)
    assert counted_features == []
    assert second.chosen_groups == first.chosen_groups
    assert second.modelled_ms == pytest.approx(first.modelled_ms)


def test_kernels_a_time_budget_leaves_unmeasured_reuse_the_plans_predictions(tmp_path,
                                                                              counted_features):
    """With no time to measure, the profiler's fallback is the prediction the plan already made:
    each distinct kernel's features are extracted once, and its cost is that prediction."""
    mod = import_onnx(make_tiny_onnx(rows=32, cols=64))
    plan = plan_korch(mod, KorchConfig(tuning_logs=str(tmp_path), trials=0, time_budget=0.0))
    assert len(counted_features) == len(plan.kernel_modules) > 0
    tag = target_tag(parse_target("llvm"))
    cached = json.loads((tmp_path / tag / CACHE_FILE).read_text())
    predicted = {key: cost for key, cost in plan.costs.items() if cost.source == "predicted"}
    assert predicted and all(
        cost.seconds == pytest.approx(cached["seconds"][key]) for key, cost in predicted.items())
