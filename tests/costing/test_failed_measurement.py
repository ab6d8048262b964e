"""A kernel whose measurement fails is costed by its prediction, never by inf or a placeholder."""

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.costing.failed_costs import costed_by_prediction, is_failed
from korch_tvm.costing.kernel_costs import KernelCost
from korch_tvm.costing.measure import measure_kernels
from korch_tvm.costing.metaschedule_setup import evaluator_for_target
from korch_tvm.costing.tuning_log import TuningLog

sys.path.insert(0, str(Path(__file__).parent))
from test_measure_inputs import _take_kernel  # noqa: E402

VOCAB, WIDTH, TOKENS = 1000, 64, 16


def test_failed_costs_take_their_prediction():
    costs = {"ok": KernelCost(2e-6, "measured", 1),
             "broke": KernelCost(math.inf, "failed", 1, "run failed: Subprocess terminated"),
             "logged": KernelCost(math.inf, "log", 0, "every logged measurement failed")}
    predicted = {"ok": 1.0, "broke": 3e-6, "logged": 4e-6}
    result = costed_by_prediction(costs, predicted.__getitem__)
    assert result["ok"] == costs["ok"]
    assert result["broke"] == KernelCost(3e-6, "failed", 1, "run failed: Subprocess terminated")
    assert result["logged"] == KernelCost(4e-6, "failed", 0, "every logged measurement failed")
    assert all(is_failed(result[name]) for name in ("broke", "logged"))
    assert not is_failed(result["ok"])


def test_an_unusable_prediction_is_refused():
    with pytest.raises(AssertionError, match="cannot stand in"):
        costed_by_prediction({"k": KernelCost(math.inf, "failed", 1)}, lambda name: math.inf)


@pytest.mark.slow
def test_metaschedules_own_runner_fails_the_take_and_it_is_costed_by_prediction(tmp_path):
    """MetaSchedule's LocalRunner as shipped (random bits in the int64 ids): the run dies."""
    from tvm.s_tir import meta_schedule as ms

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    runner = ms.runner.LocalRunner(evaluator_config=evaluator_for_target(target))
    costs = measure_kernels({"take": _take_kernel()}, target, TuningLog(str(tmp_path), target),
                            runner=runner, predictor=lambda module: 5e-6)
    assert costs["take"].source == "failed"
    assert costs["take"].seconds == 5e-6
    assert costs["take"].error.startswith("run failed")


def _vit_front(path: Path) -> Path:
    """What a ViT/BERT front does: an embedding gather by int64 ids, a class token, positions."""
    rng = np.random.default_rng(0)
    weights = {"table": (VOCAB, WIDTH), "cls": (1, 1, WIDTH), "pos": (1, TOKENS + 1, WIDTH),
               "W": (WIDTH, WIDTH)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
             helper.make_node("Concat", ["cls", "emb"], ["tok"], axis=1),
             helper.make_node("Add", ["tok", "pos"], ["x"]),
             helper.make_node("MatMul", ["x", "W"], ["y"])]
    graph = helper.make_graph(
        nodes, "front", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, TOKENS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS + 1, WIDTH])],
        initializer=[numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)
                     for name, shape in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path / "front.onnx")
    return path / "front.onnx"


class _FailingRunner:
    """Every measurement errors, as a runner whose worker died would report it."""

    def __init__(self, *args, **kwargs) -> None:
        self.timeout_sec = 30

    def run(self, runner_inputs):
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        class Failed:
            def result(self):
                return RunnerResult(None, "LocalRunner: An exception occurred\nstub")

        return [Failed() for _ in runner_inputs]


def _take_entries(report):
    return [k for k in report["plan"]["kernels"] if "take" in k["ops"]]


@pytest.mark.slow
def test_vit_front_models_finite_when_every_measurement_fails(tmp_path, monkeypatch):
    import korch_tvm
    from tvm.s_tir import meta_schedule as ms

    monkeypatch.setattr(ms.runner, "LocalRunner", _FailingRunner)
    # TVM kernels only: an OpenBLAS call would still time the matmul, which fails nothing
    _, report = korch_tvm.compile_model(str(_vit_front(tmp_path)), target="llvm", korch=True,
                                        tuning_logs=str(tmp_path / "logs"), trials=0,
                                        config=korch_tvm.KorchConfig(library="off"))
    plan, kernels = report["plan"], report["plan"]["kernels"]
    assert math.isfinite(plan["modelled_ms"]) and plan["modelled_ms"] > 0
    # every kernel entered the objective at its prediction: the sum, nothing else
    assert plan["modelled_ms"] == pytest.approx(sum(k["ms"] for k in kernels), rel=1e-9)
    assert all(k["cost_source"] == "failed" and k["costed_as"] == "prediction"
               for k in kernels)
    assert plan["failed_kernels"] == len(kernels) and len(_take_entries(report)) == 1
    # predictions of this tiny model are microseconds; the old placeholder was 10^6 ms
    assert plan["modelled_ms"] < 1.0
    # only stock groups may be chosen unmeasured
    assert all(k["stock_group"] for k in kernels)


@pytest.mark.slow
def test_vit_front_take_is_measured_and_the_model_is_microseconds(tmp_path):
    import korch_tvm

    _, report = korch_tvm.compile_model(str(_vit_front(tmp_path)), target="llvm", korch=True,
                                        tuning_logs=str(tmp_path / "logs"), trials=0)
    plan = report["plan"]
    assert report["tuning"]["failed"] == 0 and plan["failed_kernels"] == 0
    (take,) = _take_entries(report)
    assert take["cost_source"] == "measured"
    assert 0 < take["ms"] < 0.5  # 16 rows of 64 floats (it was null: every run died)
    assert 0 < plan["modelled_ms"] < 1.0  # it was 10^6 ms


def test_a_failed_cost_keeps_its_prediction_in_the_default_schedule_costs():
    """Lazy costing plans on default-schedule costs: a failed kernel's logged default run is
    the failure itself, so it must not turn the prediction back into infinity there."""
    from korch_tvm.costing.kernel_costs import default_schedule_costs

    class LogOfFailures:  # what the log answers for a kernel whose every run failed
        def default_seconds_of(self, kernel_mods):
            return [math.inf for _ in kernel_mods]

    costs = {"take": KernelCost(4e-6, "failed", 0, "Subprocess terminated"),
             "add": KernelCost(2e-6, "measured", 0)}
    defaults = default_schedule_costs({"take": None, "add": None}, costs, LogOfFailures())
    assert defaults["take"] == costs["take"]
    assert defaults["add"].seconds == math.inf  # a measured kernel takes the log's default run
