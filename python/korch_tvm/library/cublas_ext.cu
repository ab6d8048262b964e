// korch_tvm's CUDA library kernels: float32 GEMM and batched GEMM through cuBLAS, with the
// same registration shape and calling convention as blas_ext.cc, so the Relax rewrite, the
// export and the costing treat both alike:
//   korch_tvm.cublas.sgemm(A, B, transa, transb, C)   C[M,N] = op(A)[M,K] op(B)[K,N]
//   korch_tvm.cublas.sbgemm(A, B, transa, transb, C)  per batch; an operand of rank 2 or with
//       leading dims all 1 is shared (stride 0)
// All tensors row-major, compact, float32, on one CUDA device. The call runs on the stream TVM
// has set for that device (TVMFFIEnvGetStream), so it orders with the surrounding kernels.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <limits>
#include <unordered_map>

namespace {

using tvm::ffi::TensorView;

void Check(const TensorView& t, const char* fn, const char* name, int min_ndim, int device) {
  DLDataType dt = t.dtype();
  if (dt.code != kDLFloat || dt.bits != 32 || dt.lanes != 1) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be float32";
  }
  if (t.device().device_type != kDLCUDA || t.device().device_id != device) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be on cuda:" << device;
  }
  if (t.ndim() < min_ndim) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must have rank >= " << min_ndim;
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be compact row-major";
  }
}

float* DataOf(const TensorView& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

int AsInt(int64_t v, const char* fn) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    TVM_FFI_THROW(ValueError) << fn << ": dimension " << v << " exceeds cuBLAS's 32-bit range";
  }
  return static_cast<int>(v);
}

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
  Check(a, fn, "A", 2, device);
  Check(b, fn, "B", 2, device);
  Check(c, fn, "C", batched ? 3 : 2, device);
  int rc = c.ndim(), ra = a.ndim(), rb = b.ndim();
  if (!batched && (ra != 2 || rb != 2 || rc != 2)) {
    TVM_FFI_THROW(ValueError) << fn << ": A, B and C must all have rank 2 (use sbgemm)";
  }
  // As in blas_ext.cc: an operand of rank 2, or with leading dims all 1, is shared.
  bool shared[2];
  const TensorView* operands[2] = {&a, &b};
  for (int o = 0; o < 2; ++o) {
    const TensorView* x = operands[o];
    shared[o] = true;
    for (int i = 0; i + 2 < x->ndim(); ++i) shared[o] = shared[o] && x->size(i) == 1;
    if (shared[o]) continue;
    if (x->ndim() != rc) {
      TVM_FFI_THROW(ValueError) << fn << ": operands must have rank 2 or C's rank";
    }
    for (int i = 0; i + 2 < rc; ++i) {
      if (x->size(i) != c.size(i)) TVM_FFI_THROW(ValueError) << fn << ": batch axes differ";
    }
  }
  bool ta = transa != 0, tb = transb != 0;
  int m = AsInt(ta ? a.size(ra - 1) : a.size(ra - 2), fn);
  int k = AsInt(ta ? a.size(ra - 2) : a.size(ra - 1), fn);
  int kb = AsInt(tb ? b.size(rb - 1) : b.size(rb - 2), fn);
  int n = AsInt(tb ? b.size(rb - 2) : b.size(rb - 1), fn);
  if (k != kb || c.size(rc - 2) != m || c.size(rc - 1) != n) {
    TVM_FFI_THROW(ValueError) << fn << ": shapes do not form op(A)[M,K] op(B)[K,N] = C[M,N]";
  }
  int64_t batch = 1;
  for (int i = 0; i + 2 < rc; ++i) batch *= c.size(i);
  if (m == 0 || n == 0 || batch == 0) return;
  cudaSetDevice(device);
  cublasHandle_t handle = HandleFor(device);
  cublasSetStream(handle, static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device)));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const float alpha = 1.0f, beta = 0.0f;
  cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  int lda = ta ? m : k, ldb = tb ? k : n;
  long long stride_a = shared[0] ? 0 : static_cast<long long>(m) * k;
  long long stride_b = shared[1] ? 0 : static_cast<long long>(k) * n;
  cublasStatus_t status = cublasSgemmStridedBatched(
      handle, op_b, op_a, n, m, k, &alpha, DataOf(b), ldb > 0 ? ldb : 1, stride_b, DataOf(a),
      lda > 0 ? lda : 1, stride_a, &beta, DataOf(c), n, static_cast<long long>(m) * n,
      AsInt(batch, fn));
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
