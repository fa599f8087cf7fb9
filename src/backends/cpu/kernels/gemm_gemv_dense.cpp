// SPDX-License-Identifier: Apache-2.0
// The decode (m ≤ 4) GEMV for the layers stored one element per column and row in [T][K][8] tiles: bf16 Dense (an
// lm_head, a tied embedding), FP8 (per tensor, row or block) and Int8 (an lm_head's copy); batch-invariant mode
// runs it for every m (batch_invariant.h). Called by gemm_gemv.cpp's dispatch (dense_rows_gemv); compiled once per
// Highway target (foreach_target.h), with kernels on x86 AVX2 and AVX-512, false elsewhere (the panel GEMM then
// serves these layers).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/gemm_gemv_dense.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/kernels/fp4_scales-inl.h"
#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/gemm_shared.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)

constexpr int64_t kRows = kFusedRows;  // output rows per vector: one tile (AVX2) or two (AVX-512)
using DF = hn::FixedTag<float, kRows>;
using VF = hn::Vec<DF>;

// The panel path widens these into an fp32 panel and reads it back (two extra passes over L1 per weight); here
// each load is multiplied straight from registers. bf16: one vector load brings kRows/4 columns of the tile's 8
// rows; interleaving zeros below each 16-bit element (vpunpcklwd / vpunpckhwd, per 128-bit block) makes rows
// 0–3 and 4–7 of those columns fp32 with no shift, against x replicated 4× per column. FP8: a sign-extending byte
// load, a shift and a mask per column (value · 2^−120, folded into the stored scale), each scale group's sums
// (K for tensor and row scales, the block width for blocks) times its scales (block scales took the panel path
// before: 0.17 of the bandwidth at M = 1); Int8 the same load and an int → fp32 conversion. Both stream the weights
// once. On AVX-512 the bytes run two tiles per vector (ByteTilePair): bench_gemm_fp4 fp8row, 2 threads, weight GB/s
// against 8 rows per 256-bit vector (ByteTile), two alternating rounds: 4096² M = 1 19.8 / 21.9 vs 17.2 / 18.0, M = 4
// 16.6 / 19.5 vs 12.8 / 12.9, 49152×576 M = 4 16.6 / 19.8 vs 12.1 / 13.0; the default model's 576×1536 at M = 1
// 0.92–0.95× (half as many work items). Two columns of one tile per vector against x pairs replicated 8× in memory
// read 0.46–0.59 of the bandwidth at 4096², M = 1, against ByteTile's 0.58–0.87 (the replicated x is 4 bytes per
// weight), so that was not kept.

// xr[i][4k + c] = x[i][k]: one load then gives each 128-bit block its column's activation.
HWY_INLINE void Replicate4(const float* x, int64_t m, int64_t k, float* xr) {
  for (int64_t j = 0; j < m * k; ++j) {
    xr[4 * j] = xr[4 * j + 1] = xr[4 * j + 2] = xr[4 * j + 3] = x[j];
  }
}

template <int kM>
HWY_INLINE void Bf16Tile(const PreparedLinear& w, int64_t tile, const float* HWY_RESTRICT xr, float* HWY_RESTRICT acc) {
  const DF df;
  const hn::FixedTag<uint16_t, 2 * kRows> du16;
  const hn::FixedTag<uint32_t, kRows> du32;
  constexpr int64_t kCols = kRows / 4;  // columns per load
  const int64_t k_total = w.in_features;
  const uint16_t* src = w.codes.as<uint16_t>() + tile * k_total * kTileRows;
  const auto zero = hn::Zero(du16);
  VF lo[kM][2], hi[kM][2];  // [row of x][column parity]: two chains per output half
  for (int i = 0; i < kM; ++i) lo[i][0] = lo[i][1] = hi[i][0] = hi[i][1] = hn::Zero(df);
  int64_t kk = 0;
  for (; kk + 2 * kCols <= k_total; kk += 2 * kCols) {
    // This step reads 2·kCols·8 bf16: one 64-byte line (32 bf16) on AVX2, two on AVX-512.
    for (int64_t line = 0; line < 2 * kCols * kTileRows; line += 32) prefetch_ahead(src + kk * kTileRows + line);
    for (int u = 0; u < 2; ++u) {
      const auto v = hn::Load(du16, src + (kk + u * kCols) * kTileRows);
      const VF a = hn::BitCast(df, hn::ZipLower(du32, zero, v));
      const VF b = hn::BitCast(df, hn::ZipUpper(du32, zero, v));
      for (int i = 0; i < kM; ++i) {
        const VF xv = hn::Load(df, xr + (i * k_total + kk + u * kCols) * 4);
        lo[i][u] = hn::MulAdd(a, xv, lo[i][u]);
        hi[i][u] = hn::MulAdd(b, xv, hi[i][u]);
      }
    }
  }
  for (; kk < k_total; kk += kCols) {
    const auto v = hn::Load(du16, src + kk * kTileRows);
    const VF a = hn::BitCast(df, hn::ZipLower(du32, zero, v));
    const VF b = hn::BitCast(df, hn::ZipUpper(du32, zero, v));
    for (int i = 0; i < kM; ++i) {
      const VF xv = hn::Load(df, xr + (i * k_total + kk) * 4);
      lo[i][0] = hn::MulAdd(a, xv, lo[i][0]);
      hi[i][0] = hn::MulAdd(b, xv, hi[i][0]);
    }
  }
  for (int i = 0; i < kM; ++i) {
    alignas(64) float l[kRows], h[kRows];
    hn::Store(hn::Add(lo[i][0], lo[i][1]), df, l);
    hn::Store(hn::Add(hi[i][0], hi[i][1]), df, h);
    for (int r = 0; r < 4; ++r) {
      float sl = 0.f, sh = 0.f;
      for (int64_t c = 0; c < kCols; ++c) {
        sl += l[4 * c + r];
        sh += h[4 * c + r];
      }
      acc[i * kTileRows + r] = sl;
      acc[i * kTileRows + 4 + r] = sh;
    }
  }
}

// kInt8: the Int8 layout (code · scale); else E4M3 (value · 2^−120, the 2^120 in the stored scale).
template <bool kInt8, int kM>
HWY_INLINE void ByteTile(const PreparedLinear& w, int64_t tile, const float* HWY_RESTRICT x, float* HWY_RESTRICT acc) {
  const hn::FixedTag<float, 8> d8;
  const hn::FixedTag<int32_t, 8> di8;
  const int64_t k_total = w.in_features;
  const int8_t* src = w.codes.as<int8_t>() + tile * k_total * kTileRows;
  const auto keep = hn::Set(di8, static_cast<int32_t>(0x87F00000u));
  const auto column = [&](int64_t k) HWY_ATTR {
    const auto b = hn::PromoteTo(di8, hn::LoadU(hn::FixedTag<int8_t, 8>(), src + k * kTileRows));
    if constexpr (kInt8) return hn::ConvertTo(d8, b);
    // Sign-extended byte << 20 puts the sign at bit 31 and the magnitude at bits 26..20 (value · 2^−120).
    return hn::BitCast(d8, hn::And(hn::ShiftLeft<20>(b), keep));
  };
  // Per scale group: the raw sums, then times the group's scales (one group: Σ·scale, as before blocks came here).
  const int64_t groups = w.groups();
  hn::Vec<decltype(d8)> total[kM];
  for (int i = 0; i < kM; ++i) total[i] = hn::Zero(d8);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k_end = std::min(k_total, (g + 1) * w.group_size);
    // Two chains per row, unrolled by hand: an accumulator indexed by k & 1 would live in memory.
    hn::Vec<decltype(d8)> a0[kM], a1[kM];
    for (int i = 0; i < kM; ++i) a0[i] = a1[i] = hn::Zero(d8);
    int64_t k = g * w.group_size;
    for (; k + 2 <= k_end; k += 2) {
      if (k % 8 == 0) prefetch_ahead(src + k * kTileRows);
      const auto f0 = column(k), f1 = column(k + 1);
      for (int i = 0; i < kM; ++i) {
        a0[i] = hn::MulAdd(f0, hn::Set(d8, x[i * k_total + k]), a0[i]);
        a1[i] = hn::MulAdd(f1, hn::Set(d8, x[i * k_total + k + 1]), a1[i]);
      }
    }
    if (k < k_end) {
      const auto f0 = column(k);
      for (int i = 0; i < kM; ++i) a0[i] = hn::MulAdd(f0, hn::Set(d8, x[i * k_total + k]), a0[i]);
    }
    const auto scale = hn::Load(d8, w.scales.as<float>() + (tile * groups + g) * kTileRows);
    for (int i = 0; i < kM; ++i) total[i] = hn::MulAdd(hn::Add(a0[i], a1[i]), scale, total[i]);
  }
  for (int i = 0; i < kM; ++i) hn::StoreU(total[i], d8, acc + i * kTileRows);
}

#if HWY_TARGET != HWY_AVX2
// AVX-512: ByteTile for two tiles (16 rows) per 512-bit vector: each column's 8 bytes of both tiles widened together,
// one broadcast of x[k] for 16 rows (as the FP4 GEMV does), half ByteTile's instructions per weight. tb = ta for an
// odd last tile (its second copy lands in rows past N). The same sums per row and group as ByteTile.
template <bool kInt8, int kM>
HWY_INLINE void ByteTilePair(const PreparedLinear& w, int64_t ta, int64_t tb, const float* HWY_RESTRICT x,
                             float* HWY_RESTRICT acc) {
  const int64_t k_total = w.in_features, groups = w.groups();
  const int8_t* src_a = w.codes.as<int8_t>() + ta * k_total * kTileRows;
  const int8_t* src_b = w.codes.as<int8_t>() + tb * k_total * kTileRows;
  const __m512i keep = _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u));
  const auto column = [&](int64_t k) HWY_ATTR {
    const __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src_a + k * kTileRows)),
                                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src_b + k * kTileRows)));
    const __m512i wide = _mm512_cvtepi8_epi32(bytes);
    if constexpr (kInt8) return _mm512_cvtepi32_ps(wide);
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(wide, 20), keep));
  };
  __m512 total[kM];
  for (int i = 0; i < kM; ++i) total[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k_end = std::min(k_total, (g + 1) * w.group_size);
    __m512 a0[kM], a1[kM];
    for (int i = 0; i < kM; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    int64_t k = g * w.group_size;
    for (; k + 2 <= k_end; k += 2) {
      if (k % 8 == 0) {
        prefetch_ahead(src_a + k * kTileRows);
        prefetch_ahead(src_b + k * kTileRows);
      }
      const __m512 f0 = column(k), f1 = column(k + 1);
      for (int i = 0; i < kM; ++i) {
        a0[i] = _mm512_fmadd_ps(f0, _mm512_set1_ps(x[i * k_total + k]), a0[i]);
        a1[i] = _mm512_fmadd_ps(f1, _mm512_set1_ps(x[i * k_total + k + 1]), a1[i]);
      }
    }
    if (k < k_end) {
      const __m512 f0 = column(k);
      for (int i = 0; i < kM; ++i) a0[i] = _mm512_fmadd_ps(f0, _mm512_set1_ps(x[i * k_total + k]), a0[i]);
    }
    const float* scales = w.scales.as<float>();
    const __m512 scale = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(scales + (ta * groups + g) * kTileRows)),
                                            _mm256_loadu_ps(scales + (tb * groups + g) * kTileRows), 1);
    for (int i = 0; i < kM; ++i) total[i] = _mm512_fmadd_ps(_mm512_add_ps(a0[i], a1[i]), scale, total[i]);
  }
  for (int i = 0; i < kM; ++i) _mm512_storeu_ps(acc + i * 2 * kTileRows, total[i]);
}
#endif

// Any m ≥ 1: the rows of x in chunks of 4 inside each item (a decode step's m ≤ 4 is one chunk; batch-invariant
// mode sends every m here: a row's sums do not depend on the chunk).
bool DenseRowsImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  constexpr int kChunk = 4;
  const int64_t k = w.in_features;
  const bool bf16 = w.layout == WeightLayout::Dense;
  const float* xin = x;
  if (bf16) {
    thread_local hwy::AlignedFreeUniquePtr<float[]> xr;
    thread_local size_t cap = 0;
    float* replicated = micro::Scratch(xr, cap, static_cast<size_t>(4 * m * k));
    Replicate4(x, m, k, replicated);
    xin = replicated;
  }
#if HWY_TARGET != HWY_AVX2
  if (!bf16) {
    ForEachRowItemChunked<kChunk, 2 * kTileRows>(w, m, y, [&]<int kM>(int64_t ta, int64_t tb, int64_t r0, float* acc) HWY_ATTR {
      if (w.layout == WeightLayout::Int8) {
        ByteTilePair<true, kM>(w, ta, tb, x + r0 * k, acc);
      } else {
        ByteTilePair<false, kM>(w, ta, tb, x + r0 * k, acc);
      }
    });
    return true;
  }
#endif
  ForEachRowItemChunked<kChunk, kTileRows>(w, m, y, [&]<int kM>(int64_t t, int64_t, int64_t r0, float* acc) HWY_ATTR {
    if (bf16) {
      Bf16Tile<kM>(w, t, xin + 4 * r0 * k, acc);
    } else if (w.layout == WeightLayout::Int8) {
      ByteTile<true, kM>(w, t, xin + r0 * k, acc);
    } else {
      ByteTile<false, kM>(w, t, xin + r0 * k, acc);
    }
  });
  return true;
}

#else
bool DenseRowsImpl(const PreparedLinear&, const float*, int64_t, float*) { return false; }
#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels {

HWY_EXPORT(DenseRowsImpl);

bool dense_rows_gemv(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  return HWY_DYNAMIC_DISPATCH(DenseRowsImpl)(w, x, m, y);
}

}  // namespace fp4serve::kernels
#endif
