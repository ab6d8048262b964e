// The operand checks every korch_tvm GEMM extension makes before calling its library (OpenBLAS
// in blas_ext.cc, cuBLAS in cublas_ext.cu), so both refuse the same things with the same words:
// dtype, device, rank, compactness, shapes that do not form op(A)[M,K] op(B)[K,N] = C[M,N], batch
// axes that differ from C's, and sizes past the library's 32-bit range.
#ifndef KORCH_TVM_LIBRARY_GEMM_OPERANDS_H_
#define KORCH_TVM_LIBRARY_GEMM_OPERANDS_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <limits>

namespace korch_tvm {
namespace gemm {

using tvm::ffi::TensorView;

// Where the operands must live: the CPU (any id), or one CUDA device.
struct Placement {
  DLDeviceType type;
  int device_id;  // checked on CUDA only
};

inline void CheckOperand(const TensorView& t, const char* fn, const char* name, int min_ndim,
                         Placement where) {
  DLDataType dt = t.dtype();
  if (dt.code != kDLFloat || dt.bits != 32 || dt.lanes != 1) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be float32";
  }
  bool on_cpu = where.type == kDLCPU;
  if (t.device().device_type != where.type || (!on_cpu && t.device().device_id != where.device_id)) {
    if (on_cpu) TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be on the CPU";
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be on cuda:" << where.device_id;
  }
  if (t.ndim() < min_ndim) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must have rank >= " << min_ndim
                              << ", got " << t.ndim();
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be compact row-major";
  }
  if (t.numel() > 0 && t.data_ptr() == nullptr) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " has no data";
  }
}

inline float* DataOf(const TensorView& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// The libraries take 32-bit sizes; a dimension past that range is refused, never truncated.
inline int CheckedInt(int64_t v, const char* fn, const char* library) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    TVM_FFI_THROW(ValueError) << fn << ": dimension " << v << " exceeds " << library
                              << "'s 32-bit range";
  }
  return static_cast<int>(v);
}

struct GemmShape {
  int64_t m, n, k;
};

// The (M, N, K) of op(A) op(B) = C from the last two axes, checked against C.
inline GemmShape MatchShapes(const TensorView& a, const TensorView& b, bool ta, bool tb,
                             const TensorView& c, const char* fn, const char* library) {
  int ra = a.ndim(), rb = b.ndim(), rc = c.ndim();
  int64_t m = ta ? a.size(ra - 1) : a.size(ra - 2);
  int64_t ka = ta ? a.size(ra - 2) : a.size(ra - 1);
  int64_t kb = tb ? b.size(rb - 1) : b.size(rb - 2);
  int64_t n = tb ? b.size(rb - 2) : b.size(rb - 1);
  if (ka != kb) {
    TVM_FFI_THROW(ValueError) << fn << ": reduction sizes differ: A gives " << ka << ", B gives "
                              << kb;
  }
  if (c.size(rc - 2) != m || c.size(rc - 1) != n) {
    TVM_FFI_THROW(ValueError) << fn << ": C must be [" << m << ", " << n
                              << "] in its last two axes, got [" << c.size(rc - 2) << ", "
                              << c.size(rc - 1) << "]";
  }
  CheckedInt(m, fn, library);
  CheckedInt(n, fn, library);
  CheckedInt(ka, fn, library);
  return {m, n, ka};
}

// A batched operand has C's leading dims; a rank-2 one, or one whose leading dims are all 1
// (a [1, 1, C, K] convolution weight), is one matrix shared by every batch.
inline bool IsBatched(const TensorView& x, const TensorView& c, const char* fn, const char* name) {
  bool unit_lead = true;
  for (int i = 0; i + 2 < x.ndim(); ++i) unit_lead = unit_lead && x.size(i) == 1;
  if (unit_lead) return false;
  if (x.ndim() != c.ndim()) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must have rank 2 or C's rank " << c.ndim()
                              << ", got " << x.ndim();
  }
  for (int i = 0; i + 2 < c.ndim(); ++i) {
    if (x.size(i) != c.size(i)) {
      TVM_FFI_THROW(ValueError) << fn << ": " << name << " axis " << i << " is " << x.size(i)
                                << " but C's is " << c.size(i);
    }
  }
  return true;
}

// Everything a GEMM call needs to know once its operands passed the checks.
struct CheckedGemm {
  GemmShape shape;
  bool a_batched, b_batched;
  int64_t batch;  // product of C's leading dims (1 without batches)
};

// The shared prologue of sgemm (`batched` false: A, B and C all rank 2) and sbgemm (C rank >= 3,
// A and B batched like C or shared).
inline CheckedGemm CheckGemm(const TensorView& a, const TensorView& b, bool ta, bool tb,
                             const TensorView& c, bool batched, const char* fn,
                             const char* library, Placement where) {
  CheckOperand(a, fn, "A", 2, where);
  CheckOperand(b, fn, "B", 2, where);
  CheckOperand(c, fn, "C", batched ? 3 : 2, where);
  if (!batched && (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2)) {
    TVM_FFI_THROW(ValueError) << fn << ": A, B and C must all have rank 2 (use sbgemm for batches)";
  }
  bool a_batched = batched && IsBatched(a, c, fn, "A");
  bool b_batched = batched && IsBatched(b, c, fn, "B");
  GemmShape shape = MatchShapes(a, b, ta, tb, c, fn, library);
  int64_t batch = 1;
  for (int i = 0; i + 2 < c.ndim(); ++i) batch *= c.size(i);
  return {shape, a_batched, b_batched, batch};
}

}  // namespace gemm
}  // namespace korch_tvm

#endif  // KORCH_TVM_LIBRARY_GEMM_OPERANDS_H_
