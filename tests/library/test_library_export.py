"""UseLibraryGemm + export_library: the exported library runs in a fresh process with TVM only."""

import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax, te

from korch_tvm.library import UseLibraryGemm, export_library, library_calls

CALL_TIR = tvm.ir.Op.get("relax.call_tir")

FRESH_RUN = """
import sys, numpy as np, tvm
from tvm import relax
folder, names = sys.argv[1], sys.argv[2:]
vm = relax.VirtualMachine(tvm.runtime.load_module(folder + "/model.so"), tvm.cpu())
for name in names:
    inputs = [tvm.runtime.tensor(np.load(f"{folder}/{name}{i}.npy")) for i in range(2)]
    np.save(f"{folder}/{name}_out.npy", vm[name](*inputs).numpy())
print("korch_tvm imported:", any(m.startswith("korch_tvm") for m in sys.modules))
"""


def gemm_module(cases):
    """One function per case: name(a, b) = compute(a, b) + 1, a GEMM kernel and an add kernel."""
    bb = relax.BlockBuilder()
    for name, (a_shape, b_shape, compute, _, _) in cases.items():
        a, b = (relax.Var(n, relax.TensorType(s, "float32"))
                for n, s in (("a", a_shape), ("b", b_shape)))
        with bb.function(name, [a, b]):
            with bb.dataflow():
                product = bb.emit_te(compute, a, b, primfunc_name_hint=f"gemm_{name}")
                out = bb.emit_output(relax.op.add(product, relax.const(1.0)))
            bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


def plain(a, b):
    k = te.reduce_axis((0, a.shape[1]), "k")
    return te.compute((a.shape[0], b.shape[1]), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))


def query_key(q, key):
    k = te.reduce_axis((0, q.shape[2]), "k")
    return te.compute((q.shape[0], q.shape[1], key.shape[1]),
                      lambda n, i, j: te.sum(q[n, i, k] * key[n, j, k], axis=k))


def batched(a, b):
    k = te.reduce_axis((0, a.shape[2]), "k")
    return te.compute((a.shape[0], a.shape[1], b.shape[2]),
                      lambda n, i, j: te.sum(a[n, i, k] * b[n, k, j], axis=k))


def conv_1x1(x, w):
    """A 1x1 NHWC convolution written as legalization writes it (a unit window)."""
    ry, rx, rc = (te.reduce_axis((0, n), name) for n, name in ((1, "ry"), (1, "rx"),
                                                                (x.shape[3], "rc")))
    return te.compute((*x.shape[:3], w.shape[3]), lambda n, h, v, f: te.sum(
        x[n, h + ry, v + rx, rc] * w[ry, rx, rc, f], axis=[ry, rx, rc]))


CASES = {
    "conv_1x1": ((2, 6, 6, 16), (1, 1, 16, 24), conv_1x1,
                 lambda x, w: x @ w[0, 0], "korch_tvm.blas.sbgemm"),
    "plain": ((48, 40), (40, 24), plain, lambda a, b: a @ b, "korch_tvm.blas.sgemm"),
    "qk_transposed": ((3, 20, 16), (3, 28, 16), query_key,
                      lambda a, b: a @ b.transpose(0, 2, 1), "korch_tvm.blas.sbgemm"),
    "batched": ((3, 20, 16), (3, 16, 12), batched, lambda a, b: a @ b, "korch_tvm.blas.sbgemm"),
}


def tir_callees(mod, function):
    found = []
    relax.analysis.post_order_visit(mod[function], lambda e: found.append(e.args[0].name_hint)
                                    if isinstance(e, relax.Call) and e.op.same_as(CALL_TIR) else None)
    return found


def test_exported_library_runs_in_a_fresh_process(blas_extension, tmp_path):
    """A plain matmul, attention's QK^T (B transposed), a batched matmul and a 1x1 NHWC
    convolution, in one export."""
    rewritten = UseLibraryGemm()(gemm_module(CASES))
    assert library_calls(rewritten) == {"korch_tvm.blas.sgemm", "korch_tvm.blas.sbgemm"}
    for name in CASES:
        callees = tir_callees(rewritten, name)                  # the GEMM kernel is gone
        assert len(callees) == 1 and callees[0].startswith("add"), (name, callees)
    export_library(tvm.compile(rewritten, target="llvm"), tmp_path / "model.so")
    rng = np.random.default_rng(1)
    inputs = {}
    for name, (a_shape, b_shape, _, _, _) in CASES.items():
        inputs[name] = [rng.standard_normal(s, dtype="float32") for s in (a_shape, b_shape)]
        for i, array in enumerate(inputs[name]):
            np.save(tmp_path / f"{name}{i}.npy", array)
    done = subprocess.run([sys.executable, "-c", FRESH_RUN, str(tmp_path), *CASES],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "korch_tvm imported: False" in done.stdout
    for name, (_, _, _, reference, _) in CASES.items():
        want = reference(*inputs[name]) + 1.0
        got = np.load(tmp_path / f"{name}_out.npy")
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-5, name


def test_only_the_named_kernels_are_replaced_and_a_wrong_name_is_refused(blas_extension):
    mod = gemm_module({"plain": CASES["plain"]})
    named = UseLibraryGemm(kernels=["gemm_plain"])(mod)
    assert tir_callees(named, "plain") == ["add"]
    assert library_calls(named) == {"korch_tvm.blas.sgemm"}
    untouched = UseLibraryGemm(kernels=[])(mod)
    assert sorted(tir_callees(untouched, "plain")) == ["add", "gemm_plain"]
    assert not library_calls(untouched)
    with pytest.raises(ValueError, match="kernel add is not a float32 GEMM or convolution"):
        UseLibraryGemm(kernels=["add"])(mod)
    with pytest.raises(ValueError, match="kernel nothing is not called"):
        UseLibraryGemm(kernels=["nothing"])(mod)
