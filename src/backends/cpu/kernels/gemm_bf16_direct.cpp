// SPDX-License-Identifier: Apache-2.0
// ActivationPrecision::Bf16 at a few rows (a server's decode steps: 5 … kBf16DirectMaxRows) for the layers whose
// weights are stored one element per byte or per bf16 in [T][K][8] tiles (bf16 Dense, FP8, Int8): vdpbf16ps on the
// stored tiles, no panel. The panel GEMM (gemm_simd.cpp) decodes (copies) every panel of weights before it
// multiplies it: a bf16 lm_head at a server's decode step of 16 rows spent as long on that copy, which waits on
// DRAM, as on the dot products (bench_gemm_fp4 linear_bf16/bf16/49152x576/M:16 took 2.9× the time of M = 1). Here
// the dot products take the weights as they lie, two tiles (16 rows) per work item, and the stream from DRAM
// overlaps them. Compiled once per Highway target (foreach_target.h); only the AVX-512 target with GCC has the
// kernels (AVX512-BF16 instructions added by pragma, as in gemm_simd.cpp), the others return false.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/gemm_bf16_direct.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/kernels/fp4_scales-inl.h"
#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/gemm_shared.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

#if (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && HWY_COMPILER_GCC_ACTUAL
#pragma GCC push_options
#pragma GCC target("avx512bf16")

using micro::Scratch;

// Rows of x per pass (one accumulator per row and 16 output rows: 16 of the 32 registers).
constexpr int64_t kDirectRows = 16;
// Bytes ahead of each tile's stream that are prefetched, into L2. bf16 49152×576, 3 alternating rounds of builds that
// differ in this constant only, ms at M = 8 / 16 (M = 1, the GEMV reading the same bytes: 1.1–1.7): 8 KiB into L1
// (the fused GEMVs' distance then; they prefetch into L2 too now) 2.5–2.9 / 3.1–3.4; 32, 64 and 128 KiB into L2
// all 1.2–1.8 / 2.2–2.3.
constexpr int64_t kDirectAhead = 65536;

HWY_INLINE void PrefetchL2(const void* p) {
  // The address as an integer: past the weights' end the hint is harmless, and no pointer leaves its array.
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kDirectAhead), _MM_HINT_T1);
}

// Sums of 16 output rows (two tiles) for kM rows of x → y, through the layer's epilogue.
template <int kM>
HWY_INLINE void StoreItem(const PreparedLinear& w, int64_t item, const __m512* acc, float* HWY_RESTRICT y) {
  const int64_t n_total = w.out_features;
  const int64_t n0 = 2 * item * kTileRows;
  const int64_t rows = std::min<int64_t>(2 * kTileRows, n_total - n0);
  alignas(64) float sums[2 * kTileRows];
  for (int i = 0; i < kM; ++i) {
    _mm512_store_ps(sums, acc[i]);
    EpilogueRow(w, n0, rows, sums, y + i * n_total + n0);
  }
}

// bf16 Dense: rows [16·item, 16·item + 16) of y for m = kM rows of x (xt [K/2][kM] bf16 pairs, pair q of every row
// side by side: one base register reaches them all). A 64-byte line of a tile holds 4 columns of its 8 rows, and one
// vpermt2w per column pair puts the two tiles' lines into pair order. bench_gemm_fp4 linear_bf16/bf16, 2 threads,
// AMD EPYC Zen 4, panel GEMM → this kernel, same run, µs: 49152×576 M = 8 3723–3762 → 1167–1907 (M = 1 reads the
// same bytes in 1138–1723), M = 16 4778–4843 → 2123–2185 (0.9 of the vdpbf16ps roof), M = 64 (four passes)
// 12332–13150 → 8845–8858; 4096² M = 64 7567–8253 → 6355–6647; 11008×4096 M = 64 level, M = 256 0.88× (so the panel
// GEMM keeps m > 64).
template <int kM>
HWY_INLINE void DenseItem(const PreparedLinear& w, int64_t item, const uint32_t* HWY_RESTRICT xt, float* HWY_RESTRICT y) {
  const int64_t k2 = w.in_features / 2;
  const auto* tile_a = w.codes.as<uint16_t>() + 2 * item * w.in_features * kTileRows;
  // An odd last tile reads its own columns twice; the upper 8 lanes are then past N and never stored.
  const auto* tile_b = 2 * item + 1 < w.tiles() ? tile_a + w.in_features * kTileRows : tile_a;
  // Word 2r + h of pair p's vector is row r's column 4c + 2p + h: rows 0-7 from tile a (the first vpermt2w
  // source), rows 8-15 from tile b (the second, indices + 32).
  alignas(64) static constexpr uint16_t kPairOrder[2][32] = {
      {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 32, 40, 33, 41, 34, 42, 35, 43, 36, 44, 37, 45, 38, 46, 39, 47},
      {16, 24, 17, 25, 18, 26, 19, 27, 20, 28, 21, 29, 22, 30, 23, 31,
       48, 56, 49, 57, 50, 58, 51, 59, 52, 60, 53, 61, 54, 62, 55, 63}};
  const __m512i order0 = _mm512_load_si512(kPairOrder[0]);
  const __m512i order1 = _mm512_load_si512(kPairOrder[1]);
  __m512 acc[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) acc[i] = _mm512_setzero_ps();
  // Two pairs per line (K is a multiple of 16 here).
  for (int64_t line = 0; line < k2 / 2; ++line) {
    const uint16_t* at_a = tile_a + 4 * line * kTileRows;
    const uint16_t* at_b = tile_b + 4 * line * kTileRows;
    PrefetchL2(at_a);
    PrefetchL2(at_b);
    const __m512i a = _mm512_loadu_si512(at_a);
    const __m512i b = _mm512_loadu_si512(at_b);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const auto pairs = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(a, h == 0 ? order0 : order1, b));
      const uint32_t* xq = xt + (2 * line + h) * kM;
#pragma GCC unroll 16
      for (int i = 0; i < kM; ++i) {
        acc[i] = _mm512_dpbf16_ps(acc[i], pairs, reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(xq[i]))));
      }
    }
  }
  StoreItem<kM>(w, item, acc, y);
}

// FP8 / Int8 ([T][K][8] bytes, scales [T][groups][8] fp32): the same for code · scale rounded to bf16, the panel
// decoder's weights (gemm_simd.cpp DecodeRowScaledTileBf16), decoded in registers. Per column pair each tile's 16
// bytes are interleaved into pair order and widened, scaled, and one vcvtne2ps2bf16 packs both tiles' 16 rows.
// bench_gemm_fp4 linear_bf16/fp8row at M = 16, one thread, Zen 4: 0.18–0.19 of the roof on the panel GEMM, 0.27–0.32
// here (docs/performance.md "FP8 layers on bf16 dot products").
template <WeightLayout kLayout, int kM>
HWY_INLINE void ByteItem(const PreparedLinear& w, int64_t item, const uint32_t* HWY_RESTRICT xt, float* HWY_RESTRICT y) {
  static_assert(kLayout == WeightLayout::Fp8 || kLayout == WeightLayout::Int8);
  const int64_t k_total = w.in_features, groups = w.groups();
  const int64_t ta = 2 * item, tb = ta + 1 < w.tiles() ? ta + 1 : ta;  // an odd last tile: see DenseItem
  const int8_t* code_a = w.codes.as<int8_t>() + ta * k_total * kTileRows;
  const int8_t* code_b = w.codes.as<int8_t>() + tb * k_total * kTileRows;
  const float* scale_a = w.scales.as<float>() + ta * groups * kTileRows;
  const float* scale_b = w.scales.as<float>() + tb * groups * kTileRows;
  const __m512i e4m3_keep = _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u));
  const __m512i each_twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  // 16 bytes (column k's 8 rows, then column k + 1's) → 16 fp32 in pair order: lane 2r column k, 2r + 1 column k + 1.
  const auto widen = [&](const int8_t* at) HWY_ATTR {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    const __m512i wide = _mm512_cvtepi8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_si128(bytes, 8)));
    if constexpr (kLayout == WeightLayout::Fp8) {
      // Sign-extended byte << 20: the sign at bit 31, the magnitude at bits 26..20 (value · 2^−120, the 2^120 in
      // the stored scale).
      return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(wide, 20), e4m3_keep));
    } else {
      return _mm512_cvtepi32_ps(wide);
    }
  };
  __m512 acc[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) acc[i] = _mm512_setzero_ps();
  int64_t group = -1, next_group_at = 0;  // no division per pair: it cost as much as the pair's dot products
  __m512 sa{}, sb{};
  for (int64_t q = 0; q < k_total / 2; ++q) {
    const int64_t k = 2 * q;
    if (k % 8 == 0) {  // one 64-byte line per 8 columns of each tile
      PrefetchL2(code_a + k * kTileRows);
      PrefetchL2(code_b + k * kTileRows);
    }
    if (k == next_group_at) {  // a pair never straddles a group (even groups)
      ++group;
      next_group_at += w.group_size;
      sa = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(scale_a + group * kTileRows)));
      sb = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(scale_b + group * kTileRows)));
    }
    const __m512 va = _mm512_mul_ps(widen(code_a + k * kTileRows), sa);
    const __m512 vb = _mm512_mul_ps(widen(code_b + k * kTileRows), sb);
    const __m512bh pairs = _mm512_cvtne2ps_pbh(vb, va);  // 32-bit lanes 0-7: tile a's rows, 8-15: tile b's
    const uint32_t* xq = xt + q * kM;
#pragma GCC unroll 16
    for (int i = 0; i < kM; ++i) {
      acc[i] = _mm512_dpbf16_ps(acc[i], pairs, reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(xq[i]))));
    }
  }
  StoreItem<kM>(w, item, acc, y);
}

// xp [m][K/2] bf16 pairs (x rounded to bf16), m ≤ kBf16DirectMaxRows, in passes of kDirectRows.
bool Bf16DirectImpl(const PreparedLinear& w, const uint32_t* xp, int64_t m, float* y) {
  const bool dense = w.layout == WeightLayout::Dense && w.dense_storage == prepare::DenseStorage::Bf16;
  const bool bytes =
      (w.layout == WeightLayout::Fp8 || w.layout == WeightLayout::Int8) && w.group_size > 0 && w.group_size % 2 == 0;
  // FP8 / Int8 decode their bytes once per pass: above one pass the panel GEMM, which decodes once, was as fast or
  // faster (bench_gemm_fp4 linear_bf16/fp8row M = 64, one thread: 0.25–0.30 of the roof here, 0.31 on the panel).
  const int64_t max_rows = bytes ? kDirectRows : kBf16DirectMaxRows;
  if ((!dense && !bytes) || w.in_features % 16 != 0 || m < 1 || m > max_rows) return false;
  const int64_t k2 = w.in_features / 2;
  thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> transposed;
  thread_local size_t capacity = 0;
  const int64_t items = (w.tiles() + 1) / 2;
  for (int64_t r0 = 0; r0 < m; r0 += kDirectRows) {
    const int64_t mm = std::min(kDirectRows, m - r0);
    uint32_t* xt = Scratch(transposed, capacity, static_cast<size_t>(mm * k2));
    for (int64_t i = 0; i < mm; ++i) {
      for (int64_t q = 0; q < k2; ++q) xt[q * mm + i] = xp[(r0 + i) * k2 + q];
    }
    float* yr = y + r0 * w.out_features;
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      ForRowCount<static_cast<int>(kDirectRows)>(mm, [&]<int kM>() HWY_ATTR {
        if (dense) {
          DenseItem<kM>(w, item, xt, yr);
        } else if (w.layout == WeightLayout::Fp8) {
          ByteItem<WeightLayout::Fp8, kM>(w, item, xt, yr);
        } else {
          ByteItem<WeightLayout::Int8, kM>(w, item, xt, yr);
        }
      });
    }
  }
  return true;
}

#pragma GCC pop_options
#else
bool Bf16DirectImpl(const PreparedLinear&, const uint32_t*, int64_t, float*) { return false; }
#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels {

HWY_EXPORT(Bf16DirectImpl);

bool bf16_direct_gemm(const prepare::PreparedLinear& w, const uint32_t* xp, int64_t m, float* y) {
  return HWY_DYNAMIC_DISPATCH(Bf16DirectImpl)(w, xp, m, y);
}

}  // namespace fp4serve::kernels
#endif
