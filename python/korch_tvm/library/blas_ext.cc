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
//   korch_tvm.blas.sconv2d(X, W, nhwc, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w,
//       groups, Y)   a 2-D convolution as im2col + GEMM (conv_im2col.h has the layouts); its
//       epilogue sees Y as the GEMM's C: [N*K, P*Q] rows in NCHW (bias_m per channel),
//       [N*P*Q, K] in NHWC (bias_n per channel).
//   korch_tvm.blas.sgconv2d(..the same arguments..)   a grouped NHWC convolution of 4, 8 or 16
//       output channels per group computed directly (conv_grouped.h), no BLAS call.
//   Each with an epilogue: (.., steps, operands.., C), steps a string such as "bias_n gelu_erf"
//       applied to C in order (gemm_epilogue.h).
// op(X) is X, or X's last two axes swapped when its flag is nonzero. Every tensor must be a
// compact row-major float32 tensor on the CPU (gemm_operands.h); anything else raises a
// ValueError naming it.
#include <cblas.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "conv_grouped.h"
#include "conv_im2col.h"
#include "gemm_epilogue.h"
#include "gemm_operands.h"

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

using korch_tvm::gemm::CheckedGemm;
using korch_tvm::gemm::DataOf;
using korch_tvm::gemm::EpilogueStep;
using korch_tvm::gemm::GemmShape;
using tvm::ffi::TensorView;

void Gemm(const float* a, const float* b, float* c, bool ta, bool tb, const GemmShape& s) {
  if (s.m == 0 || s.n == 0) return;
  int lda = static_cast<int>(ta ? s.m : s.k), ldb = static_cast<int>(tb ? s.k : s.n);
  scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a,
                    lda < 1 ? 1 : lda, b, ldb < 1 ? 1 : ldb, 0.0f, c,
                    static_cast<int>(s.n) < 1 ? 1 : static_cast<int>(s.n));
}

// C = op(A) op(B), per batch where C has batches; the operands passed CheckGemm.
void RunGemm(const TensorView& a, const TensorView& b, bool ta, bool tb, const TensorView& c,
             const CheckedGemm& g) {
  const GemmShape& s = g.shape;
  const float* pa = DataOf(a);
  const float* pb = DataOf(b);
  float* pc = DataOf(c);
  if (g.a_batched && !g.b_batched && !ta && g.batch * s.m <= std::numeric_limits<int>::max()) {
    // A's batches are consecutive row blocks, as are C's: one GEMM with batch * M rows.
    Gemm(pa, pb, pc, false, tb, {g.batch * s.m, s.n, s.k});
    return;
  }
  int64_t sa = g.a_batched ? s.m * s.k : 0, sb = g.b_batched ? s.k * s.n : 0, sc = s.m * s.n;
  for (int64_t i = 0; i < g.batch; ++i) {
    Gemm(pa + i * sa, pb + i * sb, pc + i * sc, ta, tb, s);
  }
}

// Task `task_id`'s share [begin, end) of `rows` rows split evenly over the pool's tasks (all of
// them when run without the pool, `penv` null).
inline void TaskRows(int task_id, const TVMParallelGroupEnv* penv, int64_t rows, int64_t* begin,
                     int64_t* end) {
  int64_t tasks = penv == nullptr ? 1 : std::max<int64_t>(1, penv->num_task);
  int64_t per_task = (rows + tasks - 1) / tasks;
  *begin = std::min(rows, task_id * per_task);
  *end = std::min(rows, *begin + per_task);
}

struct EpilogueJob {
  const std::vector<EpilogueStep>* steps;
  float* c;
  int64_t rows, m, n;
};

// Cloned per instruction set where the compiler can (the loader picks the widest the CPU has),
// so the activation loops run as 8- or 16-wide SIMD on a build that targets plain x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
int RunEpilogueRows(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  auto* job = static_cast<EpilogueJob*>(cdata);
  int64_t begin, end;
  TaskRows(task_id, penv, job->rows, &begin, &end);
  for (int64_t row = begin; row < end; ++row) {
    for (const EpilogueStep& step : *job->steps) {
      korch_tvm::gemm::ApplyStep(step, job->c, row, job->m, job->n);
    }
  }
  return 0;
}

// The epilogue over C's batch * M rows, row by row (a row stays in cache through every step),
// on TVM's pool when C is large enough to pay for waking it.
void ApplyEpilogue(const std::vector<EpilogueStep>& steps, const TensorView& c,
                   const CheckedGemm& g) {
  EpilogueJob job{&steps, DataOf(c), g.batch * g.shape.m, g.shape.m, g.shape.n};
  if (steps.empty() || job.rows == 0 || job.n == 0) return;
  if (job.rows * job.n < (1 << 14)) {
    RunEpilogueRows(0, nullptr, &job);
    return;
  }
  TVMBackendParallelLaunch(RunEpilogueRows, &job, 0);
}

// sgemm / sbgemm: (A, B, transa, transb, C), or (A, B, transa, transb, steps, operands.., C)
// with an epilogue (gemm_epilogue.h). Every operand is checked before C is written.
void GemmCall(tvm::ffi::PackedArgs args, bool batched) {
  const char* fn = batched ? "korch_tvm.blas.sbgemm" : "korch_tvm.blas.sgemm";
  int count = args.size();
  if (count < 5) {
    TVM_FFI_THROW(TypeError) << fn << ": expects (A, B, transa, transb[, steps, operands..], C), "
                             << "got " << count << " arguments";
  }
  TensorView a = args[0].cast<TensorView>(), b = args[1].cast<TensorView>();
  TensorView c = args[count - 1].cast<TensorView>();
  bool ta = args[2].cast<int64_t>() != 0, tb = args[3].cast<int64_t>() != 0;
  ConfigureThreads();
  CheckedGemm g = korch_tvm::gemm::CheckGemm(a, b, ta, tb, c, batched, fn, "the BLAS",
                                             {kDLCPU, 0});
  std::vector<EpilogueStep> steps;
  if (count > 5) {
    std::vector<TensorView> operands;
    for (int i = 5; i + 1 < count; ++i) operands.push_back(args[i].cast<TensorView>());
    std::string text = args[4].cast<tvm::ffi::String>();
    steps = korch_tvm::gemm::ParseEpilogue(text, operands, c, g.shape, fn);
  }
  RunGemm(a, b, ta, tb, c, g);
  ApplyEpilogue(steps, c, g);
}

// C[M,N] = A[M,K] B[K,N], row-major, with leading dimensions (a group's slice of W or Y).
void GemmStrided(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                 int64_t m, int64_t n, int64_t k) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                    static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b,
                    static_cast<int>(ldb), 0.0f, c, static_cast<int>(ldc));
}

using korch_tvm::conv::ConvShape;

struct Im2colJob {
  const float* x;
  float* col;
  const ConvShape* shape;
  int64_t image, group, rows;
};

int RunIm2col(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  auto* job = static_cast<Im2colJob*>(cdata);
  int64_t begin, end;
  TaskRows(task_id, penv, job->rows, &begin, &end);
  korch_tvm::conv::Im2colRows(job->x, job->col, *job->shape, job->image, job->group, begin, end);
  return 0;
}

// The column matrix's storage, kept between calls (one per calling thread): a model's
// convolutions reuse one buffer instead of allocating per call.
constexpr int64_t kMaxColumnFloats = int64_t{1} << 30;  // 4 GiB

float* ColumnBuffer(int64_t floats, const char* fn) {
  thread_local std::vector<float> buffer;
  if (floats > kMaxColumnFloats) {
    TVM_FFI_THROW(ValueError) << fn << ": the im2col buffer would hold " << floats
                              << " floats, over " << kMaxColumnFloats;
  }
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// Y = conv(X, W) per image and group: the window columns (or X itself for a pointwise
// convolution), then one GEMM into the group's rows (NCHW) or columns (NHWC) of Y.
void RunConv(const float* x, const float* w, float* y, const ConvShape& s, const char* fn) {
  int64_t kg = s.group_out(), window = s.window(), positions = s.positions();
  bool direct = s.is_pointwise();
  float* col = direct ? nullptr : ColumnBuffer(window * positions, fn);
  for (int64_t image = 0; image < s.n; ++image) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const float* column = x + image * s.c * s.h * s.w;
      if (!direct) {
        Im2colJob job{x, col, &s, image, g, korch_tvm::conv::ColumnRows(s)};
        if (window * positions < (1 << 14)) {
          RunIm2col(0, nullptr, &job);
        } else {
          TVMBackendParallelLaunch(RunIm2col, &job, 0);
        }
        column = col;
      }
      if (s.nhwc) {
        GemmStrided(column, window, w + g * kg, s.k, y + image * positions * s.k + g * kg, s.k,
                    positions, kg, window);
      } else {
        GemmStrided(w + g * kg * window, window, column, positions,
                    y + (image * s.k + g * kg) * positions, positions, kg, positions, window);
      }
    }
  }
}

struct GroupedJob {
  const float *x, *w;
  float* y;
  const ConvShape* shape;
};

int RunGroupedRows(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  auto* job = static_cast<GroupedJob*>(cdata);
  int64_t begin, end;
  TaskRows(task_id, penv, job->shape->n * job->shape->p, &begin, &end);
  korch_tvm::conv::GroupedRows(job->x, job->w, job->y, *job->shape, begin, end);
  return 0;
}

// The direct grouped convolution over the N * P output rows, on TVM's pool when large enough
// to pay for waking it.
void RunGroupedConv(const float* x, const float* w, float* y, const ConvShape& s) {
  GroupedJob job{x, w, y, &s};
  if (s.n * s.positions() * s.k < (1 << 14)) {
    RunGroupedRows(0, nullptr, &job);
  } else {
    TVMBackendParallelLaunch(RunGroupedRows, &job, 0);
  }
}

// sconv2d / sgconv2d: (X, W, nhwc, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, groups,
// Y), or with (steps, operands..) before Y. Every operand is checked before Y is written.
void ConvCall(tvm::ffi::PackedArgs args, bool direct) {
  const char* fn = direct ? "korch_tvm.blas.sgconv2d" : "korch_tvm.blas.sconv2d";
  int count = args.size();
  if (count < 11) {
    TVM_FFI_THROW(TypeError) << fn << ": expects (X, W, nhwc, stride_h, stride_w, pad_top, "
                             << "pad_left, dil_h, dil_w, groups[, steps, operands..], Y), got "
                             << count << " arguments";
  }
  TensorView x = args[0].cast<TensorView>(), w = args[1].cast<TensorView>();
  TensorView y = args[count - 1].cast<TensorView>();
  bool nhwc = args[2].cast<int64_t>() != 0;
  int64_t params[7];
  for (int i = 0; i < 7; ++i) params[i] = args[3 + i].cast<int64_t>();
  ConfigureThreads();
  ConvShape s = korch_tvm::conv::CheckConv(x, w, y, nhwc, params, fn);
  if (direct && !korch_tvm::conv::HasDirectGroupedKernel(s)) {
    TVM_FFI_THROW(ValueError) << fn << ": needs an NHWC convolution of at least 2 groups of 4, "
                              << "8 or 16 output channels, got " << s.groups
                              << " groups of " << s.group_out() << (nhwc ? "" : " in NCHW");
  }
  // The epilogue's view of Y: one GEMM output of N*K rows of P*Q (NCHW) or N*P*Q rows of K.
  GemmShape as_gemm = nhwc ? GemmShape{s.positions(), s.k, s.window()}
                           : GemmShape{s.k, s.positions(), s.window()};
  CheckedGemm g{as_gemm, false, false, s.n};
  std::vector<EpilogueStep> steps;
  if (count > 11) {
    std::vector<TensorView> operands;
    for (int i = 11; i + 1 < count; ++i) operands.push_back(args[i].cast<TensorView>());
    std::string text = args[10].cast<tvm::ffi::String>();
    steps = korch_tvm::gemm::ParseEpilogue(text, operands, y, as_gemm, fn);
  }
  if (direct) {
    RunGroupedConv(DataOf(x), DataOf(w), DataOf(y), s);
  } else {
    RunConv(DataOf(x), DataOf(w), DataOf(y), s, fn);
  }
  ApplyEpilogue(steps, y, g);
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
  Function::SetGlobal("korch_tvm.blas.sgemm", Function::FromPacked([](tvm::ffi::PackedArgs args,
                                                                      tvm::ffi::Any*) {
                        GemmCall(args, false);
                      }), true);
  Function::SetGlobal("korch_tvm.blas.sbgemm", Function::FromPacked([](tvm::ffi::PackedArgs args,
                                                                       tvm::ffi::Any*) {
                        GemmCall(args, true);
                      }), true);
  Function::SetGlobal("korch_tvm.blas.sconv2d", Function::FromPacked([](tvm::ffi::PackedArgs args,
                                                                        tvm::ffi::Any*) {
                        ConvCall(args, false);
                      }), true);
  Function::SetGlobal("korch_tvm.blas.sgconv2d", Function::FromPacked([](tvm::ffi::PackedArgs args,
                                                                         tvm::ffi::Any*) {
                        ConvCall(args, true);
                      }), true);
  Function::SetGlobal("korch_tvm.blas.set_num_threads", Function::FromTyped(SetThreads), true);
  Function::SetGlobal("korch_tvm.blas.num_threads", Function::FromTyped(GetThreads), true);
}
