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
