// SPDX-License-Identifier: Apache-2.0
#include "quant/gptq.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fp4serve/error.h"
#include "quant/formats.h"
#include "quant/packing.h"

namespace fp4serve::quant {
namespace {

// In-place lower Cholesky factor of the symmetric positive definite a [n, n] (row-major, lower triangle used).
// False when a pivot is not positive (LLMC's cholesky_ex info ≠ 0).
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double* rj = a.data() + j * n;
    double d = rj[j];
    for (int64_t p = 0; p < j; ++p) d -= rj[p] * rj[p];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    d = std::sqrt(d);
    rj[j] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      double* ri = a.data() + i * n;
      double s = ri[j];
      for (int64_t p = 0; p < j; ++p) s -= ri[p] * rj[p];
      ri[j] = s / d;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) a[static_cast<size_t>(i * n + j)] = 0.0;
  }
  return true;
}

// U upper with Uᵀ·U = H⁻¹ (LLMC: cholesky_inverse, then cholesky(upper=True)), from H's lower factor L:
// H⁻¹ = L⁻ᵀ·L⁻¹, whose upper Cholesky factor is computed directly.
bool inverse_upper_factor(std::vector<double>& l, int64_t n, std::vector<float>& u_out) {
  // Linv = L⁻¹ (lower), column by column of the identity.
  std::vector<double> linv(static_cast<size_t>(n * n), 0.0);
  for (int64_t c = 0; c < n; ++c) {
    linv[static_cast<size_t>(c * n + c)] = 1.0 / l[static_cast<size_t>(c * n + c)];
    for (int64_t i = c + 1; i < n; ++i) {
      double s = 0.0;
      const double* li = l.data() + i * n;
      for (int64_t p = c; p < i; ++p) s += li[p] * linv[static_cast<size_t>(p * n + c)];
      linv[static_cast<size_t>(i * n + c)] = -s / li[i];
    }
  }
  // Hinv = Linvᵀ · Linv (symmetric; Linv lower, so the sum runs from max(i, j)).
  std::vector<double> hinv(static_cast<size_t>(n * n), 0.0);
  for (int64_t p = 0; p < n; ++p) {
    const double* lp = linv.data() + p * n;
    for (int64_t i = 0; i <= p; ++i) {
      const double v = lp[i];
      if (v == 0.0) continue;
      double* hi = hinv.data() + i * n;
      for (int64_t j = i; j <= p; ++j) hi[j] += v * lp[j];
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) hinv[static_cast<size_t>(i * n + j)] = hinv[static_cast<size_t>(j * n + i)];
  }
  if (!cholesky_lower(hinv, n)) return false;
  u_out.assign(static_cast<size_t>(n * n), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i; j < n; ++j) u_out[static_cast<size_t>(i * n + j)] = static_cast<float>(hinv[static_cast<size_t>(j * n + i)]);
  }
  return true;
}

}  // namespace

GptqHessian::GptqHessian(int64_t k) : k_(k), sum_(static_cast<size_t>(k * k), 0.f) {
  if (k <= 0) throw UsageError(fmt::format("GptqHessian: width {} is not positive", k));
}

void GptqHessian::add(const float* x, int64_t m) {
  // LLMC scales the input by √2 before x·xᵀ (float32): H accumulates 2·Σ x xᵀ; one call is one sample.
  std::vector<float> xs(static_cast<size_t>(m * k_));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sqrt(2.f) * x[i];
  for (int64_t t = 0; t < m; ++t) {
    const float* r = xs.data() + t * k_;
    for (int64_t i = 0; i < k_; ++i) {
      const float v = r[i];
      float* hi = sum_.data() + i * k_;
      for (int64_t j = i; j < k_; ++j) hi[j] += v * r[j];
    }
  }
  ++samples_;
}

std::vector<float> GptqHessian::normalized() const {
  if (samples_ == 0) throw UsageError("GptqHessian: no calibration sample was observed");
  std::vector<float> out(sum_.size());
  const float n = static_cast<float>(samples_);
  for (int64_t i = 0; i < k_; ++i) {
    for (int64_t j = i; j < k_; ++j) {
      const float v = sum_[static_cast<size_t>(i * k_ + j)] / n;
      out[static_cast<size_t>(i * k_ + j)] = v;
      out[static_cast<size_t>(j * k_ + i)] = v;
    }
  }
  return out;
}

std::vector<float> gptq_quantize(std::span<const float> w_in, int64_t rows, int64_t cols, std::span<const float> h,
                                 const GptqOptions& options, const GptqColumnQuantizer& quantize, GptqStats* stats) {
  if (rows <= 0 || cols <= 0 || static_cast<int64_t>(w_in.size()) != rows * cols ||
      static_cast<int64_t>(h.size()) != cols * cols) {
    throw UsageError(fmt::format("gptq_quantize: weight of {} values for [{}, {}] with a Hessian of {} values", w_in.size(),
                                 rows, cols, h.size()));
  }
  if (options.block_size < 1) throw UsageError(fmt::format("gptq_quantize: block size {} < 1", options.block_size));
  GptqStats local;
  GptqStats& st = stats != nullptr ? *stats : local;
  st = {};

  // Column order: descending H_jj (LLMC apply_activation_ordering: torch.argsort(descending=True); stable here,
  // so equal diagonals keep their natural order).
  std::vector<int64_t> perm(static_cast<size_t>(cols));
  std::iota(perm.begin(), perm.end(), 0);
  if (options.actorder) {
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      return h[static_cast<size_t>(a * cols + a)] > h[static_cast<size_t>(b * cols + b)];
    });
  }
  // Permuted working copies: W [rows, cols] fp32, H [cols, cols] float64.
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < cols; ++j) w[static_cast<size_t>(n * cols + j)] = w_in[static_cast<size_t>(n * cols + perm[static_cast<size_t>(j)])];
  }
  std::vector<double> hp(static_cast<size_t>(cols * cols));
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      hp[static_cast<size_t>(i * cols + j)] = h[static_cast<size_t>(perm[static_cast<size_t>(i)] * cols + perm[static_cast<size_t>(j)])];
    }
  }
  // LLMC factorize_hessian: dead columns (H_jj = 0) get H_jj = 1 and a zero weight; then the dampening.
  double mean_diag = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    double& d = hp[static_cast<size_t>(j * cols + j)];
    if (d == 0.0) {
      d = 1.0;
      ++st.dead_columns;
      for (int64_t n = 0; n < rows; ++n) w[static_cast<size_t>(n * cols + j)] = 0.f;
    }
    mean_diag += d;
  }
  mean_diag /= static_cast<double>(cols);
  for (int64_t j = 0; j < cols; ++j) hp[static_cast<size_t>(j * cols + j)] += options.dampening_frac * mean_diag;
  std::vector<float> u;  // upper factor of H⁻¹ [cols, cols]
  if (!cholesky_lower(hp, cols) || !inverse_upper_factor(hp, cols, u)) {
    st.rtn_fallback = true;  // LLMC replaces the factor by the identity: every error stays in its column
    u.assign(static_cast<size_t>(cols * cols), 0.f);
    for (int64_t j = 0; j < cols; ++j) u[static_cast<size_t>(j * cols + j)] = 1.f;
  }

  std::vector<float> err(static_cast<size_t>(rows * options.block_size));
  for (int64_t i1 = 0; i1 < cols; i1 += options.block_size) {
    const int64_t i2 = std::min(i1 + options.block_size, cols);
    const int64_t width = i2 - i1;
    for (int64_t i = i1; i < i2; ++i) {
      const float d = u[static_cast<size_t>(i * cols + i)];
      const float* ui = u.data() + i * cols;
      const int64_t col = perm[static_cast<size_t>(i)];
      for (int64_t n = 0; n < rows; ++n) {
        float* wn = w.data() + n * cols;
        const float q = quantize(n, col, wn[i]);
        const float e = (wn[i] - q) / d;
        st.loss += static_cast<double>(e) * e / 2.0;
        err[static_cast<size_t>(n * width + (i - i1))] = e;
        wn[i] = q;
        for (int64_t j = i + 1; j < i2; ++j) wn[j] -= e * ui[j];
      }
    }
    // Lazy batch update of the columns after the block: W[:, i2:] -= Err · U[i1:i2, i2:].
    for (int64_t n = 0; n < rows; ++n) {
      float* wn = w.data() + n * cols;
      const float* en = err.data() + n * width;
      for (int64_t b = 0; b < width; ++b) {
        const float e = en[b];
        if (e == 0.f) continue;
        const float* ub = u.data() + (i1 + b) * cols;
        for (int64_t j = i2; j < cols; ++j) wn[j] -= e * ub[j];
      }
    }
  }
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < cols; ++j) out[static_cast<size_t>(n * cols + perm[static_cast<size_t>(j)])] = w[static_cast<size_t>(n * cols + j)];
  }
  return out;
}

namespace {

// E2M1 code of a scaled value as CT's cast_to_fp4 gives it (quantize.cpp fp4_code: ±0 → 0x0).
uint8_t fp4_code(float v) { return v == 0.0f ? uint8_t{0} : float_to_e2m1(std::clamp(v, -6.f, 6.f)); }

void set_nibble(std::vector<uint8_t>& packed, int64_t index, uint8_t code) {
  uint8_t& byte = packed[static_cast<size_t>(index / 2)];
  byte = index % 2 == 0 ? static_cast<uint8_t>((byte & 0xF0) | code) : static_cast<uint8_t>((byte & 0x0F) | (code << 4));
}

}  // namespace

QuantizedNvfp4 gptq_nvfp4(std::span<const float> w, int64_t rows, int64_t cols, float global_scale, core::DType source,
                          std::span<const float> h, const GptqOptions& options, GptqStats* stats) {
  QuantizedNvfp4 out = quantize_nvfp4(w, rows, cols, global_scale, source);  // the grid: RTN's scales
  const int64_t groups = cols / kNvfp4GroupSize;
  // LLMC column_scale_window: the effective scale is weight_scale / global_scale in float32.
  std::vector<float> eff(out.scales.size());
  for (size_t i = 0; i < eff.size(); ++i) eff[i] = e4m3_to_float(out.scales[i]) / global_scale;
  gptq_quantize(w, rows, cols, h, options, [&](int64_t n, int64_t j, float v) {
    const float s = eff[static_cast<size_t>(n * groups + j / kNvfp4GroupSize)];
    const uint8_t c = fp4_code(v / s);
    set_nibble(out.packed, n * cols + j, c);
    return e2m1_to_float(c) * s;
  }, stats);
  return out;
}

QuantizedMxfp4 gptq_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, core::DType source,
                          std::span<const float> h, const GptqOptions& options, GptqStats* stats) {
  QuantizedMxfp4 out = quantize_mxfp4(w, rows, cols, source);
  const int64_t groups = cols / kMxfp4GroupSize;
  gptq_quantize(w, rows, cols, h, options, [&](int64_t n, int64_t j, float v) {
    const float s = e8m0_to_float(out.scales[static_cast<size_t>(n * groups + j / kMxfp4GroupSize)]);
    const uint8_t c = fp4_code(v / s);
    set_nibble(out.packed, n * cols + j, c);
    return e2m1_to_float(c) * s;
  }, stats);
  return out;
}

QuantizedInt4 gptq_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size, core::DType source,
                        std::span<const float> h, const GptqOptions& options, GptqStats* stats) {
  QuantizedInt4 out = quantize_int4(w, rows, cols, group_size, source);
  const int64_t groups = cols / group_size;
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  gptq_quantize(w, rows, cols, h, options, [&](int64_t n, int64_t j, float v) {
    // CT fake_quantize in float32 on the float32 working weight: clamp(x / scale, −8, 7), round half to even.
    const float s = out.scales[static_cast<size_t>(n * groups + j / group_size)];
    const float r = std::nearbyint(std::clamp(v / s, -8.f, 7.f));
    q[static_cast<size_t>(n * cols + j)] = static_cast<int8_t>(r);
    // CT _quantize_dequantize: `quantized.to(scale.dtype) * scale`, a product in the scale's dtype (= source).
    const float dq = r * s;
    if (source == core::DType::BF16) return bf16_to_float(float_to_bf16(dq));
    if (source == core::DType::F16) return f16_to_float(float_to_f16(dq));
    return dq;
  }, stats);
  const int64_t words = (cols + 7) / 8;
  for (int64_t n = 0; n < rows; ++n) {
    pack_int4_row(std::span<const int8_t>(q).subspan(static_cast<size_t>(n * cols), static_cast<size_t>(cols)),
                  std::span<int32_t>(out.packed).subspan(static_cast<size_t>(n * words), static_cast<size_t>(words)));
  }
  return out;
}

}  // namespace fp4serve::quant
