"""A failed verification's diagnosis builds its trial plans with the plan's library calls kept,
so the kernel it blames is found among the kernels the compile really built."""

import json

import pytest
from pipeline.test_library_kernels import GEMM_KEY, matmul_model  # y = relu(x @ W + b)
from test_reliability import _scale_kernel_outputs as scaled  # a kernel's result times 1.5

from korch_tvm.backend.target import target_tag
from korch_tvm.config import KorchConfig
from korch_tvm.costing.library_costs import LIBRARY_TIMES_FILE
from korch_tvm.errors import KorchError
from korch_tvm.library import library_calls

GEMM = GEMM_KEY.removeprefix("openblas.sgemm ")  # the model's GEMM, in a key of each form


@pytest.mark.slow
def test_the_diagnosis_keeps_the_library_gemm_and_blames_the_tvm_epilogue(
        blas_extension, tmp_path, monkeypatch):
    from korch_tvm.pipeline import compile as compile_module
    from korch_tvm.pipeline import korch

    path = tmp_path / target_tag(KorchConfig().target) / LIBRARY_TIMES_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": 1, "seconds": {   # the bare GEMM wins, fused loses
        f"openblas.sgemm {GEMM}": 1e-7, f"openblas.sgemm+bias_n+relu {GEMM}": 1.0}}))
    original_partition, original_build = korch.partition_module, compile_module.build_executable
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
    monkeypatch.setattr(compile_module, "build_executable", build)
    config = KorchConfig(tuning_logs=str(tmp_path), memory_limit="none", time_budget=0)
    with pytest.raises(KorchError) as error:
        compile_module.compile_model(matmul_model(), korch=True, config=config)
    assert "the first kernel whose output differs is k1 (add + " in str(error.value)
    assert len(built) >= 2, built      # the compile's own build, then the trial plans'
    assert all(calls == {"korch_tvm.blas.sgemm"} for calls in built), built
