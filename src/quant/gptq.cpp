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

// In-place lower Cholesky factor of the symmetric positive definite a [n, n] (row-major, lower triangle used),
// row by row so the inner products run over contiguous memory. False when a pivot is not positive (LLMC's
// cholesky_ex info ≠ 0).
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double* ri = a.data() + i * n;
    for (int64_t j = 0; j <= i; ++j) {
      const double* rj = a.data() + j * n;
      double s = ri[j];
      for (int64_t p = 0; p < j; ++p) s -= ri[p] * rj[p];
      if (j < i) {
        ri[j] = s / rj[j];
      } else {
        if (!(s > 0.0) || !std::isfinite(s)) return false;
        ri[i] = std::sqrt(s);
      }
    }
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

GptqFactor gptq_factorize(std::span<const float> h, int64_t cols, const GptqOptions& options) {
  if (cols <= 0 || static_cast<int64_t>(h.size()) != cols * cols) {
    throw UsageError(fmt::format("gptq_factorize: a Hessian of {} values for {} columns", h.size(), cols));
  }
  GptqFactor f;
  f.cols = cols;
  // Column order: descending H_jj (LLMC apply_activation_ordering: torch.argsort(descending=True); stable here,
  // so equal diagonals keep their natural order).
  f.perm.resize(static_cast<size_t>(cols));
  std::iota(f.perm.begin(), f.perm.end(), 0);
  if (options.actorder) {
    std::stable_sort(f.perm.begin(), f.perm.end(), [&](int64_t a, int64_t b) {
      return h[static_cast<size_t>(a * cols + a)] > h[static_cast<size_t>(b * cols + b)];
    });
  }
  // The reversed permuted matrix J·Hp·J, so that its lower factor L̃ gives Hp = R·Rᵀ with R = J·L̃·J upper.
  const auto at = [cols](int64_t i, int64_t j) { return static_cast<size_t>(i * cols + j); };
  std::vector<double> rev(static_cast<size_t>(cols * cols));
  f.dead.assign(static_cast<size_t>(cols), false);
  double mean_diag = 0.0;
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      rev[at(cols - 1 - i, cols - 1 - j)] = h[at(f.perm[static_cast<size_t>(i)], f.perm[static_cast<size_t>(j)])];
    }
  }
  for (int64_t i = 0; i < cols; ++i) {
    double& d = rev[at(cols - 1 - i, cols - 1 - i)];
    if (d == 0.0) {  // LLMC factorize_hessian: a dead column gets H_jj = 1 (its weight is zeroed in gptq_quantize)
      d = 1.0;
      f.dead[static_cast<size_t>(i)] = true;
    }
    mean_diag += d;
  }
  mean_diag /= static_cast<double>(cols);
  for (int64_t i = 0; i < cols; ++i) rev[at(i, i)] += options.dampening_frac * mean_diag;
  f.upper.assign(static_cast<size_t>(cols * cols), 0.f);
  if (!cholesky_lower(rev, cols)) {
    f.rtn_fallback = true;  // LLMC replaces the factor by the identity: every error stays in its column
    for (int64_t j = 0; j < cols; ++j) f.upper[at(j, j)] = 1.f;
    return f;
  }
  // M = L̃⁻¹ (lower), row by row: M[i, c] = −Σ_{p=c}^{i−1} L̃[i, p]·M[p, c] / L̃[i, i], M[i, i] = 1/L̃[i, i].
  std::vector<double> inv(static_cast<size_t>(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) {
    const double* li = rev.data() + i * cols;
    double* mi = inv.data() + i * cols;
    for (int64_t p = 0; p < i; ++p) {
      const double l = li[p];
      if (l == 0.0) continue;
      const double* mp = inv.data() + p * cols;
      for (int64_t c = 0; c <= p; ++c) mi[c] -= l * mp[c];
    }
    const double d = li[i];
    for (int64_t c = 0; c < i; ++c) mi[c] /= d;
    mi[i] = 1.0 / d;
  }
  // U = R⁻¹ = J·M·J: U[i, j] = M[n−1−i, n−1−j], upper because M is lower.
  for (int64_t i = 0; i < cols; ++i) {
    for (int64_t j = i; j < cols; ++j) f.upper[at(i, j)] = static_cast<float>(inv[at(cols - 1 - i, cols - 1 - j)]);
  }
  return f;
}

std::vector<float> gptq_quantize(std::span<const float> w_in, int64_t rows, int64_t cols, const GptqFactor& factor,
                                 int64_t block_size, const GptqColumnQuantizer& quantize, GptqStats* stats) {
  if (rows <= 0 || cols <= 0 || static_cast<int64_t>(w_in.size()) != rows * cols || factor.cols != cols) {
    throw UsageError(fmt::format("gptq_quantize: weight of {} values for [{}, {}] with a factor of {} columns",
                                 w_in.size(), rows, cols, factor.cols));
  }
  if (block_size < 1) throw UsageError(fmt::format("gptq_quantize: block size {} < 1", block_size));
  GptqStats local;
  GptqStats& st = stats != nullptr ? *stats : local;
  st = {};
  st.rtn_fallback = factor.rtn_fallback;
  const std::vector<int64_t>& perm = factor.perm;
  const std::vector<float>& u = factor.upper;
  // Permuted working copy W [rows, cols] fp32; dead columns zeroed (LLMC factorize_hessian).
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t j = 0; j < cols; ++j) {
      w[static_cast<size_t>(n * cols + j)] =
          factor.dead[static_cast<size_t>(j)] ? 0.f : w_in[static_cast<size_t>(n * cols + perm[static_cast<size_t>(j)])];
    }
  }
  for (int64_t j = 0; j < cols; ++j) st.dead_columns += factor.dead[static_cast<size_t>(j)] ? 1 : 0;
  std::vector<float> err(static_cast<size_t>(rows * block_size));
  for (int64_t i1 = 0; i1 < cols; i1 += block_size) {
    const int64_t i2 = std::min(i1 + block_size, cols);
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
                          const GptqFactor& factor, const GptqOptions& options, GptqStats* stats) {
  QuantizedNvfp4 out = quantize_nvfp4(w, rows, cols, global_scale, source);  // the grid: RTN's scales
  const int64_t groups = cols / kNvfp4GroupSize;
  // LLMC column_scale_window: the effective scale is weight_scale / global_scale in float32.
  std::vector<float> eff(out.scales.size());
  for (size_t i = 0; i < eff.size(); ++i) eff[i] = e4m3_to_float(out.scales[i]) / global_scale;
  gptq_quantize(w, rows, cols, factor, options.block_size, [&](int64_t n, int64_t j, float v) {
    const float s = eff[static_cast<size_t>(n * groups + j / kNvfp4GroupSize)];
    const uint8_t c = fp4_code(v / s);
    set_nibble(out.packed, n * cols + j, c);
    return e2m1_to_float(c) * s;
  }, stats);
  return out;
}

QuantizedMxfp4 gptq_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, core::DType source,
                          const GptqFactor& factor, const GptqOptions& options, GptqStats* stats) {
  QuantizedMxfp4 out = quantize_mxfp4(w, rows, cols, source);
  const int64_t groups = cols / kMxfp4GroupSize;
  gptq_quantize(w, rows, cols, factor, options.block_size, [&](int64_t n, int64_t j, float v) {
    const float s = e8m0_to_float(out.scales[static_cast<size_t>(n * groups + j / kMxfp4GroupSize)]);
    const uint8_t c = fp4_code(v / s);
    set_nibble(out.packed, n * cols + j, c);
    return e2m1_to_float(c) * s;
  }, stats);
  return out;
}

QuantizedInt4 gptq_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size, core::DType source,
                        const GptqFactor& factor, const GptqOptions& options, GptqStats* stats) {
  QuantizedInt4 out = quantize_int4(w, rows, cols, group_size, source);
  const int64_t groups = cols / group_size;
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  gptq_quantize(w, rows, cols, factor, options.block_size, [&](int64_t n, int64_t j, float v) {
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
