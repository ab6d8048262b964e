"""In-model time by kernel kind: TVM's VM instrument hook and ONNX Runtime's profiler."""

import time

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm import KorchConfig, compile_model
from korch_tvm.tools.kind_profile import (LIBRARY, PROFILE_KINDS, RUNTIME, kind_table,
                                          ort_profiled_kind_times, tvm_kind_times)
from test_weight_packing import conv_block_onnx

INPUT = np.random.default_rng(0).standard_normal((1, 16, 14, 14)).astype("float32")


@pytest.mark.parametrize("korch", [False, True])
def test_tvm_kinds_cover_the_convolutions_and_add_up_to_a_run(korch):
    # TVM kernels only: with library kernels on, whether a 1x1 convolution runs as a BLAS call
    # (timed as "library") depends on this machine's measurements
    executable, report = compile_model(conv_block_onnx(), korch=korch, verify=False,
                                       config=KorchConfig(library="off"))
    kinds = report["kernel_kinds"]
    assert sorted(set(kinds.values()) - {"memory"}) == ["conv1x1", "conv3x3", "conv_depthwise"]
    device = tvm.cpu(0)
    vm = relax.VirtualMachine(executable, device)
    args = [tvm.runtime.tensor(INPUT, device)]
    # the least of three profiles and of five plain runs: a busy machine only adds time
    profile = min((tvm_kind_times(vm, args, kinds, runs=3) for _ in range(3)),
                  key=lambda times: sum(times.values()))
    assert set(profile) == set(PROFILE_KINDS)
    for kind in ("conv1x1", "conv3x3", "conv_depthwise"):
        assert profile[kind] > 0, kind
    assert profile["matmul"] == 0 and profile[LIBRARY] == 0 and profile[RUNTIME] >= 0
    plain = []
    for _ in range(5):
        started = time.perf_counter()
        vm["main"](*args)
        plain.append((time.perf_counter() - started) * 1e3)
    # the kinds account for the run: at most a little more (per-call timing), never much less
    assert 0.5 * min(plain) <= sum(profile.values()) <= 3 * min(plain) + 1.0
    vm["main"](*args)  # the hook is removed afterwards


def test_ort_profile_by_kind_and_the_table():
    ort = pytest.importorskip("onnxruntime")
    model = conv_block_onnx().SerializeToString()

    def session(options):
        options.intra_op_num_threads = 1
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    profile = ort_profiled_kind_times(session, {"x": INPUT}, runs=3)
    for kind in ("conv1x1", "conv3x3", "conv_depthwise"):
        assert profile[kind] > 0, kind
    assert profile[RUNTIME] == 0
    rows = kind_table({"onnxruntime": profile, "other": {**profile, "conv3x3": 1.0}})
    assert rows[0].split() == ["kind", "onnxruntime", "other"]
    assert any(row.split()[0] == "conv3x3" and row.split()[-2] == "1.000" for row in rows)
    assert rows[-1].split()[0] == "total" and "matmul" not in " ".join(rows)


def test_library_calls_are_a_kind_of_their_own_not_memory():
    from korch_tvm.costing.in_model import library_call_name
    from korch_tvm.tools.kind_profile import LIBRARY, _kernel_name, sum_by_kind

    names = [_kernel_name(s) for s in ("korch_tvm.blas.sconv2d", "korch_tvm.cublas.sgemm",
                                        "vm.builtin.alloc_tensor", "fused_add")]
    assert names == [LIBRARY, LIBRARY, RUNTIME, "fused_add"]
    totals = sum_by_kind({library_call_name(0): 1.5, library_call_name(1): 0.5, RUNTIME: 0.5,
                          "fused_add": 0.25, "k1": 1.0},
                         {"k1": "conv3x3"})
    assert (totals[LIBRARY], totals[RUNTIME], totals["memory"], totals["conv3x3"]) == \
        (2.0, 0.5, 0.25, 1.0)


def test_library_calls_are_told_apart_by_their_order_in_a_run(blas_extension):
    """Two GEMMs of one function, both library calls: the hook sees one packed function
    twice, and the profile names them by their order (costing/in_model.py joins each with its
    plan kernel by it)."""
    from tvm import te

    from korch_tvm.costing.in_model import library_call_name
    from korch_tvm.library import UseLibraryGemm
    from korch_tvm.tools.kind_profile import sum_by_kind, tvm_kernel_times

    def gemm(a, b):
        k = te.reduce_axis((0, a.shape[1]), "k")
        return te.compute((a.shape[0], b.shape[1]), lambda i, j: te.sum(a[i, k] * b[k, j],
                                                                         axis=k))

    bb = relax.BlockBuilder()
    a, b, c = (relax.Var(n, relax.TensorType(s, "float32"))
               for n, s in (("a", (64, 48)), ("b", (48, 32)), ("c", (32, 16))))
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            first = bb.emit_te(gemm, a, b, primfunc_name_hint="gemm_first")
            out = bb.emit_output(bb.emit_te(gemm, first, c, primfunc_name_hint="gemm_second"))
        bb.emit_func_output(out)
    mod = UseLibraryGemm()(relax.transform.LegalizeOps()(bb.get()))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s, dtype="float32"))
            for s in ((64, 48), (48, 32), (32, 16))]
    times = tvm_kernel_times(vm, args, runs=3, warmup=1)
    assert {library_call_name(0), library_call_name(1)} <= set(times)
    assert library_call_name(2) not in times and LIBRARY not in times
    totals = sum_by_kind(times, {})
    assert totals[LIBRARY] == pytest.approx(times[library_call_name(0)]
                                            + times[library_call_name(1)])
