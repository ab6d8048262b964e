"""The cuBLAS extension's build path, as far as a host without a GPU can take it."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from korch_tvm.library import LibraryBuildError, export_library
from korch_tvm.library import cublas_build


def test_without_nvcc_the_build_says_so_in_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LibraryBuildError, match="^nvcc not found"):
        cublas_build.build_cublas_extension(tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this host")
def test_without_cublas_headers_the_build_names_what_to_install(tmp_path):
    with pytest.raises(LibraryBuildError, match="cuBLAS headers and library not found in .*"
                                                "pip install nvidia-cublas"):
        cublas_build.build_cublas_extension(tmp_path, cublas_root=tmp_path)
    assert not list(tmp_path.iterdir())


def _cublas_root():
    """cuBLAS from the toolkit or NVIDIA's wheels, else a folder the tester names (headers and
    libraries unpacked from the nvidia-cublas wheel), else None."""
    if shutil.which("nvcc") is None:
        return None
    named = os.environ.get("KORCH_TVM_TEST_CUBLAS_ROOT")
    try:
        return cublas_build.find_cublas(cublas_build.find_nvcc(), named)[1].parent.parent
    except LibraryBuildError:
        return None


@pytest.mark.slow
@pytest.mark.skipif(_cublas_root() is None, reason="no nvcc with cuBLAS headers on this host")
def test_cublas_extension_compiles_loads_and_refuses_host_tensors(tmp_path):
    shared = cublas_build.build_cublas_extension(tmp_path, cublas_root=_cublas_root())
    object_path, shared_path = cublas_build.cublas_artifacts(tmp_path)
    assert shared == shared_path and object_path.is_file()
    tvm_ffi.load_module(str(shared))                       # registration needs no GPU
    sgemm = tvm.get_global_func("korch_tvm.cublas.sgemm")
    host = [tvm.runtime.tensor(np.zeros(s, "float32")) for s in ((4, 5), (5, 3), (4, 3))]
    with pytest.raises(ValueError, match="korch_tvm.cublas.sgemm: A must be on cuda:0"):
        sgemm(host[0], host[1], 0, 0, host[2])
    # an export made with cuda=True loads the extension by itself in a fresh process
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    export_library(tvm.compile(bb.get(), target="llvm"), tmp_path / "model.so",
                   directory=tmp_path, cuda=True)
    probe = ("import sys, tvm; tvm.runtime.load_module(sys.argv[1]); "
             "print(tvm.get_global_func('korch_tvm.cublas.sbgemm', allow_missing=True) is not None)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "model.so")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


@pytest.mark.gpu
def test_cublas_gemm_matches_numpy_on_a_gpu(tmp_path):
    if not tvm.cuda(0).exist or _cublas_root() is None:
        pytest.skip("needs a CUDA device and cuBLAS headers")
    tvm_ffi.load_module(str(cublas_build.build_cublas_extension(tmp_path,
                                                                cublas_root=_cublas_root())))
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((3, 17, 8), dtype="float32"), rng.standard_normal((3, 19, 8),
                                                                                dtype="float32")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.zeros((3, 17, 19), "float32"), dev)
    tvm.get_global_func("korch_tvm.cublas.sbgemm")(
        tvm.runtime.tensor(q, dev), tvm.runtime.tensor(k, dev), 0, 1, out)
    want = q @ k.transpose(0, 2, 1)
    assert np.abs(out.numpy() - want).max() / np.abs(want).max() <= 1e-5


CUDA_STUBS = {   # just enough declarations for a host compiler to check cublas_ext.cu's C++
    "cuda_runtime.h": "int cudaSetDevice(int);\n",
    "cublas_v2.h": """
typedef struct cublasContext* cublasHandle_t;
typedef struct CUstream_st* cudaStream_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
cublasStatus_t cublasCreate(cublasHandle_t*);
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t, cublasOperation_t,
    int, int, int, const float*, const float*, int, long long, const float*, int, long long,
    const float*, float*, int, long long, int);
"""}


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this host")
def test_the_cuda_source_and_its_shared_checks_pass_a_host_syntax_check(tmp_path):
    """Without nvcc: the .cu file, with the operand-check header it shares with blas_ext.cc,
    is checked as C++ against stub CUDA headers, so an edit of the header cannot break it
    unseen."""
    import tvm_ffi.libinfo
    for name, text in CUDA_STUBS.items():
        (tmp_path / name).write_text(text)
    for source in (cublas_build.CUBLAS_SOURCE, cublas_build.SOURCE_DIR / "gemm_operands.h"):
        done = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-x", "c++",
                               f"-I{tmp_path}", f"-I{tvm_ffi.libinfo.find_include_path()}",
                               str(source)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    assert '#include "gemm_operands.h"' in cublas_build.CUBLAS_SOURCE.read_text()
