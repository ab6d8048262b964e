// A 2-D convolution as GEMMs: the operand checks and the im2col copy behind
// korch_tvm.blas.sconv2d (blas_ext.cc). Each group's GEMM reads a "column" matrix that holds,
// for every output position, the input window it multiplies with the weights (zeros where the
// window reaches into the padding), so a convolution runs at the BLAS's GEMM speed at the price
// of one copy of the windows.
//   NCHW: X[N, C, H, W], weight OIHW [K, C/G, R, S], Y[N, K, P, Q]; per image and group,
//         Y_g[K/G, P*Q] = W_g[K/G, C/G*R*S] col_g[C/G*R*S, P*Q]
//   NHWC: X[N, H, W, C], weight HWIO [R, S, C/G, K], Y[N, P, Q, K]; per image and group,
//         Y_g[P*Q, K/G] = col_g[P*Q, R*S*C/G] W_g[R*S*C/G, K/G]  (columns g*K/G.. of W and Y)
// Padding is given by its top and left sizes; reads past the bottom or right edge are zeros,
// which is what any bottom/right padding gives, so Y's own size says how much there is.
#ifndef KORCH_TVM_LIBRARY_CONV_IM2COL_H_
#define KORCH_TVM_LIBRARY_CONV_IM2COL_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gemm_operands.h"

namespace korch_tvm {
namespace conv {

using gemm::CheckedInt;
using gemm::CheckOperand;
using tvm::ffi::TensorView;

// A convolution's geometry, every size in the layout-free names above.
struct ConvShape {
  bool nhwc;
  int64_t n, c, h, w;  // input
  int64_t k, r, s;     // filters, window
  int64_t p, q;        // output
  int64_t stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, groups;

  int64_t group_in() const { return c / groups; }
  int64_t group_out() const { return k / groups; }
  int64_t window() const { return group_in() * r * s; }  // a column's length: the GEMM's K
  int64_t positions() const { return p * q; }
  // 1x1, stride 1, no padding, one group, the output as large as the input: the input is the
  // column matrix itself
  bool is_pointwise() const {
    return r == 1 && s == 1 && stride_h == 1 && stride_w == 1 && pad_top == 0 && pad_left == 0 &&
           groups == 1 && p == h && q == w;
  }
};

// The checked geometry of (X, W, Y) with the given parameters; anything inconsistent is a
// ValueError naming it, before any tensor is read.
inline ConvShape CheckConv(const TensorView& x, const TensorView& wt, const TensorView& y,
                           bool nhwc, const int64_t (&params)[7], const char* fn) {
  const gemm::Placement cpu{kDLCPU, 0};
  CheckOperand(x, fn, "X", 4, cpu);
  CheckOperand(wt, fn, "W", 4, cpu);
  CheckOperand(y, fn, "Y", 4, cpu);
  if (x.ndim() != 4 || wt.ndim() != 4 || y.ndim() != 4) {
    TVM_FFI_THROW(ValueError) << fn << ": X, W and Y must all have rank 4";
  }
  ConvShape s{nhwc,
              x.size(0), x.size(nhwc ? 3 : 1), x.size(nhwc ? 1 : 2), x.size(nhwc ? 2 : 3),
              wt.size(nhwc ? 3 : 0), wt.size(nhwc ? 0 : 2), wt.size(nhwc ? 1 : 3),
              y.size(nhwc ? 1 : 2), y.size(nhwc ? 2 : 3),
              params[0], params[1], params[2], params[3], params[4], params[5], params[6]};
  for (int64_t v : {s.stride_h, s.stride_w, s.dil_h, s.dil_w, s.groups}) {
    if (v < 1) TVM_FFI_THROW(ValueError) << fn << ": strides, dilations and groups must be >= 1";
  }
  if (s.pad_top < 0 || s.pad_left < 0) TVM_FFI_THROW(ValueError) << fn << ": negative padding";
  if (s.c % s.groups != 0 || s.k % s.groups != 0) {
    TVM_FFI_THROW(ValueError) << fn << ": " << s.groups << " groups do not divide " << s.c
                              << " input and " << s.k << " output channels";
  }
  if (wt.size(nhwc ? 2 : 1) != s.group_in()) {
    TVM_FFI_THROW(ValueError) << fn << ": W must have " << s.group_in()
                              << " input channels per group, got " << wt.size(nhwc ? 2 : 1);
  }
  if (y.size(0) != s.n || y.size(nhwc ? 3 : 1) != s.k) {
    TVM_FFI_THROW(ValueError) << fn << ": Y must have X's batch and W's " << s.k << " filters";
  }
  if (s.p < 1 || s.q < 1) TVM_FFI_THROW(ValueError) << fn << ": Y has no output positions";
  for (int64_t v : {s.window(), s.positions(), s.k, s.c}) CheckedInt(v, fn, "the BLAS");
  return s;
}

// Rows [begin, end) of group g's column matrix of image `image` (see the layouts above).
inline void Im2colRows(const float* x, float* col, const ConvShape& s, int64_t image, int64_t g,
                       int64_t begin, int64_t end) {
  if (!s.nhwc) {  // rows are (c, r, s) of the window, columns the output positions
    for (int64_t row = begin; row < end; ++row) {
      int64_t ci = row / (s.r * s.s), kr = row / s.s % s.r, ks = row % s.s;
      const float* plane = x + ((image * s.c) + g * s.group_in() + ci) * s.h * s.w;
      float* out = col + row * s.positions();
      for (int64_t op = 0; op < s.p; ++op) {
        int64_t ih = op * s.stride_h + kr * s.dil_h - s.pad_top;
        float* dst = out + op * s.q;
        if (ih < 0 || ih >= s.h) {
          std::fill(dst, dst + s.q, 0.0f);
          continue;
        }
        const float* src = plane + ih * s.w;
        int64_t offset = ks * s.dil_w - s.pad_left;
        for (int64_t oq = 0; oq < s.q; ++oq) {
          int64_t iw = oq * s.stride_w + offset;
          dst[oq] = (iw >= 0 && iw < s.w) ? src[iw] : 0.0f;
        }
      }
    }
    return;
  }
  int64_t cg = s.group_in();
  for (int64_t row = begin; row < end; ++row) {  // rows are output positions, columns (r, s, c)
    int64_t op = row / s.q, oq = row % s.q;
    float* dst = col + row * s.window();
    for (int64_t kr = 0; kr < s.r; ++kr) {
      int64_t ih = op * s.stride_h + kr * s.dil_h - s.pad_top;
      for (int64_t ks = 0; ks < s.s; ++ks, dst += cg) {
        int64_t iw = oq * s.stride_w + ks * s.dil_w - s.pad_left;
        if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w) {
          std::fill(dst, dst + cg, 0.0f);
        } else {
          std::memcpy(dst, x + ((image * s.h + ih) * s.w + iw) * s.c + g * cg, cg * sizeof(float));
        }
      }
    }
  }
}

inline int64_t ColumnRows(const ConvShape& s) { return s.nhwc ? s.positions() : s.window(); }

}  // namespace conv
}  // namespace korch_tvm

#endif  // KORCH_TVM_LIBRARY_CONV_IM2COL_H_
