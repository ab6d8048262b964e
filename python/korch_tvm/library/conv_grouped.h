// A grouped 2-D convolution computed directly, without im2col: behind korch_tvm.blas.sgconv2d
// (blas_ext.cc). Groups of few channels (RegNet's 8, ResNeXt's 4..16) make im2col + GEMM a
// series of GEMMs a few columns wide, each paying the BLAS's call and packing costs for a
// handful of FLOPs; here one pass over the output keeps a tile of output positions times one
// group's output channels in registers and reads each weight vector once per tile.
//   NHWC only: X[N, H, W, C], weight HWIO [R, S, C/G, K], Y[N, P, Q, K]; a group's K/G output
//   channels are contiguous in both W and Y, which is what the vector loop runs over.
#ifndef KORCH_TVM_LIBRARY_CONV_GROUPED_H_
#define KORCH_TVM_LIBRARY_CONV_GROUPED_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "conv_im2col.h"

namespace korch_tvm {
namespace conv {

// The group widths (output channels per group) with a direct kernel; another width keeps
// im2col + GEMM, which is as fast from 32 channels per group on (bench/grouped_conv.py).
constexpr int64_t kDirectGroupWidths[] = {4, 8, 16};

inline bool HasDirectGroupedKernel(const ConvShape& s) {
  if (!s.nhwc || s.groups < 2) return false;
  return std::find(std::begin(kDirectGroupWidths), std::end(kDirectGroupWidths),
                   s.group_out()) != std::end(kDirectGroupWidths);
}

// Eight (or, for groups of 4, four) floats as one SIMD value: the loops below are written over
// these so the accumulators stay in registers whatever the instruction set of the clone.
typedef float Floats8 __attribute__((vector_size(32)));
typedef float Floats4 __attribute__((vector_size(16)));
template <int KG>
using GroupVector = typename std::conditional<KG % 8 == 0, Floats8, Floats4>::type;

// One output row (image `image`, output row `op`) of group `g`: tiles of T positions, each
// accumulating R * S * C/G broadcasts of X times the group's KG weights. `zeros` holds at least
// C/G zeros, read where a window reaches into the padding.
template <int KG>
__attribute__((always_inline)) inline void GroupedRow(const float* x, const float* w, float* y,
                                                      const ConvShape& s, int64_t image,
                                                      int64_t op, int64_t g,
                                                      const float* zeros) {
  using V = GroupVector<KG>;
  constexpr int kLanes = sizeof(V) / sizeof(float), kVectors = KG / kLanes;
  // 64 accumulators (8 AVX2 registers), or 32 in 4-wide registers
  constexpr int T = KG == 4 ? 8 : 64 / KG;
  const int64_t cg = s.group_in();
  const float* wg = w + g * KG;
  float* yrow = y + (image * s.p + op) * s.q * s.k + g * KG;
  for (int64_t q0 = 0; q0 < s.q; q0 += T) {
    const int64_t tile = std::min<int64_t>(T, s.q - q0);
    V acc[T][kVectors];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
#pragma GCC unroll 16
      for (int v = 0; v < kVectors; ++v) acc[t][v] = V{};
    }
    for (int64_t kr = 0; kr < s.r; ++kr) {
      const int64_t ih = op * s.stride_h + kr * s.dil_h - s.pad_top;
      if (ih < 0 || ih >= s.h) continue;
      const float* xrow = x + (image * s.h + ih) * s.w * s.c + g * cg;
      for (int64_t ks = 0; ks < s.s; ++ks) {
        const float* xs[T];
        for (int t = 0; t < T; ++t) {
          const int64_t iw = (q0 + t) * s.stride_w + ks * s.dil_w - s.pad_left;
          xs[t] = (t < tile && iw >= 0 && iw < s.w) ? xrow + iw * s.c : zeros;
        }
        const float* wk = wg + (kr * s.s + ks) * cg * s.k;
        for (int64_t ci = 0; ci < cg; ++ci) {
          V wv[kVectors];
#pragma GCC unroll 16
          for (int v = 0; v < kVectors; ++v) {
            std::memcpy(&wv[v], wk + ci * s.k + v * kLanes, sizeof(V));
          }
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const float xv = xs[t][ci];
#pragma GCC unroll 16
            for (int v = 0; v < kVectors; ++v) acc[t][v] += xv * wv[v];
          }
        }
      }
    }
    for (int64_t t = 0; t < tile; ++t) {
      std::memcpy(yrow + (q0 + t) * s.k, acc[t], KG * sizeof(float));
    }
  }
}

// Output rows [begin, end) of the N * P rows, every group; the shape passed
// HasDirectGroupedKernel. Cloned per instruction set as the epilogue is (blas_ext.cc); "fma"
// (which implies AVX) rather than "avx2", whose clone would multiply and add separately.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "fma", "default")))
#endif
inline void GroupedRows(const float* x, const float* w, float* y, const ConvShape& s,
                        int64_t begin, int64_t end) {
  std::vector<float> zeros(s.group_in(), 0.0f);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t image = row / s.p, op = row % s.p;
    for (int64_t g = 0; g < s.groups; ++g) {
      switch (s.group_out()) {
        case 4: GroupedRow<4>(x, w, y, s, image, op, g, zeros.data()); break;
        case 8: GroupedRow<8>(x, w, y, s, image, op, g, zeros.data()); break;
        case 16: GroupedRow<16>(x, w, y, s, image, op, g, zeros.data()); break;
        default: break;  // the caller checked HasDirectGroupedKernel
      }
    }
  }
}

}  // namespace conv
}  // namespace korch_tvm

#endif  // KORCH_TVM_LIBRARY_CONV_GROUPED_H_
