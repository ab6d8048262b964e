"""Fission on the bundled real models (a BERT layer, a SegFormer-b0 encoder block)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import MODELS
from korch_tvm.frontend.onnx_import import import_onnx, input_shapes, load_onnx
from korch_tvm.lowering.fission import lower_to_primitives, lowering_stats
from korch_tvm.lowering.primitive_kinds import OPAQUE


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("name", ["bert_layer.onnx", "segformer_block.onnx"])
def test_lowering_real_models_keeps_outputs(name):
    model = load_onnx(MODELS / name)
    (shape,) = input_shapes(model).values()
    mod = import_onnx(model)
    lowered = lower_to_primitives(mod)
    stats = lowering_stats(mod, lowered)
    assert stats["composite_lowered"].get("relax.nn.layer_norm", 0) >= 2
    assert stats["composite_lowered"].get("relax.nn.softmax", 0) == 1
    assert stats["primitives_by_kind"].get(OPAQUE, 0) == 0
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    before, after = _run(mod, x), _run(lowered, x)
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()
