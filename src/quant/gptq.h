// SPDX-License-Identifier: Apache-2.0
// GPTQ (Frantar et al., arXiv 2210.17323) as llm-compressor 0.14's GPTQModifier runs it (LLMC
// `modifiers/gptq/gptq_quantize.py` `quantize_weight`, `helpers.py` `accumulate_hessian`, `factorize_hessian`,
// `apply_activation_ordering`): the quantization grid of each group (scales, global scale) is the one
// round-to-nearest derives from the original weight (LLMC takes the weight observer's qparams before GPTQ), and
// GPTQ only chooses the codes, column by column, pushing each column's error onto the columns not yet quantized
// through the upper Cholesky factor of the dampened inverse Hessian. Pure functions; the checkpoint writer
// (quantize_checkpoint.h) gives them the weights and the Hessians calibration collected.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "quant/quantize.h"

namespace fp4serve::quant {

/// GPTQModifier's settings and their defaults (`block_size`, `dampening_frac`, `actorder`).
struct GptqOptions {
  int64_t block_size = 128;      ///< columns updated together before the lazy batch update of the rest
  double dampening_frac = 0.01;  ///< H += dampening_frac · mean(diag H) · I before factorizing
  /// actorder "static" (= "weight", the GPTQModifier default since LLMC 0.14): columns are quantized in order of
  /// descending H_jj, each keeping its natural group, so the checkpoint needs no g_idx. (The `group` ordering
  /// that wrote `weight_g_idx` was removed from compressed-tensors 0.19 / LLMC 0.14.)
  bool actorder = true;
};

/// Σ over calibration samples of 2·x·xᵀ for one linear input of width K (LLMC `accumulate_hessian`), and the
/// number of samples (sequences) it saw; `normalized()` is H / samples, what GPTQ factorizes. float32 like LLMC's
/// accumulator. Not thread-safe.
class GptqHessian {
 public:
  explicit GptqHessian(int64_t k);
  /// Adds the rows of x [m, K] (one sample of m tokens).
  void add(const float* x, int64_t m);
  int64_t width() const { return k_; }
  int64_t samples() const { return samples_; }
  /// H / samples [K, K] row-major. Throws UsageError when no sample was added.
  std::vector<float> normalized() const;

 private:
  int64_t k_;
  int64_t samples_ = 0;
  std::vector<float> sum_;  // [K, K]
};

/// What GPTQ derives from a Hessian alone, shared by every layer that reads the same input (q|k|v, gate|up):
/// the column order, the dead columns and the upper factor U of the dampened inverse (Uᵀ·U = (H + λI)⁻¹).
struct GptqFactor {
  int64_t cols = 0;
  std::vector<int64_t> perm;   ///< position → checkpoint column (identity without actorder)
  std::vector<bool> dead;      ///< by position: H_jj = 0
  std::vector<float> upper;    ///< U [cols, cols] row-major, in permuted order (identity on RTN fallback)
  bool rtn_fallback = false;
};

/// LLMC factorize_hessian after apply_activation_ordering: dead columns get H_jj = 1, then H += λ·I with
/// λ = dampening_frac · mean(diag H), then U. Computed in float64 as H = R·Rᵀ with R upper (the Cholesky factor
/// of the reversed matrix), U = R⁻¹: the same U that LLMC's cholesky → cholesky_inverse → cholesky(upper) gives.
/// Throws UsageError when h.size() ≠ cols².
GptqFactor gptq_factorize(std::span<const float> h, int64_t cols, const GptqOptions& options);

/// Per column quantizer of one weight: given row n, column j (checkpoint order) and the current value w, returns the
/// dequantized value the grid gives w and stores the element's code wherever the caller keeps it.
using GptqColumnQuantizer = std::function<float(int64_t n, int64_t j, float w)>;

struct GptqStats {
  double loss = 0;           ///< Σ (w − q)² / Hinv_jj² / 2 over all elements (LLMC's logged loss)
  bool rtn_fallback = false; ///< H + damping was not positive definite: plain round-to-nearest (LLMC does the same)
  int64_t dead_columns = 0;  ///< columns with H_jj = 0 (never activated): weight zeroed, as LLMC does
};

/// Runs GPTQ over w [rows, cols] (values exact in fp32) with the factorized Hessian and the element quantizer `q`;
/// returns the quantized-dequantized weight [rows, cols] (what LLMC writes back before compression). The column
/// updates run in float32 as LLMC does them, `block_size` columns at a time. Throws UsageError on shape
/// mismatches or a block size < 1.
std::vector<float> gptq_quantize(std::span<const float> w, int64_t rows, int64_t cols, const GptqFactor& factor,
                                 int64_t block_size, const GptqColumnQuantizer& q, GptqStats* stats = nullptr);

/// GPTQ for the formats of quantize.h. The grid (scales, global scale) is exactly quantize_nvfp4 / quantize_mxfp4 /
/// quantize_int4's for the same `w`; only the codes differ. `w` holds values exact in `source`, as for RTN.
/// Throws what the RTN quantizer and gptq_quantize throw.
/// The `h` overloads factorize first; the GptqFactor ones reuse a factorization (same input, same options).
QuantizedNvfp4 gptq_nvfp4(std::span<const float> w, int64_t rows, int64_t cols, float global_scale, core::DType source,
                          const GptqFactor& factor, const GptqOptions& options, GptqStats* stats = nullptr);
QuantizedMxfp4 gptq_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, core::DType source,
                          const GptqFactor& factor, const GptqOptions& options, GptqStats* stats = nullptr);
QuantizedInt4 gptq_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size, core::DType source,
                        const GptqFactor& factor, const GptqOptions& options, GptqStats* stats = nullptr);
inline QuantizedNvfp4 gptq_nvfp4(std::span<const float> w, int64_t rows, int64_t cols, float global_scale,
                                 core::DType source, std::span<const float> h, const GptqOptions& options,
                                 GptqStats* stats = nullptr) {
  return gptq_nvfp4(w, rows, cols, global_scale, source, gptq_factorize(h, cols, options), options, stats);
}
inline QuantizedMxfp4 gptq_mxfp4(std::span<const float> w, int64_t rows, int64_t cols, core::DType source,
                                 std::span<const float> h, const GptqOptions& options, GptqStats* stats = nullptr) {
  return gptq_mxfp4(w, rows, cols, source, gptq_factorize(h, cols, options), options, stats);
}
inline QuantizedInt4 gptq_int4(std::span<const float> w, int64_t rows, int64_t cols, int64_t group_size,
                               core::DType source, std::span<const float> h, const GptqOptions& options,
                               GptqStats* stats = nullptr) {
  return gptq_int4(w, rows, cols, group_size, source, gptq_factorize(h, cols, options), options, stats);
}

}  // namespace fp4serve::quant
