"""The OpenBLAS extension's packed functions against numpy, and their refusals."""

import numpy as np
import pytest
import tvm
import tvm_ffi

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape, dtype="float32")


def call(name, a, b, transa, transb, out_shape):
    c = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype="float32"))
    tvm.get_global_func(f"korch_tvm.blas.{name}")(
        tvm.runtime.tensor(a), tvm.runtime.tensor(b), transa, transb, c)
    return c.numpy()


def rel_err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("transa,transb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_sgemm_matches_numpy_for_every_transpose(blas_extension, transa, transb):
    a = rand(13, 9) if transa else rand(9, 13)
    b = rand(11, 13) if transb else rand(13, 11)
    want = (a.T if transa else a) @ (b.T if transb else b)
    assert rel_err(call("sgemm", a, b, transa, transb, (9, 11)), want) <= 1e-5


def test_sbgemm_batched_shared_and_rank_four(blas_extension):
    q, k = rand(3, 17, 8), rand(3, 19, 8)
    assert rel_err(call("sbgemm", q, k, 0, 1, (3, 17, 19)), q @ k.transpose(0, 2, 1)) <= 1e-5
    x, w = rand(2, 3, 5, 6), rand(6, 4)                       # one weight shared by every batch
    assert rel_err(call("sbgemm", x, w, 0, 0, (2, 3, 5, 4)), x @ w) <= 1e-5
    p, v = rand(6, 4), rand(2, 6, 7)                          # shared A, transposed
    assert rel_err(call("sbgemm", p, v, 1, 0, (2, 4, 7)), p.T @ v) <= 1e-5
    x, w = rand(2, 5, 5, 8), rand(1, 1, 8, 6)                 # a 1x1 NHWC convolution (HWIO)
    assert rel_err(call("sbgemm", x, w, 0, 0, (2, 5, 5, 6)), x @ w[0, 0]) <= 1e-5
    x, w = rand(2, 5, 8), rand(1, 6, 8)                       # shared, leading 1, transposed
    assert rel_err(call("sbgemm", x, w, 0, 1, (2, 5, 6)), x @ w[0].T) <= 1e-5
    p, v = rand(1, 6, 4), rand(3, 6, 7)
    assert rel_err(call("sbgemm", p, v, 1, 0, (3, 4, 7)), p[0].T @ v) <= 1e-5


def test_threads_follow_the_request(blas_extension):
    set_threads = tvm.get_global_func("korch_tvm.blas.set_num_threads")
    threads = tvm.get_global_func("korch_tvm.blas.num_threads")
    before = threads()
    assert set_threads(1) == 1 and threads() == 1
    assert set_threads(4096) == before                  # never more than TVM's thread pool
    a, b = rand(300, 260), rand(260, 280)                 # big enough to run on several threads
    assert rel_err(call("sgemm", a, b, 0, 0, (300, 280)), a @ b) <= 1e-5
    q, k = rand(4, 150, 64), rand(4, 170, 64)
    assert rel_err(call("sbgemm", q, k, 0, 1, (4, 150, 170)), q @ k.transpose(0, 2, 1)) <= 1e-5
    with pytest.raises(ValueError, match="need 1..4096 threads"):
        set_threads(0)


def test_bad_operands_fail_with_a_clear_error_and_write_nothing(blas_extension):
    sgemm = tvm.get_global_func("korch_tvm.blas.sgemm")
    sbgemm = tvm.get_global_func("korch_tvm.blas.sbgemm")
    a, b = tvm.runtime.tensor(rand(4, 5)), tvm.runtime.tensor(rand(5, 3))
    small = tvm.runtime.tensor(np.zeros((4, 2), "float32"))
    with pytest.raises(ValueError, match=r"C must be \[4, 3\]"):
        sgemm(a, b, 0, 0, small)
    assert not small.numpy().any()
    with pytest.raises(ValueError, match="reduction sizes differ: A gives 5, B gives 3"):
        sgemm(a, b, 0, 1, tvm.runtime.tensor(np.zeros((4, 5), "float32")))
    with pytest.raises(ValueError, match="A must be float32"):
        sgemm(tvm.runtime.tensor(rand(4, 5).astype("float64")), b, 0, 0,
              tvm.runtime.tensor(np.zeros((4, 3), "float32")))
    with pytest.raises(ValueError, match="must all have rank 2"):
        sgemm(tvm.runtime.tensor(rand(1, 4, 5)), b, 0, 0,
              tvm.runtime.tensor(np.zeros((1, 4, 3), "float32")))
    with pytest.raises(ValueError, match="A axis 0 is 2 but C's is 3"):
        sbgemm(tvm.runtime.tensor(rand(2, 4, 5)), b, 0, 0,
               tvm.runtime.tensor(np.zeros((3, 4, 3), "float32")))
    strided = tvm_ffi.from_dlpack(rand(4, 10)[:, ::2])         # a view, not compact
    with pytest.raises(ValueError, match="A must be compact row-major"):
        sgemm(strided, b, 0, 0, tvm.runtime.tensor(np.zeros((4, 3), "float32")))
