// korch_tvm's CUDA library kernels: float32 GEMM and batched GEMM through cuBLAS, with the
// same registration shape and calling convention as blas_ext.cc, so the Relax rewrite, the
// export and the costing treat both alike:
//   korch_tvm.cublas.sgemm(A, B, transa, transb, C)   C[M,N] = op(A)[M,K] op(B)[K,N]
//   korch_tvm.cublas.sbgemm(A, B, transa, transb, C)  per batch; an operand of rank 2 or with
//       leading dims all 1 is shared (stride 0)
// All tensors row-major, compact, float32, on one CUDA device, checked as blas_ext.cc checks
// them (gemm_operands.h); no epilogue here (a kernel with one keeps its TVM implementation on
// CUDA). The call runs on the stream TVM
// has set for that device (TVMFFIEnvGetStream), so it orders with the surrounding kernels.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <unordered_map>

#include "gemm_operands.h"

namespace {

using korch_tvm::gemm::CheckedGemm;
using korch_tvm::gemm::CheckedInt;
using korch_tvm::gemm::DataOf;
using tvm::ffi::TensorView;

// One handle per device and thread, bound to TVM's current stream before each call.
cublasHandle_t HandleFor(int device) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << "korch_tvm.cublas: cublasCreate failed on cuda:" << device;
  }
  handles.emplace(device, handle);
  return handle;
}

void Gemm(TensorView a, TensorView b, int64_t transa, int64_t transb, TensorView c, bool batched) {
  const char* fn = batched ? "korch_tvm.cublas.sbgemm" : "korch_tvm.cublas.sgemm";
  int device = c.device().device_id;
  bool ta = transa != 0, tb = transb != 0;
  CheckedGemm g = korch_tvm::gemm::CheckGemm(a, b, ta, tb, c, batched, fn, "cuBLAS",
                                             {kDLCUDA, device});
  int m = static_cast<int>(g.shape.m), n = static_cast<int>(g.shape.n);
  int k = static_cast<int>(g.shape.k);
  int batch = CheckedInt(g.batch, fn, "cuBLAS");
  if (m == 0 || n == 0 || batch == 0) return;
  cudaSetDevice(device);
  cublasHandle_t handle = HandleFor(device);
  cublasSetStream(handle, static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device)));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const float alpha = 1.0f, beta = 0.0f;
  cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int lda = ta ? m : k, ldb = tb ? k : n;
  long long stride_a = g.a_batched ? static_cast<long long>(m) * k : 0;
  long long stride_b = g.b_batched ? static_cast<long long>(k) * n : 0;
  cublasStatus_t status = cublasSgemmStridedBatched(
      handle, op_b, op_a, n, m, k, &alpha, DataOf(b), ldb > 0 ? ldb : 1, stride_b, DataOf(a),
      lda > 0 ? lda : 1, stride_a, &beta, DataOf(c), n, static_cast<long long>(m) * n, batch);
  if (status != CUBLAS_STATUS_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << fn << ": cuBLAS returned status " << static_cast<int>(status);
  }
}

void Sgemm(TensorView a, TensorView b, int64_t ta, int64_t tb, TensorView c) {
  Gemm(a, b, ta, tb, c, false);
}

void Sbgemm(TensorView a, TensorView b, int64_t ta, int64_t tb, TensorView c) {
  Gemm(a, b, ta, tb, c, true);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  using tvm::ffi::Function;
  Function::SetGlobal("korch_tvm.cublas.sgemm", Function::FromTyped(Sgemm), true);
  Function::SetGlobal("korch_tvm.cublas.sbgemm", Function::FromTyped(Sbgemm), true);
}
