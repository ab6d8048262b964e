// korch_tvm's CPU library kernels: float32 GEMM and batched GEMM through OpenBLAS
// (scipy-openblas32), registered as tvm-ffi global functions that a Relax module calls with
// R.call_dps_packed. The same object is built into a loadable shared library (for measuring and
// in-process runs) and linked into exported Relax libraries, so the registration runs when
// either is loaded; registering with override lets both be present in one process.
//
// Calling convention (destination-passing, the output last):
//   korch_tvm.blas.sgemm(A, B, transa, transb, C)   C[M,N] = op(A)[M,K] op(B)[K,N]
//   korch_tvm.blas.sbgemm(A, B, transa, transb, C)  the same per batch; C has rank r >= 3,
//       A and B have rank r (same leading dims as C), or rank 2 or leading dims all 1 (one
//       matrix shared by every batch: a dense layer's or a 1x1 NHWC convolution's weight).
// op(X) is X, or X's last two axes swapped when its flag is nonzero. Every tensor must be a
// compact row-major float32 tensor on the CPU; anything else raises a ValueError naming it.
#include <cblas.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

// TVM's CPU thread pool (libtvm_runtime's C backend API, declared here to need no TVM headers).
extern "C" {
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task);
}

namespace {

// OpenBLAS runs its parallel jobs on TVM's thread pool, not on threads of its own: a Relax
// module alternates TVM kernels and BLAS calls, and two pools busy-waiting on the same cores
// made a BLAS call many times slower. OpenBLAS's level-3 jobs wait on each other, so all of
// them must run at once: the BLAS never gets more threads than the pool has.
struct BlasJobs {
  openblas_dojob_callback dojob;
  char* jobdata;
  size_t element_size;
  int dojob_data;
};

int RunBlasJob(int task_id, TVMParallelGroupEnv*, void* cdata) {
  auto* jobs = static_cast<BlasJobs*>(cdata);
  jobs->dojob(task_id, jobs->jobdata + task_id * jobs->element_size, jobs->dojob_data);
  return 0;
}

void RunOnTvmPool(int, openblas_dojob_callback dojob, int numjobs, size_t element_size,
                  void* jobdata, int dojob_data) {
  BlasJobs jobs{dojob, static_cast<char*>(jobdata), element_size, dojob_data};
  TVMBackendParallelLaunch(RunBlasJob, &jobs, numjobs);
}

int TvmPoolSize() {
  std::atomic<int> size{1};
  TVMBackendParallelLaunch(
      [](int, TVMParallelGroupEnv* penv, void* cdata) {
        static_cast<std::atomic<int>*>(cdata)->store(penv->num_task);
        return 0;
      },
      &size, 0);
  return std::max(1, size.load());
}

std::atomic<bool> threads_configured{false};

// At the first call (not at load time: that would start TVM's pool inside dlopen).
void ConfigureThreads() {
  if (threads_configured.exchange(true)) return;
  scipy_openblas_set_threads_callback_function(RunOnTvmPool);
  scipy_openblas_set_num_threads(TvmPoolSize());
}

using tvm::ffi::TensorView;

void CheckFloat32Compact(const TensorView& t, const char* fn, const char* name, int min_ndim) {
  DLDataType dt = t.dtype();
  if (dt.code != kDLFloat || dt.bits != 32 || dt.lanes != 1) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be float32";
  }
  if (t.device().device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << fn << ": " << name << " must be on the CPU";
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

float* DataOf(const TensorView& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// The BLAS takes 32-bit sizes; a dimension past that range is refused, never truncated.
int AsBlasInt(int64_t v, const char* fn) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    TVM_FFI_THROW(ValueError) << fn << ": dimension " << v << " exceeds the BLAS's 32-bit range";
  }
  return static_cast<int>(v);
}

struct GemmShape {
  int64_t m, n, k;
};

// The (M, N, K) of op(A) op(B) = C from the last two axes, checked against C.
GemmShape MatchGemm(const TensorView& a, const TensorView& b, bool ta, bool tb,
                    const TensorView& c, const char* fn) {
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
    TVM_FFI_THROW(ValueError) << fn << ": C must be [" << m << ", " << n << "] in its last two axes, got ["
                              << c.size(rc - 2) << ", " << c.size(rc - 1) << "]";
  }
  AsBlasInt(m, fn);
  AsBlasInt(n, fn);
  AsBlasInt(ka, fn);
  return {m, n, ka};
}

void Gemm(const float* a, const float* b, float* c, bool ta, bool tb, const GemmShape& s) {
  if (s.m == 0 || s.n == 0) return;
  int lda = static_cast<int>(ta ? s.m : s.k), ldb = static_cast<int>(tb ? s.k : s.n);
  scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a,
                    lda < 1 ? 1 : lda, b, ldb < 1 ? 1 : ldb, 0.0f, c,
                    static_cast<int>(s.n) < 1 ? 1 : static_cast<int>(s.n));
}

void Sgemm(TensorView a, TensorView b, int64_t transa, int64_t transb, TensorView c) {
  const char* fn = "korch_tvm.blas.sgemm";
  ConfigureThreads();
  CheckFloat32Compact(a, fn, "A", 2);
  CheckFloat32Compact(b, fn, "B", 2);
  CheckFloat32Compact(c, fn, "C", 2);
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2) {
    TVM_FFI_THROW(ValueError) << fn << ": A, B and C must all have rank 2 (use sbgemm for batches)";
  }
  GemmShape s = MatchGemm(a, b, transa != 0, transb != 0, c, fn);
  Gemm(DataOf(a), DataOf(b), DataOf(c), transa != 0, transb != 0, s);
}

// A batched operand has C's leading dims; a rank-2 one, or one whose leading dims are all 1
// (a [1, 1, C, K] convolution weight), is one matrix shared by every batch.
bool IsBatched(const TensorView& x, const TensorView& c, const char* fn, const char* name) {
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

void Sbgemm(TensorView a, TensorView b, int64_t transa, int64_t transb, TensorView c) {
  const char* fn = "korch_tvm.blas.sbgemm";
  ConfigureThreads();
  CheckFloat32Compact(a, fn, "A", 2);
  CheckFloat32Compact(b, fn, "B", 2);
  CheckFloat32Compact(c, fn, "C", 3);
  bool ba = IsBatched(a, c, fn, "A"), bb = IsBatched(b, c, fn, "B");
  bool ta = transa != 0, tb = transb != 0;
  GemmShape s = MatchGemm(a, b, ta, tb, c, fn);
  int64_t batch = 1;
  for (int i = 0; i + 2 < c.ndim(); ++i) batch *= c.size(i);
  const float* pa = DataOf(a);
  const float* pb = DataOf(b);
  float* pc = DataOf(c);
  if (ba && !bb && !ta && batch * s.m <= std::numeric_limits<int>::max()) {
    // A's batches are consecutive row blocks, as are C's: one GEMM with batch * M rows.
    Gemm(pa, pb, pc, false, tb, {batch * s.m, s.n, s.k});
    return;
  }
  int64_t sa = ba ? s.m * s.k : 0, sb = bb ? s.k * s.n : 0, sc = s.m * s.n;
  for (int64_t i = 0; i < batch; ++i) {
    Gemm(pa + i * sa, pb + i * sb, pc + i * sc, ta, tb, s);
  }
}

// At most the TVM pool's size (see RunOnTvmPool); returns the count the BLAS now uses.
int64_t SetThreads(int64_t n) {
  if (n < 1 || n > 4096) {
    TVM_FFI_THROW(ValueError) << "korch_tvm.blas.set_num_threads: need 1..4096 threads, got " << n;
  }
  ConfigureThreads();
  scipy_openblas_set_num_threads(static_cast<int>(std::min<int64_t>(n, TvmPoolSize())));
  return scipy_openblas_get_num_threads();
}

int64_t GetThreads() { return scipy_openblas_get_num_threads(); }

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  using tvm::ffi::Function;
  Function::SetGlobal("korch_tvm.blas.sgemm", Function::FromTyped(Sgemm), true);
  Function::SetGlobal("korch_tvm.blas.sbgemm", Function::FromTyped(Sbgemm), true);
  Function::SetGlobal("korch_tvm.blas.set_num_threads", Function::FromTyped(SetThreads), true);
  Function::SetGlobal("korch_tvm.blas.num_threads", Function::FromTyped(GetThreads), true);
}
