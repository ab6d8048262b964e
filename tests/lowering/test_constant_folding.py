"""FoldConstant with the reshapes and transposes of constants done in numpy."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import convert_layout
from korch_tvm.lowering.constant_folding import _ConstantLayoutsInNumpy, fold_constants
from korch_tvm.lowering.mutation import mutate_relax_functions
from test_weight_packing import conv_block_onnx


def calls_on_constants(mod) -> list[str]:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and any(isinstance(arg, tvm.ir.expr.Constant)
                                                for arg in expr.args[:1]):
            found.append(expr.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_same_module_as_fold_constant_without_building_the_moves():
    model = import_onnx(conv_block_onnx(8, 10), None)
    assert calls_on_constants(model).count("relax.reshape") == 3  # the biases, to rank 4
    # equal constants included: structural equality compares their data
    assert tvm_ffi.structural_equal(fold_constants(model), relax.transform.FoldConstant()(model),
                                    map_free_vars=True)
    # the numpy pass alone leaves FoldConstant (an LLVM build per call) nothing to move
    moved = mutate_relax_functions(_ConstantLayoutsInNumpy(model), model)
    assert calls_on_constants(moved) == []
    nhwc = convert_layout(model, "NHWC")
    assert "relax.permute_dims" not in calls_on_constants(nhwc)  # weights and biases moved


def test_a_transpose_and_a_reshape_of_one_constant():
    data = np.arange(24, dtype="float32").reshape(2, 3, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 3, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            moved = bb.emit(relax.op.permute_dims(relax.const(data), [2, 1, 0]))
            flat = bb.emit(relax.op.reshape(relax.op.permute_dims(relax.const(data)), (24,)))
            out = bb.emit_output(relax.op.add(relax.op.reshape(x, (24,)),
                                              relax.op.add(relax.op.reshape(moved, (24,)), flat)))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = fold_constants(mod)
    assert tvm_ffi.structural_equal(folded, relax.transform.FoldConstant()(mod),
                                    map_free_vars=True)
    constants = []
    relax.analysis.post_order_visit(
        folded["main"], lambda e: constants.append(e.value.numpy())
        if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy") else None)
    expected = (np.transpose(data).reshape(24) * 2)
    assert any(c.shape == (24,) and np.array_equal(c, expected) for c in constants)
