"""GEMM epilogues inside the library call: each form the matcher accepts computes what TVM's
fused kernel computes (max error relative to the output's largest value <= 1e-5), forms it must
not accept are left to TVM, and the extension refuses operands that do not fit."""

import math
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax, te

from korch_tvm.costing.library_costs import entry_key, entry_problem
from korch_tvm.library import UseLibraryGemm, export_library, implementations_for, match_gemm
from korch_tvm.lowering.fast_math import legalize_ops
from korch_tvm.lowering.fission import lower_to_primitives

R = relax.op
M, K, N = 24, 40, 36


def const(value):
    return relax.const(value, "float32")


def hardswish(x):
    return R.divide(R.multiply(x, R.clip(R.add(x, const(3.0)), 0.0, 6.0)), const(6.0))


def fused_module(shapes, body):
    """`body(*inputs)` lowered as the Korch path lowers it (fission, fast-math legalization),
    then fused by FuseOps: the GEMM and what follows it become one kernel."""
    bb = relax.BlockBuilder()
    inputs = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", inputs):
        with bb.dataflow():
            out = bb.emit_output(body(*inputs))
        bb.emit_func_output(out)
    lowered = lower_to_primitives(bb.get())
    return tvm.transform.Sequential([
        legalize_ops(True), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
        relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(lowered)


def kernels(mod):
    return [tvm.IRModule({"main": f}) for _, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)]


def run(mod, arrays):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


MATMUL = [(2, M, K), (K, N)]


def residuals(count):
    """The matmul plus `count` tensors of its shape, added one after the other."""
    def body(x, w, *added):
        out = R.matmul(x, w)
        for residual in added:
            out = R.add(out, residual)
        return out
    return MATMUL + [(2, M, N)] * count, body

CASES = {   # name: (input shapes, body, the steps matched)
    "relu": (MATMUL + [(N,)], lambda x, w, b: R.nn.relu(R.add(R.matmul(x, w), b)),
             ["bias_n", "relu"]),
    "relu6": (MATMUL + [(N,)], lambda x, w, b: R.clip(R.add(b, R.matmul(x, w)), 0.0, 6.0),
              ["bias_n", "clip:0.0:6.0"]),
    "gelu_erf": (MATMUL + [(N,)], lambda x, w, b: R.nn.gelu(R.add(R.matmul(x, w), b)),
                 ["bias_n", "gelu_erf"]),
    "gelu_tanh": (MATMUL + [(N,)], lambda x, w, b: R.nn.gelu_tanh(R.add(R.matmul(x, w), b)),
                  ["bias_n", "gelu_tanh"]),
    "sigmoid": (MATMUL + [(N,)], lambda x, w, b: R.sigmoid(R.add(R.matmul(x, w), b)),
                ["bias_n", "sigmoid"]),
    "silu": (MATMUL + [(N,)], lambda x, w, b: R.nn.silu(R.add(R.matmul(x, w), b)),
             ["bias_n", "silu"]),
    "hardswish": (MATMUL + [(N,)], lambda x, w, b: hardswish(R.add(R.matmul(x, w), b)),
                  ["bias_n", "hardswish"]),
    "eight residuals": (*residuals(8), ["residual"] * 8),  # MAX_STEPS
    "residual": (MATMUL + [(N,), (2, M, N)],
                 lambda x, w, b, r: R.add(R.add(R.matmul(x, w), b), r), ["bias_n", "residual"]),
    "bias_m": ([(M, K), (K, N), (M, 1)], lambda x, w, b: R.nn.relu(R.add(R.matmul(x, w), b)),
               ["bias_m", "relu"]),
    "conv1x1_bias_relu": ([(2, 5, 5, K), (1, 1, K, N), (1, 1, 1, N)], lambda x, w, b: R.nn.relu(
        R.add(R.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO"), b)),
        ["bias_n", "relu"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_epilogue_form_matches_tvm_s_fused_kernel(blas_extension, name):
    shapes, body, steps = CASES[name]
    mod = fused_module(shapes, body)
    [kernel] = [k for k in kernels(mod) if match_gemm(k) is not None]
    assert [step.token() for step in match_gemm(kernel).epilogue] == steps
    [implementation] = implementations_for(kernel)
    assert implementation.name.split("+")[1:] == steps
    library = UseLibraryGemm()(mod)
    assert not kernels(library), "the whole fused kernel became the library call"
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s, dtype="float32") for s in shapes]
    assert rel_err(run(library, arrays), run(mod, arrays)) <= 1e-5


def gelu_with(scale):
    """0.5 x (1 + erf(x * scale)): gelu only for scale = 1/sqrt(2)."""
    def body(x, w, b):
        y = R.add(R.matmul(x, w), b)
        return R.multiply(R.multiply(y, const(0.5)),
                          R.add(const(1.0), R.erf(R.multiply(y, const(scale)))))
    return body


NOT_EPILOGUES = {
    "gelu, wrong constant": (MATMUL + [(N,)], gelu_with(0.7)),
    "scaled": (MATMUL, lambda x, w: R.multiply(R.matmul(x, w), const(2.0))),
    "bias subtracted": (MATMUL + [(N,)], lambda x, w, b: R.subtract(R.matmul(x, w), b)),
    "bias per batch": (MATMUL + [(2, 1, N)], lambda x, w, b: R.add(R.matmul(x, w), b)),
    "leaky relu": (MATMUL, lambda x, w: R.nn.leakyrelu(R.matmul(x, w), 0.1)),
    "tanh": (MATMUL, lambda x, w: R.tanh(R.matmul(x, w))),
    "nine residuals": residuals(9),  # one more step than a call runs
}


@pytest.mark.parametrize("name", sorted(NOT_EPILOGUES))
def test_other_epilogues_are_not_matched(name):
    shapes, body = NOT_EPILOGUES[name]
    fused = [k for k in kernels(fused_module(shapes, body)) if "matmul" in k["main"].script()]
    assert fused and all(match_gemm(k) is None for k in fused), name


def test_a_kernel_with_a_second_output_is_not_matched():
    x, w, b = (te.placeholder(s, name=n) for s, n in (((M, K), "x"), ((K, N), "w"), ((N,), "b")))
    k = te.reduce_axis((0, K), "k")
    product = te.compute((M, N), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k))
    biased = te.compute((M, N), lambda i, j: product[i, j] + b[j], name="biased")
    relu = te.compute((M, N), lambda i, j: te.max(biased[i, j], tvm.tirx.const(0.0, "float32")))
    assert match_gemm(tvm.IRModule({"main": te.create_prim_func([x, w, b, relu])})) is not None
    assert match_gemm(tvm.IRModule({"main": te.create_prim_func([x, w, b, biased, relu])})) \
        is None


def test_an_exact_gelu_constant_is_matched():
    [kernel] = [k for k in kernels(fused_module(MATMUL + [(N,)], gelu_with(1 / math.sqrt(2.0))))
                if match_gemm(k) is not None]
    assert [step.kind for step in match_gemm(kernel).epilogue] == ["bias_n", "gelu_erf"]


def test_operands_that_do_not_fit_are_refused_before_c_is_written(blas_extension):
    sgemm = tvm.get_global_func("korch_tvm.blas.sgemm")
    tensor = tvm.runtime.tensor
    a, b = tensor(np.ones((4, 5), "float32")), tensor(np.ones((5, 3), "float32"))
    c = tensor(np.zeros((4, 3), "float32"))
    for steps, operands, message in [
            ("bias_n", [np.ones(4, "float32")], "bias_n must have N elements"),
            ("bias_m", [np.ones((3, 1), "float32")], r"bias_m must have M elements"),
            ("residual", [np.ones((3, 4), "float32")], "residual must have C's shape"),
            ("bias_n", [], "'bias_n' has no operand"),
            ("relu", [np.ones(3, "float32")], "1 epilogue operand"),
            ("clip:6:0", [], "bad clip step"),
            ("swish2", [], "unknown epilogue step 'swish2'")]:
        with pytest.raises(ValueError, match=message):
            sgemm(a, b, 0, 0, steps, *[tensor(x) for x in operands], c)
        assert not c.numpy().any(), steps


def test_library_times_keys_name_the_epilogue_and_bad_steps_are_refused(blas_extension):
    [kernel] = [k for k in kernels(fused_module(*CASES["relu6"][:2])) if match_gemm(k)]
    [implementation] = implementations_for(kernel)
    key = entry_key(implementation)
    assert key == ("openblas.sbgemm+bias_n+clip:0.0:6.0 batch=2 m=24 n=36 k=40 ta=0 tb=0 "
                   "ab=1 bb=0")
    assert entry_problem(key, 1e-4) is None
    assert "unknown epilogue step" in entry_problem(key.replace("relu", "elu").replace(
        "clip:0.0:6.0", "tanh"), 1e-4)
    assert "unknown epilogue step" in entry_problem(key.replace("6.0", "inf"), 1e-4)
    assert 0 < implementation.measure(repeats=1) < 1.0


FRESH_RUN = """
import sys, numpy as np, tvm
from tvm import relax, te
folder = sys.argv[1]
vm = relax.VirtualMachine(tvm.runtime.load_module(folder + "/model.so"), tvm.cpu())
inputs = [tvm.runtime.tensor(np.load(f"{folder}/x{i}.npy")) for i in range(3)]
np.save(folder + "/out.npy", vm["main"](*inputs).numpy())
"""


def test_an_exported_epilogue_call_runs_in_a_fresh_process(blas_extension, tmp_path):
    shapes, body, _ = CASES["gelu_erf"]
    mod = fused_module(shapes, body)
    library = UseLibraryGemm()(mod)
    export_library(tvm.compile(library, target="llvm"), tmp_path / "model.so")
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s, dtype="float32") for s in shapes]
    for i, array in enumerate(arrays):
        np.save(tmp_path / f"x{i}.npy", array)
    done = subprocess.run([sys.executable, "-c", FRESH_RUN, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rel_err(np.load(tmp_path / "out.npy"), run(mod, arrays)) <= 1e-5
