"""A failed verification's diagnosis builds its trial plans with the plan's library calls kept,
so the kernel it blames is found among the kernels the compile really built."""

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from korch_tvm.backend.target import target_tag
from korch_tvm.config import KorchConfig
from korch_tvm.costing.library_costs import LIBRARY_TIMES_FILE
from korch_tvm.errors import KorchError
from korch_tvm.library import library_calls

GEMM = "batch=1 m=64 n=96 k=128 ta=0 tb=0 ab=0 bb=0"


def matmul_model():
    """y = relu(x @ W + b)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((128, 96)).astype("float32"), "W"),
               numpy_helper.from_array(rng.standard_normal(96).astype("float32"), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 96])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def scaled(module, name):
    """`main` with kernel `name`'s result times 1.5: a wrong kernel."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class Scale(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir)
                    and value.args[0].name_hint == name):
                return super().visit_var_binding_(binding)
            raw = self.builder_.emit(value, "raw")
            wrong = self.builder_.normalize(relax.op.multiply(raw, relax.const(1.5, "float32")))
            self.builder_.emit_normalized(relax.VarBinding(binding.var, wrong))

    mutator = Scale(module)
    mutator.builder_.update_func(module.get_global_var("main"), mutator.visit_expr(module["main"]))
    return mutator.builder_.get()


@pytest.mark.slow
def test_the_diagnosis_keeps_the_library_gemm_and_blames_the_tvm_epilogue(
        blas_extension, tmp_path, monkeypatch):
    from korch_tvm.pipeline import compile as compile_module
    from korch_tvm.pipeline import korch

    path = tmp_path / target_tag(KorchConfig().target) / LIBRARY_TIMES_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "seconds": {   # the bare GEMM wins, fused loses
        f"openblas.sgemm {GEMM}": 1e-7, f"openblas.sgemm+bias_n+relu {GEMM}": 1.0}}))
    original_partition, original_build = korch.partition_module, compile_module.build
    built = []

    def partition(plan, groups=None):      # the chosen kernel 1 (add + relu) computes wrong
        groups = plan.chosen_groups if groups is None else groups
        wrong = [g for g, group in enumerate(groups)
                 if frozenset(group) == frozenset(plan.chosen_groups[1])]
        module = original_partition(plan, groups)
        return scaled(module, f"korch_k{wrong[0]}") if wrong else module

    def build(mod, target):
        if any(gv.name_hint.startswith("korch_k") for gv in mod.get_global_vars()):
            built.append(library_calls(mod))
        return original_build(mod, target)

    monkeypatch.setattr(korch, "partition_module", partition)
    monkeypatch.setattr(compile_module, "build", build)
    config = KorchConfig(tuning_logs=str(tmp_path), memory_limit="none", time_budget=0)
    with pytest.raises(KorchError) as error:
        compile_module.compile_model(matmul_model(), korch=True, config=config)
    assert "the first kernel whose output differs is k1 (add + " in str(error.value)
    assert len(built) >= 2, built      # the compile's own build, then the trial plans'
    assert all(calls == {"korch_tvm.blas.sgemm"} for calls in built), built
