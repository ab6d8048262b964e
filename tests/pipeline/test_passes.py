"""The compile's steps as named passes, and the stock and Korch pipelines made of them."""

import errno

import pytest
import tvm

from conftest import make_tiny_onnx
from korch_tvm.config import KorchConfig
from korch_tvm.errors import KorchError
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.kernels.weight_packing import mark_layout_free_weights
from korch_tvm.lowering.constant_folding import fold_constants
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.pipeline import passes
from korch_tvm.pipeline.korch import run_korch
from korch_tvm.pipeline.stock import run_stock, stock_fusion

LLVM = {"kind": "llvm", "num-cores": 2}


def _names(pipeline) -> list[str]:
    return [step.info.name for step in pipeline.passes]


def test_the_pipelines_print_their_passes_in_order():
    config = KorchConfig(target=LLVM)
    korch = passes.korch_pipeline(config)
    stock = passes.stock_pipeline(config)
    assert korch.info.name == "korch_tvm.korch_pipeline" and _names(korch) == ["KorchPass"]
    assert stock.info.name == "korch_tvm.stock_pipeline" and _names(stock) == [
        "korch_tvm.StockPass"]
    assert 'name="KorchPass"' in str(korch) and 'name="korch_tvm.StockPass"' in str(stock)


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
    def fail(mod, config):
        raise raised

    monkeypatch.setattr(passes, "run_stock", fail)
    config = KorchConfig(target=LLVM)
    module = import_onnx(make_tiny_onnx(8, 16))
    with pytest.raises(BaseException) as plain:  # what TVM makes of it
        passes.stock_pipeline(config)(module)
    assert type(plain.value) is RuntimeError
    path = passes.StockPass(config)
    with pytest.raises(type(raised)) as kept:
        passes.run_pipeline(passes.stock_pipeline(config, path), module, path)
    assert kept.value is raised


def test_running_the_pipelines_equals_the_function_path():
    """Same module built, same plan. A spent time budget predicts every cost (nothing is
    measured), so both runs plan with the same numbers."""
    config = KorchConfig(target=LLVM, layout="NCHW", time_budget=0.0)
    module = import_onnx(make_tiny_onnx(16, 32))
    by_function, function_report = run_korch(module, config)
    korch = passes.KorchPass(config)
    by_pipeline = passes.run_pipeline(passes.korch_pipeline(config, korch), module, korch)
    tvm.ir.assert_structural_equal(by_pipeline, by_function)

    def chosen(report):
        return [(kernel["primitives"], kernel["key"]) for kernel in report["plan"]["kernels"]]

    assert chosen(korch.last_report) == chosen(function_report) and chosen(function_report)
    assert korch.last_report["plan"]["kernels"] == function_report["plan"]["kernels"]
    assert korch.last_report["modelled_ms"] == function_report["modelled_ms"]
    assert korch.last_plan.chosen_groups == [frozenset(primitives)
                                             for primitives, _ in chosen(function_report)]

    stock_by_function, stock_report = run_stock(module, config)
    stock = passes.StockPass(config)
    stock_by_pipeline = passes.run_pipeline(passes.stock_pipeline(config, stock), module, stock)
    tvm.ir.assert_structural_equal(stock_by_pipeline, stock_by_function)
    def kernels(report):
        return [(k["name"], k["calls"], k["key"], k["kind"]) for k in report["kernels"]]

    assert kernels(stock.last_report) == kernels(stock_report) and kernels(stock_report)


def test_the_package_hands_out_the_pipelines_and_the_pass():
    import korch_tvm

    config = korch_tvm.KorchConfig(target=LLVM)
    assert korch_tvm.KorchPass is passes.KorchPass
    assert _names(korch_tvm.korch_pipeline(config)) == ["KorchPass"]
    assert _names(korch_tvm.stock_pipeline(config)) == ["korch_tvm.StockPass"]
