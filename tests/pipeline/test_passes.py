"""The compile's steps as named passes, and the stock and Korch pipelines made of them."""

import errno

import pytest
import tvm

from conftest import make_tiny_onnx
from korch_tvm.config import KorchConfig
from korch_tvm.costing.session import CostingSession
from korch_tvm.errors import KorchError
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.kernels.weight_packing import mark_layout_free_weights
from korch_tvm.lowering.constant_folding import fold_constants
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.layout.activations import convert_layout
from korch_tvm.pipeline import passes
from korch_tvm.pipeline.korch import korch_report, run_korch
from korch_tvm.pipeline.stock import run_stock, stock_fusion
from korch_tvm.pipeline.stock import stock_report as stock_report_of

LLVM = {"kind": "llvm", "num-cores": 2}


def _names(pipeline) -> list[str]:
    return [step.info.name for step in pipeline.passes]


KORCH_STEPS = ["korch_tvm.PlanKorch", "korch_tvm.UseLibraryKernels", "korch_tvm.ApplyTuningLog",
               "korch_tvm.ShareIdenticalKernels"]
STOCK_STEPS = ["korch_tvm.StockPass", "korch_tvm.ApplyTuningLog"]


def test_the_pipelines_print_their_passes_in_order():
    config = KorchConfig(target=LLVM)
    with CostingSession.open(config) as session:
        korch = passes.korch_pipeline(config, session)
        stock = passes.stock_pipeline(config, session)
    assert korch.info.name == "korch_tvm.korch_pipeline" and _names(korch) == KORCH_STEPS
    assert stock.info.name == "korch_tvm.stock_pipeline" and _names(stock) == STOCK_STEPS
    printed = str(korch)
    positions = [printed.index(f'name="{name}"') for name in KORCH_STEPS]
    assert positions == sorted(positions), printed
    assert 'name="korch_tvm.StockPass"' in str(stock)
    reordered = tvm.transform.Sequential(list(reversed(korch.passes)))  # a list one can reorder
    assert _names(reordered) == KORCH_STEPS[::-1]


def test_each_stage_pass_is_its_stage_function():
    module = import_onnx(make_tiny_onnx(8, 16))
    target = KorchConfig(target=LLVM).target
    tvm.ir.assert_structural_equal(passes.LowerToPrimitives()(module), lower_to_primitives(module))
    tvm.ir.assert_structural_equal(passes.FoldConstants()(module), fold_constants(module))
    fused = passes.StockFusion(target)(module)
    tvm.ir.assert_structural_equal(fused, stock_fusion(module, target))
    tvm.ir.assert_structural_equal(passes.MarkLayoutFreeWeights()(fused),
                                   mark_layout_free_weights(fused))
    assert passes.ConvertLayout("NCHW").info.name == "korch_tvm.ConvertLayout"
    with pytest.raises(Exception, match="unknown layout 'NCWH'"):
        passes.ConvertLayout("NCWH")(module)


@pytest.mark.parametrize("raised", [OSError(errno.ENOSPC, "No space left on device"),
                                    KorchError("the model is bad"), KeyboardInterrupt()])
def test_a_path_pass_failure_comes_out_of_the_pipeline_as_itself(monkeypatch, raised):
    """TVM's FFI turns an OSError, a KorchError or a Ctrl-C raised in a pass into a
    RuntimeError; the CLI tells the user's fault from the machine's by the type."""
    def fail(mod, config, session=None, **_):
        raise raised

    monkeypatch.setattr(passes, "choose_stock_layout", fail)
    monkeypatch.setattr(passes, "plan_korch", fail)
    config = KorchConfig(target=LLVM)
    module = import_onnx(make_tiny_onnx(8, 16))
    with CostingSession.open(config) as session:
        with pytest.raises(BaseException) as plain:  # what TVM makes of it
            passes.stock_pipeline(config, session)(module)
        assert type(plain.value) is RuntimeError
        path = passes.StockPass(config, session)
        with pytest.raises(type(raised)) as kept:
            passes.run_pipeline(passes.stock_pipeline(config, session, path), module, path)
        assert kept.value is raised
    korch = passes.KorchPass(config)  # a pipeline run inside a pass: still the very exception
    with pytest.raises(type(raised)) as kept:
        passes.run_pipeline(tvm.transform.Sequential([korch]), module, korch)
    assert kept.value is raised


def _comparable(report):
    """A path's report without its times (stage and solver seconds: all that differs from run
    to run)."""
    if isinstance(report, list):
        return [_comparable(item) for item in report]
    if not isinstance(report, dict):
        return report
    return {key: _comparable(value) for key, value in report.items()
            if key not in ("stage_seconds", "seconds")}


def test_running_the_pipelines_equals_the_function_path():
    """Same module built, same report. A spent time budget predicts every cost (nothing is
    measured), so every run plans with the same numbers."""
    config = KorchConfig(target=LLVM, layout="NCHW", time_budget=0.0)
    module = import_onnx(make_tiny_onnx(16, 32))
    by_function, function_report = run_korch(module, config)
    assert function_report["plan"]["kernels"] and "kernels_scheduled_from_log" in function_report
    with CostingSession.open(config) as session:
        planning = passes.PlanKorch(config, session)
        by_pipeline = passes.run_pipeline(passes.korch_pipeline(config, session, planning),
                                          module, planning)
        pipeline_report = korch_report(planning.last_plan, by_pipeline, planning.planned_at)
    tvm.ir.assert_structural_equal(by_pipeline, by_function)
    assert _comparable(pipeline_report) == _comparable(function_report)
    korch = passes.KorchPass(config)  # the whole pipeline as one pass, in a user's Sequential
    by_pass = passes.run_pipeline(tvm.transform.Sequential([korch]), module, korch)
    tvm.ir.assert_structural_equal(by_pass, by_function)
    assert _comparable(korch.last_report) == _comparable(function_report)
    assert korch.last_plan.chosen_groups == [frozenset(kernel["primitives"])
                                             for kernel in function_report["plan"]["kernels"]]

    stock_by_function, stock_report = run_stock(module, config)
    with CostingSession.open(config) as session:
        stock = passes.StockPass(config, session)
        stock_by_pipeline = passes.run_pipeline(passes.stock_pipeline(config, session, stock),
                                                module, stock)
        stock_pipeline_report = stock_report_of(stock.last_choice, stock_by_pipeline,
                                                session.tuning_log)
    tvm.ir.assert_structural_equal(stock_by_pipeline, stock_by_function)
    assert stock_pipeline_report == stock_report and stock_report["kernels"]
    # the stock path's fusion of the model in the layout asked for (NCHW: the forms every
    # layout shares, layout/activations.py)
    tvm.ir.assert_structural_equal(stock.last_choice.fused,
                                   stock_fusion(convert_layout(module, "NCHW"), config.target))


def test_the_package_hands_out_the_pipelines_and_the_pass():
    import korch_tvm

    config = korch_tvm.KorchConfig(target=LLVM)
    assert korch_tvm.KorchPass is passes.KorchPass
    with CostingSession.open(config) as session:
        assert _names(korch_tvm.korch_pipeline(config, session)) == KORCH_STEPS
        assert _names(korch_tvm.stock_pipeline(config, session)) == STOCK_STEPS
