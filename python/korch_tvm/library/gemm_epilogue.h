// Epilogues applied to a GEMM's output C inside the library call, so that a kernel "GEMM, then
// bias / residual add / activation" is one call writing C once (what oneDNN calls post-ops and
// cuBLASLt epilogues). The steps arrive as text, one token each, applied in order:
//   bias_n      C[.., i, j] += bias[j]        bias: N elements (shape [.., 1, N])
//   bias_m      C[.., i, j] += bias[i]        bias: M elements (shape [.., M, 1])
//   residual    C += R                        R: C's shape
//   relu, clip:<low>:<high>, gelu_erf, gelu_tanh, sigmoid, silu, hardswish
// The tensor operands follow the step text in the call, in the order their steps name them.
// The transcendental functions are this file's own vectorisable float32 approximations (exp
// by range reduction and a degree-6 polynomial, relative error about 2e-7; erf by Abramowitz and
// Stegun 7.1.26, absolute error below 1.5e-7), so the loops over a row compile to SIMD code.
#ifndef KORCH_TVM_LIBRARY_GEMM_EPILOGUE_H_
#define KORCH_TVM_LIBRARY_GEMM_EPILOGUE_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "gemm_operands.h"

namespace korch_tvm {
namespace gemm {

enum class StepKind { kBiasN, kBiasM, kResidual, kRelu, kClip, kGeluErf, kGeluTanh, kSigmoid,
                      kSilu, kHardswish };

struct EpilogueStep {
  StepKind kind;
  const float* operand;  // bias or residual data; null for an activation
  float low, high;       // clip bounds
};

// min / max as selects (not std::fmin, whose NaN rules keep loops from vectorising).
inline float Min(float a, float b) { return a < b ? a : b; }
inline float Max(float a, float b) { return a > b ? a : b; }

inline float FastExp(float x) {
  x = Min(Max(x, -87.0f), 88.0f);
  float t = x * 1.44269504088896341f;
  int n = static_cast<int>(t + (t >= 0.0f ? 0.5f : -0.5f));  // nearest integer
  float nf = static_cast<float>(n);
  float r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723e-6f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                                             r * (1.0f / 720))))));
  int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float FastErf(float x) {
  float ax = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                                                             t * (-1.453152027f + t * 1.061405429f))));
  float y = 1.0f - poly * FastExp(-ax * ax);
  return x < 0.0f ? -y : y;
}

inline float FastTanh(float x) {
  float clamped = Min(Max(x, -9.0f), 9.0f);
  float e = FastExp(2.0f * clamped);
  float ratio = (e - 1.0f) / (e + 1.0f);
  float x2 = x * x;
  float series = x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15)));  // |x| < 0.04: no cancellation
  return std::fabs(x) < 0.04f ? series : ratio;
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + FastExp(-x)); }

// One step over one row of n values; `row` is the row's index among C's batch * M rows.
inline void ApplyStep(const EpilogueStep& s, float* c, int64_t row, int64_t m, int64_t n) {
  float* x = c + row * n;
  switch (s.kind) {
    case StepKind::kBiasN:
      for (int64_t j = 0; j < n; ++j) x[j] += s.operand[j];
      break;
    case StepKind::kBiasM: {
      float b = s.operand[row % m];
      for (int64_t j = 0; j < n; ++j) x[j] += b;
      break;
    }
    case StepKind::kResidual: {
      const float* r = s.operand + row * n;
      for (int64_t j = 0; j < n; ++j) x[j] += r[j];
      break;
    }
    case StepKind::kRelu:
      for (int64_t j = 0; j < n; ++j) x[j] = Max(x[j], 0.0f);
      break;
    case StepKind::kClip:
      for (int64_t j = 0; j < n; ++j) x[j] = Max(Min(x[j], s.high), s.low);
      break;
    case StepKind::kGeluErf:
      for (int64_t j = 0; j < n; ++j) x[j] = 0.5f * x[j] * (1.0f + FastErf(x[j] * 0.70710678118654752f));
      break;
    case StepKind::kGeluTanh:
      for (int64_t j = 0; j < n; ++j) {
        float v = x[j];
        x[j] = 0.5f * v * (1.0f + FastTanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
      }
      break;
    case StepKind::kSigmoid:
      for (int64_t j = 0; j < n; ++j) x[j] = Sigmoid(x[j]);
      break;
    case StepKind::kSilu:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] * Sigmoid(x[j]);
      break;
    case StepKind::kHardswish:
      for (int64_t j = 0; j < n; ++j) {
        x[j] = x[j] * Min(Max(x[j] + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
      }
      break;
  }
}

// A bias or residual operand: compact float32 on the CPU, of the shape its step needs.
inline const float* StepOperand(const TensorView& t, StepKind kind, const TensorView& c,
                                const GemmShape& s, const char* fn) {
  CheckOperand(t, fn, "an epilogue operand", 1, {kDLCPU, 0});
  int r = t.ndim();
  bool ok = true;
  if (kind == StepKind::kResidual) {
    ok = r == c.ndim();
    for (int i = 0; ok && i < r; ++i) ok = t.size(i) == c.size(i);
  } else {
    // Any shape of that many elements: [.., 1, N] and [.., M, 1] after a GEMM, a convolution's
    // [1, K, 1, 1] or [1, 1, 1, K] per-channel bias.
    int64_t along = kind == StepKind::kBiasN ? s.n : s.m;
    ok = t.numel() == along && r <= c.ndim();
  }
  if (!ok) {
    const char* what = kind == StepKind::kResidual ? "residual must have C's shape"
                       : kind == StepKind::kBiasN  ? "bias_n must have N elements"
                                                   : "bias_m must have M elements";
    TVM_FFI_THROW(ValueError) << fn << ": " << what;
  }
  return DataOf(t);
}

// Parse a clip token's bounds "clip:<low>:<high>"; both finite, low <= high.
inline EpilogueStep ParseClip(const std::string& token, const char* fn) {
  const char* text = token.c_str() + 5;
  char* end = nullptr;
  float low = std::strtof(text, &end);
  bool ok = end != text && *end == ':';
  const char* high_text = ok ? end + 1 : text;
  float high = std::strtof(high_text, &end);
  ok = ok && end != high_text && *end == '\0' && std::isfinite(low) && std::isfinite(high) &&
       low <= high;
  if (!ok) TVM_FFI_THROW(ValueError) << fn << ": bad clip step '" << token << "'";
  return {StepKind::kClip, nullptr, low, high};
}

// The steps of `text`, their operands taken in order from `operands` (all must be used).
inline std::vector<EpilogueStep> ParseEpilogue(const std::string& text,
                                               const std::vector<TensorView>& operands,
                                               const TensorView& c, const GemmShape& s,
                                               const char* fn) {
  static const struct { const char* name; StepKind kind; bool operand; } kSteps[] = {
      {"bias_n", StepKind::kBiasN, true},      {"bias_m", StepKind::kBiasM, true},
      {"residual", StepKind::kResidual, true}, {"relu", StepKind::kRelu, false},
      {"gelu_erf", StepKind::kGeluErf, false}, {"gelu_tanh", StepKind::kGeluTanh, false},
      {"sigmoid", StepKind::kSigmoid, false},  {"silu", StepKind::kSilu, false},
      {"hardswish", StepKind::kHardswish, false}};
  std::vector<EpilogueStep> steps;
  std::istringstream tokens(text);
  std::string token;
  size_t used = 0;
  while (tokens >> token) {
    if (token.rfind("clip:", 0) == 0) {
      steps.push_back(ParseClip(token, fn));
      continue;
    }
    const auto* found = std::find_if(std::begin(kSteps), std::end(kSteps),
                                     [&](const auto& step) { return token == step.name; });
    if (found == std::end(kSteps)) {
      TVM_FFI_THROW(ValueError) << fn << ": unknown epilogue step '" << token << "'";
    }
    const float* data = nullptr;
    if (found->operand) {
      if (used == operands.size()) {
        TVM_FFI_THROW(ValueError) << fn << ": epilogue step '" << token << "' has no operand";
      }
      data = StepOperand(operands[used++], found->kind, c, s, fn);
    }
    steps.push_back({found->kind, data, 0.0f, 0.0f});
  }
  if (used != operands.size()) {
    TVM_FFI_THROW(ValueError) << fn << ": " << operands.size() - used
                              << " epilogue operand(s) no step uses";
  }
  return steps;
}

}  // namespace gemm
}  // namespace korch_tvm

#endif  // KORCH_TVM_LIBRARY_GEMM_EPILOGUE_H_
