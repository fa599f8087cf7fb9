// SPDX-License-Identifier: Apache-2.0
// linear(): argument checks, activation preprocessing (W4A4 emulation, int4 activation order), dispatch.
#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels {

void linear(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y, ActivationEmulation aq) {
  if (m < 0) throw UsageError(fmt::format("linear: m = {} is negative", m));
  if (m == 0) return;
  if (x == nullptr || y == nullptr) throw UsageError("linear: x and y must not be null");
  const int64_t k = w.in_features;
  const bool fp4 = w.layout == prepare::WeightLayout::Fp4;
  const auto is_fp4 = [&](quant::BlockFormat f) { return fp4 && w.block_format == f; };
  const bool emulate = aq == ActivationEmulation::EmulateNvfp4;
  if (emulate && !is_fp4(quant::BlockFormat::Nvfp4) && w.layout != prepare::WeightLayout::Dense) {
    throw UsageError(fmt::format("linear: W4A4 emulation needs an NVFP4 layer (or its reference-dequantized dense "
                                 "form), this one is {}", prepare::format_label(w)));
  }
  if (emulate && w.input_global_scale <= 0.f) {
    throw UsageError("linear: W4A4 emulation needs the layer's input_global_scale (set_input_global_scale)");
  }
  const bool emulate_mx = aq == ActivationEmulation::EmulateMxfp4;
  if (emulate_mx && !is_fp4(quant::BlockFormat::Mxfp4) && w.layout != prepare::WeightLayout::Dense) {
    throw UsageError(fmt::format("linear: MXFP4 W4A4 emulation needs an MXFP4 layer (or a dense one), this one is {}",
                                 prepare::format_label(w)));
  }
  // Batch-invariant mode (batch_invariant.h): one kernel per layer for every m, the decode half of a composite
  // precision (precision_for_rows at one row). The int8 kernel's arithmetic per row is the same for every m, so
  // Int8Decode is Int8 for every m where the SIMD int8 kernel exists (Fp32 where not); Bf16DecodeInt8 is Bf16.
  const bool invariant = batch_invariant();
  const prepare::ActivationPrecision precision = precision_for_rows(w.activation_precision, invariant ? 1 : m);
  const bool int8 = precision == prepare::ActivationPrecision::Int8;
  // Int4 layers too (int8_takes_int4), on x in prepared column order (below where an act-order g_idx permutes it).
  const bool int8_kernel = aq == ActivationEmulation::None && int8 && (fp4 || int8_takes_int4(w));
  if (int8_kernel && w.k_perm.empty()) return int8_gemm(w, x, m, y);
  const auto fp32_gemm = invariant ? invariant_gemm : gemm_dispatch;
  const auto bf16_kernel = invariant ? invariant_bf16_gemm : bf16_gemm;
  const bool bf16 = precision == prepare::ActivationPrecision::Bf16;
  if (aq == ActivationEmulation::None && fp4 && bf16 && w.k_perm.empty()) return bf16_kernel(w, x, m, y);
  // A bf16 lm_head / tied embedding, an FP8 layer, an FP8 / int8 lm_head copy: GPU engines multiply them with bf16
  // activations (an FP8 layer where the GPU has no FP8 units: on weights dequantized to bf16), so x in bf16 is the
  // norm when the precision asked for bf16 (for Bf16DecodeInt8 at every m: its int8 half applies to FP4 and Int4
  // layers only). Not in batch-invariant mode, whose GEMV serves every m on fp32 x.
  const bool bf16_allowed = w.activation_precision == prepare::ActivationPrecision::Bf16 ||
                            w.activation_precision == prepare::ActivationPrecision::Bf16DecodeInt8;
  // Int4 the same way on the rows whose precision is Bf16 (every row under Bf16, the decode rows under
  // Bf16DecodeInt8: its int8 rows keep fp32 x where the int8 kernel cannot take the layer), on weights (q − z)·s
  // rounded to bf16 as a bf16 dequantization gives them, at every m (int4 has no GEMV).
  const bool bf16_dot_layout = w.layout == prepare::WeightLayout::Dense || w.layout == prepare::WeightLayout::Fp8 ||
                               w.layout == prepare::WeightLayout::Int8 ||
                               (w.layout == prepare::WeightLayout::Int4 && bf16);
  const bool bf16_dots = aq == ActivationEmulation::None && !invariant && bf16_allowed && bf16_dot_layout;
  if (bf16_dots && w.k_perm.empty() && bf16_dot_gemm(w, x, m, y)) return;
  if (aq == ActivationEmulation::None && w.k_perm.empty()) return fp32_gemm(w, x, m, y);

  std::vector<float> xp(static_cast<size_t>(m * k));
  if (w.k_perm.empty()) {
    std::memcpy(xp.data(), x, xp.size() * sizeof(float));
  } else {
    for (int64_t i = 0; i < m; ++i) {
      const float* src = x + i * k;
      float* dst = xp.data() + i * k;
      for (int64_t j = 0; j < k; ++j) dst[j] = src[w.k_perm[static_cast<size_t>(j)]];
    }
  }
  if (emulate) emulate_nvfp4_activations(xp.data(), m, k, w.input_global_scale);
  if (emulate_mx) emulate_mxfp4_activations(xp.data(), m, k);
  if (int8_kernel) return int8_gemm(w, xp.data(), m, y);
  if (aq == ActivationEmulation::None && fp4 && bf16) return bf16_kernel(w, xp.data(), m, y);
  if (bf16_dots && bf16_dot_gemm(w, xp.data(), m, y)) return;  // an act-order int4 layer, x in prepared order
  fp32_gemm(w, xp.data(), m, y);
}

prepare::ActivationPrecision precision_for_rows(prepare::ActivationPrecision precision, int64_t m) {
  using prepare::ActivationPrecision;
  const bool decode = m <= int8_one_pass_rows();  // never true where no SIMD int8 kernel exists (0 rows)
  switch (precision) {
    case ActivationPrecision::Fp32:
    case ActivationPrecision::Int8:
    case ActivationPrecision::Bf16: return precision;
    case ActivationPrecision::Int8Decode: return decode ? ActivationPrecision::Int8 : ActivationPrecision::Fp32;
    case ActivationPrecision::Bf16DecodeInt8:
      return decode || int8_one_pass_rows() == 0 ? ActivationPrecision::Bf16 : ActivationPrecision::Int8;
  }
  return ActivationPrecision::Fp32;
}

void quantize_activations_int8(const float* x, int64_t m, int64_t k, int64_t block, float fine_ratio, int8_t* q,
                               int8_t* r, float* d, uint8_t* fine) {
  if (block < 1 || k % block != 0) {
    throw UsageError(fmt::format("quantize_activations_int8: K = {} is not a multiple of the block size {}", k, block));
  }
  if (m < 0) throw UsageError(fmt::format("quantize_activations_int8: m = {} is negative", m));
  if (!(fine_ratio >= 0.f)) throw UsageError(fmt::format("quantize_activations_int8: fine_ratio {} is not ≥ 0", fine_ratio));
  std::vector<uint8_t> flags(static_cast<size_t>(m * (k / block)));
  quantize_int8_blocks(x, m, k, block, /*octet_order=*/false, fine_ratio, q, r, d, nullptr, flags.data());
  // The kernels keep a coarse block's d = a/127; here every block has the scale of 256·q + r (exact: a power of 2).
  for (size_t g = 0; g < flags.size(); ++g) {
    if (flags[g] == 0) d[g] /= 256.f;
    if (fine != nullptr) fine[g] = flags[g];
  }
}

namespace {
std::atomic<bool> bf16_dot_allowed{true};
std::atomic<bool> batch_invariant_mode{false};
}  // namespace

void set_batch_invariant(bool on) { batch_invariant_mode.store(on, std::memory_order_relaxed); }

bool batch_invariant() { return batch_invariant_mode.load(std::memory_order_relaxed); }

void set_bf16_dot_allowed(bool allowed) { bf16_dot_allowed.store(allowed, std::memory_order_relaxed); }

bool bf16_dot_usable() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
#else
  constexpr bool cpu = false;
#endif
  return cpu && bf16_dot_allowed.load(std::memory_order_relaxed);
}

std::vector<int64_t> int8_gemm_targets() { return int8_targets(); }

bool int8_kernel_active() { return int8_one_pass_rows() > 0; }

const char* int8_gemm_target_name() { return int8_target_name(); }

}  // namespace fp4serve::kernels
