"""FoldConstant with the data moves and exact arithmetic on constants done in numpy."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import convert_layout
from korch_tvm.lowering.constant_folding import _ConstantsInNumpy, fold_constants
from korch_tvm.lowering.mutation import mutate_relax_functions
from test_weight_packing import conv_block_onnx


def fold_constant(mod):
    """What `fold_constants` stands for: FoldConstant, then the unused bindings removed."""
    return relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))


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
    assert tvm_ffi.structural_equal(fold_constants(model), fold_constant(model),
                                    map_free_vars=True)
    # the numpy pass alone leaves FoldConstant (an LLVM build per call) nothing to move
    moved = mutate_relax_functions(_ConstantsInNumpy(model), model)
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
    assert tvm_ffi.structural_equal(folded, fold_constant(mod),
                                    map_free_vars=True)
    constants = []
    relax.analysis.post_order_visit(
        folded["main"], lambda e: constants.append(e.value.numpy())
        if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy") else None)
    expected = (np.transpose(data).reshape(24) * 2)
    assert any(c.shape == (24,) and np.array_equal(c, expected) for c in constants)


def _batch_norm_factor_module(variance, gamma, extra=None):
    """x * (gamma * rsqrt(variance + eps)) reshaped per channel, as a lowered batch norm has
    it, through bindings; `extra(factor)` adds a call on the folded factor."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, len(gamma), 2, 2), str(gamma.dtype)))
    with bb.function("main", [x]):
        with bb.dataflow():
            shifted = bb.emit(relax.op.add(relax.const(variance), relax.const(1e-5, "float32")))
            factor = bb.emit(relax.op.multiply(relax.op.rsqrt(shifted), relax.const(gamma)))
            if extra is not None:
                factor = bb.emit(extra(factor))
            aligned = bb.emit(relax.op.reshape(factor, (1, len(gamma), 1, 1)))
            out = bb.emit_output(relax.op.multiply(x, aligned))
        bb.emit_func_output(out)
    return bb.get()


def test_batch_norm_factors_bit_for_bit_as_fold_constant_without_it(monkeypatch):
    rng = np.random.default_rng(0)
    variance = rng.uniform(1e-4, 10.0, 257).astype("float32")  # rsqrt rounded twice
    gamma = rng.normal(size=257).astype("float32")
    mod = _batch_norm_factor_module(variance, gamma, lambda f: relax.op.divide(
        relax.op.subtract(f, relax.const(0.5, "float32")), relax.const(3.0, "float32")))
    expected = fold_constant(mod)
    built = []
    real = relax.transform.FoldConstant
    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: built.append(1) or real())
    folded = fold_constants(mod)
    assert built == []  # numpy folded everything: no LLVM build, no legalizing pass
    assert tvm_ffi.structural_equal(folded, expected, map_free_vars=True)  # the same bits
    factor = (gamma * (np.float32(1) / np.sqrt(variance + np.float32(1e-5))) - 0.5) / 3
    constants = []
    relax.analysis.post_order_visit(
        folded["main"], lambda e: constants.append(e.value.numpy())
        if isinstance(e, tvm.ir.expr.Constant) and hasattr(e.value, "numpy") else None)
    assert any(c.shape == (1, 257, 1, 1) and np.array_equal(c.ravel(), factor.astype("float32"))
               for c in constants)


@pytest.mark.parametrize("extra", [lambda f: relax.op.exp(f),                 # not exact in numpy
                                   lambda f: relax.op.nn.relu(f)])  # not arithmetic
def test_what_numpy_does_not_fold_is_left_to_fold_constant(extra):
    variance = np.linspace(0.5, 2.0, 16, dtype="float32")
    mod = _batch_norm_factor_module(variance, np.ones(16, "float32"), extra)
    folded = fold_constants(mod)
    assert calls_on_constants(folded) == []
    assert tvm_ffi.structural_equal(folded, fold_constant(mod),
                                    map_free_vars=True)


def test_a_prim_value_argument_is_not_taken_for_a_tensor():
    """TVM 0.27 makes prim values `Constant`s too: `arange`'s bounds are left to FoldConstant."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            steps = bb.emit(relax.op.arange(0, 4, 1, "float32"))
            out = bb.emit_output(relax.op.add(x, steps))
        bb.emit_func_output(out)
    mod = bb.get()
    # read as a tensor, its first bound (an int) would raise here
    assert tvm_ffi.structural_equal(fold_constants(mod), fold_constant(mod), map_free_vars=True)
