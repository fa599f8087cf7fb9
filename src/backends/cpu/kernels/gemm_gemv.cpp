// SPDX-License-Identifier: Apache-2.0
// The decode (small-m) fast path for NVFP4 and MXFP4: a fused GEMV that never materialises decoded weights.
// Compiled once per Highway target (foreach_target.h re-includes this file).
//
// Why a separate kernel: at small m the panel GEMM (gemm_simd.cpp) spends ~1.5 instructions per weight
// (callgrind, AVX2, m = 1) decoding E2M1 codes into an fp32 panel and reloading it, which caps it far below
// the DRAM read roof. Here (0.79 NVFP4 / 0.74 MXFP4 on AVX2; ~0.27 / 0.23 in the AVX-512 loop), with the
// row-word layout of prepared_linear.h (one 32-bit lane = 8 columns of one row), a weight column for all lanes
// costs one shift and one table lookup, x[k] is a broadcast (folded into the FMA's memory operand on
// AVX-512), and the block scale multiplies a per-group partial sum once per 16/32 columns instead of every
// weight:
//   Σ_k x[k]·q[n,k]·s[n,g(k)] = Σ_g s[n,g] · (Σ_{k∈g} x[k]·q[n,k])
// - AVX-512 (AVX3, AVX3_DL): a 512-bit vector holds two 8-row tiles (16 rows); vpermps with the 16 E2M1
//   values as the table reads only bits [3:0] of each index lane, so `word >> 4j` needs no mask.
// - AVX2: 8 rows per vector; vpshufb maps each nibble to E2M1·2 as int8, a second vpshufb moves byte j of
//   each lane to its top byte (int8 · 2^24), vcvtdq2ps makes it fp32 (the 2^25 is taken out per group). With
//   one x row a call covers two tiles, so each broadcast x[k] feeds two FMAs. Both changes together:
//   bench_gemm_fp4, one thread, M = 1, 1.2–1.3× on the model's 576/1536 shapes and 4096² (docs/performance.md "CPU decode").
// - AVX-512 with AVX512-BF16 (Zen 4, Sapphire Rapids): vpermw looks up two columns of 16 rows as bf16 pairs and
//   vdpbf16ps multiplies them with x carried as two bf16 (Bf16PairTiles below): 0.65× the instructions.
// - Other SIMD targets (NEON, SVE): the AVX2 decode in portable Highway ops, 4 or 8 rows per vector, m ≤ 4.
// Batch-invariant mode (batch_invariant.h) runs these kernels for every m, the rows in chunks of a fixed size
// inside each work item (GemvInvariantImpl).
// EMU128 returns false and the caller runs the general GEMM. Threads split N (items of 16 rows; 8 on AVX2 with
// m > 1); K is never split, so a layer with N < 16·threads leaves threads idle.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/gemm_gemv.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <utility>

#include "backends/cpu/kernels/fp4_scales-inl.h"
#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)

// kMaxM: the largest m served here. Measured with bench_gemm_fp4 (one thread, L2-resident 576x1536, CPU
// time per call vs the panel GEMM): AVX2 wins up to m = 4 (NVFP4 121 vs 146 us) and loses at m = 5 (174 vs
// 161 us; 16 ymm registers cannot hold 5 rows of accumulators); AVX-512 still wins at m = 8 (158 vs 176 us).
constexpr int64_t kRows = kFusedRows;  // output rows per vector: one tile (AVX2) or two (AVX-512)
#if HWY_TARGET == HWY_AVX2
constexpr int64_t kMaxM = 4;
#else
constexpr int64_t kMaxM = 8;
#endif
using DF = hn::FixedTag<float, kRows>;
using DI = hn::FixedTag<int32_t, kRows>;
using VF = hn::Vec<DF>;

#if HWY_TARGET == HWY_AVX2

// One tile octet (32 bytes: 8 columns of 8 rows) with every nibble looked up as E2M1 · 2 in int8: byte b of lane
// r of `even` is column 2b of row r, of `odd` column 2b + 1.
struct OctetBytes {
  __m256i even, odd;
};

HWY_INLINE OctetBytes LookupOctet(const uint8_t* p) {
  alignas(16) static constexpr int8_t kLut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kLut)));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_shuffle_epi8(lut, _mm256_and_si256(v, low4)),
          _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4))};
}

// Column j of the octet as fp32 · 2^24 · 2: a byte shuffle moves byte j/2 of each lane to the lane's top byte and
// zeroes the others (the top byte itself only needs the others cleared), so the int32 is the int8 · 2^24 and
// converts exactly. Two instructions per column; a shift pair that sign-extends the byte costs three.
template <int kJ>
HWY_INLINE VF Column(const OctetBytes& o) {
  const __m256i bytes = kJ % 2 == 0 ? o.even : o.odd;
  constexpr int kByte = kJ / 2;
  if constexpr (kByte == 3) {
    return VF{_mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(static_cast<int32_t>(0xFF000000u))))};
  } else {
    // Per 128-bit half, lane r (r < 4) takes byte 4r + kByte into its top byte; index bit 7 set → 0.
    const __m256i to_top = _mm256_setr_epi8(
        -128, -128, -128, kByte, -128, -128, -128, 4 + kByte, -128, -128, -128, 8 + kByte, -128, -128, -128, 12 + kByte,
        -128, -128, -128, kByte, -128, -128, -128, 4 + kByte, -128, -128, -128, 8 + kByte, -128, -128, -128, 12 + kByte);
    return VF{_mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, to_top))};
  }
}
// The columns hold E2M1 · 2^25; GemvTiles takes the 2^-25 out once per group.
constexpr float kLutUnit = 0x1p-25f;

// Calls use.template operator()<J>() for J = 0 … 7.
template <class Use>
HWY_INLINE void ForEachColumn(Use&& use) {
  [&]<int... kJ>(std::integer_sequence<int, kJ...>) HWY_ATTR { (use.template operator()<kJ>(), ...); }(
      std::make_integer_sequence<int, 8>());
}

#else

// DecodeOctet (fp4_scales-inl.h) yields E2M1 itself.
constexpr float kLutUnit = 1.f;

#endif

#if HWY_TARGET == HWY_AVX2

// Tiles one call covers: two for a single x row, so that each broadcast of x[k] feeds two FMAs; one for more x
// rows, which already share each decoded column and whose accumulators fill the 16 ymm registers.
template <int kM>
constexpr int64_t kTilesPerCall = kM == 1 ? 2 : 1;

// Raw sums acc[i][8t + r] = Σ_k x[i, k] · W[row r of tile (ta, tb)[t], k] (block scales applied, global scale
// not), i < kM. Two partial sums per x row and tile (even/odd columns) shorten the FMA dependency chains.
// kT: tiles per call (kTilesPerCall<kM>; the batch-invariant GEMV takes one for every kM, items of one tile). The
// arithmetic of a row does not depend on kT or kM.
template <quant::BlockFormat kFormat, int kM, int64_t kT = kTilesPerCall<kM>>
HWY_INLINE void GemvTiles(const PreparedLinear& w, int64_t ta, int64_t tb, const float* HWY_RESTRICT x,
                          float* HWY_RESTRICT acc) {
  const DF df;
  const int64_t k_total = w.in_features;
  const int64_t groups = w.groups();
  constexpr int64_t kOctetsPerGroup = quant::block_format_traits(kFormat).group_size / 8;
  const int64_t tiles[2] = {ta, tb};
  const uint8_t* codes[kT];
  const uint8_t* scales[kT];
  for (int64_t t = 0; t < kT; ++t) {
    codes[t] = w.codes.as<uint8_t>() + prepare::code_tile_offset(k_total, tiles[t]);
    scales[t] = w.scales.as<uint8_t>() + prepare::scale_tile_offset(groups, tiles[t]);
  }
  // The columns carry 2^25. An E4M3 scale takes the 2^-25 itself (its smallest value, 2^-9, stays normal); an E8M0
  // scale reaches 2^-127, so there the group sum takes 2^-24 and the scale the remaining ½.
  constexpr bool kE4m3Scale = quant::block_format_traits(kFormat).scale == quant::ElementFormat::E4M3;
  constexpr float kScaleUnit = kE4m3Scale ? kLutUnit : 0.5f;
  VF total[kT][kM];
  for (auto& per_tile : total) {
    for (VF& v : per_tile) v = hn::Zero(df);
  }
  const ItemAheadPrefetch ahead(w, ta);
  for (int64_t g = 0; g < groups; ++g) {
    ahead.step(g);
    VF part[kT][kM][2];
    for (auto& per_tile : part) {
      for (auto& chains : per_tile) chains[0] = chains[1] = hn::Zero(df);
    }
    for (int64_t o = 0; o < kOctetsPerGroup; ++o) {
      const int64_t c = g * kOctetsPerGroup + o;
      const float* xc = x + 8 * c;
      OctetBytes bytes[kT];
      for (int64_t t = 0; t < kT; ++t) bytes[t] = LookupOctet(codes[t] + prepare::kOctetStride * c);
      ForEachColumn([&]<int kJ>() HWY_ATTR {
        VF col[kT];
        for (int64_t t = 0; t < kT; ++t) col[t] = Column<kJ>(bytes[t]);
        for (int i = 0; i < kM; ++i) {
          const VF xv = hn::Set(df, xc[i * k_total + kJ]);
          for (int64_t t = 0; t < kT; ++t) part[t][i][kJ & 1] = hn::MulAdd(col[t], xv, part[t][i][kJ & 1]);
        }
      });
    }
    for (int64_t t = 0; t < kT; ++t) {
      const VF scale = BlockScales<kFormat>(scales[t] + g * prepare::kScaleGroupStride, kScaleUnit);
      for (int i = 0; i < kM; ++i) {
        VF sum = hn::Add(part[t][i][0], part[t][i][1]);
        if constexpr (!kE4m3Scale) sum = hn::Mul(sum, hn::Set(df, 0x1p-24f));
        total[t][i] = hn::MulAdd(sum, scale, total[t][i]);
      }
    }
  }
  for (int64_t t = 0; t < kT; ++t) {
    for (int i = 0; i < kM; ++i) hn::StoreU(total[t][i], df, acc + i * kT * kRows + t * kRows);
  }
}

#else

template <int kM>
constexpr int64_t kTilesPerCall = 1;  // one 512-bit vector already spans two tiles

// The code bytes and block-scale bytes of the tile pair that starts at tile ta (a 512-bit vector holds one column
// octet of both tiles; 16 scale bytes one group of both).
struct TilePair {
  const uint8_t *codes, *scales;
};
HWY_INLINE TilePair TilePairBytes(const PreparedLinear& w, int64_t ta) {
  return {w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, ta),
          w.scales.as<uint8_t>() + prepare::scale_tile_offset(w.groups(), ta)};
}

// Raw sums acc[i][r] = Σ_k x[i, k] · W[row r of tiles (ta, tb), k] (block scales applied, global scale not),
// i < kM. Two partial sums per x row (even/odd columns) shorten the FMA dependency chains; the arithmetic of a
// row does not depend on kM. kT: as the AVX2 kernel's (a 512-bit vector already spans both tiles: always 1).
template <quant::BlockFormat kFormat, int kM, int64_t kT = 1>
HWY_INLINE void GemvTiles(const PreparedLinear& w, int64_t ta, int64_t tb, const float* HWY_RESTRICT x,
                          float* HWY_RESTRICT acc) {
  static_assert(kT == 1, "one call covers the tile pair");
  const DF df;
  const int64_t k_total = w.in_features;
  const int64_t groups = w.groups();
  constexpr int64_t kOctetsPerGroup = quant::block_format_traits(kFormat).group_size / 8;
  (void)tb;  // ta + 1: the pair's second tile
  const auto [codes, scales] = TilePairBytes(w, ta);
  VF total[kM];
  for (int i = 0; i < kM; ++i) total[i] = hn::Zero(df);
  const ItemAheadPrefetch ahead(w, ta);
  for (int64_t g = 0; g < groups; ++g) {
    ahead.step(g);
    VF part[kM][2];
    for (int i = 0; i < kM; ++i) part[i][0] = part[i][1] = hn::Zero(df);
    for (int64_t o = 0; o < kOctetsPerGroup; ++o) {
      const int64_t c = g * kOctetsPerGroup + o;
      const float* xc = x + 8 * c;
      auto use = [&](int j, VF col) HWY_ATTR {
        for (int i = 0; i < kM; ++i) part[i][j & 1] = hn::MulAdd(col, hn::Set(df, xc[i * k_total + j]), part[i][j & 1]);
      };
      DecodeOctet(codes + prepare::kOctetStride * c, use);
    }
    const VF scale = BlockScales<kFormat>(scales + g * prepare::kScaleGroupStride, kLutUnit);
    for (int i = 0; i < kM; ++i) total[i] = hn::MulAdd(hn::Add(part[i][0], part[i][1]), scale, total[i]);
  }
  for (int i = 0; i < kM; ++i) hn::StoreU(total[i], df, acc + i * kRows);
}

#endif

#if (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && HWY_COMPILER_GCC_ACTUAL
// ---- AVX512-BF16: the same GEMV with vdpbf16ps (CPUs that have it: Zen 4 and later, Sapphire Rapids) ----
// Highway 1.0 has no target with AVX512-BF16, so this section adds it (GCC's target pragmas accumulate) and
// bf16_dot_usable() checks the CPU at run time.
// Why: the loop above spends a shift, a vpermps and an FMA per 16 weights (one column of 16 rows). vpermw over
// the 32-bit row words looks up columns j and j + 4 of every row at once as a bf16 pair (low word: bits 0–15,
// columns 0–3; high word: columns 4–7), and one vdpbf16ps multiplies the pair with (x[j], x[j + 4]): half the
// lookups and half the shifts. Per 128 weights at m = 1: 3 shifts + 4 vpermw + 8 vdpbf16ps against 7 + 8 + 8 with
// x split in two (0.65×), 3 + 4 + 4 with x in one bf16 (ActivationPrecision::Bf16, 0.48×).
// E2M1 values are exact in bf16; x is not, so for fp32 activations it is carried as two bf16, hi = bf16(x) and
// lo = bf16(x − hi) (both round to nearest even; x − hi is exact), and every pair is multiplied twice. The products
// are exact in fp32 and vdpbf16ps adds them one at a time, so the only error beyond the fp32 path's is x − hi − lo:
// at most 2^−17·|x| (|x − hi| ≤ 2^−8·|x|, and lo rounds that to 8 bits: 1 + 2^−9 + 2^−17 reaches it), while the
// reference path's fp32 accumulation over K = 576 alone allows 576·2^−24 ≈ 2^−14.8 of Σ|x·w|. vdpbf16ps treats
// subnormal inputs and results as zero, so lo is lost below |x − hi| < 2^−126 (|x| below ≈ 2^−117: far below what
// an activation carries). One thread, M = 1, an L1-resident 16 × 576 tile pair: 1.7 ns per 128 weights against
// 2.2 for the loop above (a microbenchmark). bench_gemm_fp4 M = 1, one thread, cold weights, AMD EPYC (Zen 4), this
// kernel ÷ the FMA kernel in the same run (linear/ vs linear_fma/): NVFP4 1.22–1.25× at 576×1536, 1536×576, 4096²
// and 11008×4096, MXFP4 1.09–1.33×.
#define FP4SERVE_BF16_DOT 1
#pragma GCC push_options
#pragma GCC target("avx512bf16")

// The words per octet and x row of PairActivations<kSplit>: four pairs of hi, and with kSplit four of lo.
template <bool kSplit>
constexpr int64_t kPairWords = kSplit ? 8 : 4;

// xp [K/8][m][kPairWords] uint32: per octet c of columns and row i, the bf16 pairs (x[8c + j], x[8c + j + 4]) of hi
// for j = 0 … 3 (low word x[8c + j]), then (kSplit) those of lo, so that everything one octet needs is in one block.
// Without kSplit, hi alone: x rounded to bf16 (ActivationPrecision::Bf16).
template <bool kSplit>
HWY_INLINE void PairActivations(const float* HWY_RESTRICT x, int64_t m, int64_t k, uint32_t* HWY_RESTRICT xp) {
  constexpr int64_t kWords = kPairWords<kSplit>;
  const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < k / 8; c += 2) {  // K is a multiple of the group size (16 or 32)
      const __m512 v = _mm512_permutexvar_ps(order, _mm512_loadu_ps(x + i * k + 8 * c));
      const __m256i hi = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
      uint32_t* first = xp + (c * m + i) * kWords;
      uint32_t* second = xp + ((c + 1) * m + i) * kWords;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(first), _mm256_castsi256_si128(hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(second), _mm256_extracti128_si256(hi, 1));
      if constexpr (kSplit) {
        const __m512 hi_f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
        const __m256i lo = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(v, hi_f)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(first + 4), _mm256_castsi256_si128(lo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(second + 4), _mm256_extracti128_si256(lo, 1));
      }
    }
  }
}

// Raw sums acc[i][r] for the rows r of tiles (ta, tb), as GemvTiles, from the pairs of PairActivations<kSplit>.
// Per x row and group one chain (hi) or two (hi, lo: kSplit), times kChains (split by column parity): two for
// kM ≤ 2 by default (vdpbf16ps has a 6-cycle latency), one above, where the accumulators would not fit the 32
// registers; the batch-invariant GEMV takes two for every kM ≤ 4, so that a row's sums do not depend on kM.
template <quant::BlockFormat kFormat, int kM, bool kSplit, int kChains = (kM <= 2 ? 2 : 1)>
HWY_INLINE void Bf16PairTiles(const PreparedLinear& w, int64_t ta, int64_t tb, const uint32_t* HWY_RESTRICT xp,
                              float* HWY_RESTRICT acc) {
  const DF df;
  const int64_t groups = w.groups();
  constexpr int64_t kOctetsPerGroup = quant::block_format_traits(kFormat).group_size / 8;
  (void)tb;  // ta + 1: the pair's second tile
  const auto [codes, scales] = TilePairBytes(w, ta);
  // E2M1 as bf16, twice: vpermw reads bits [4:0] of each index word, and bit 4 is the next column's low bit.
  alignas(64) static constexpr uint16_t kTable[32] = {
      0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
      0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
  const __m512i table = _mm512_load_si512(kTable);
  VF total[kM];
  for (int i = 0; i < kM; ++i) total[i] = hn::Zero(df);
  const ItemAheadPrefetch ahead(w, ta);
  for (int64_t g = 0; g < groups; ++g) {
    ahead.step(g);
    __m512 hi[kM][kChains], lo[kM][kChains];
    for (int i = 0; i < kM; ++i) {
      for (int ch = 0; ch < kChains; ++ch) hi[i][ch] = lo[i][ch] = _mm512_setzero_ps();
    }
    for (int64_t o = 0; o < kOctetsPerGroup; ++o) {
      const int64_t c = g * kOctetsPerGroup + o;
      const __m512i v = _mm512_load_si512(codes + prepare::kOctetStride * c);
      const uint32_t* xc = xp + c * kM * kPairWords<kSplit>;
      const auto pair = [&](int j, __m512i words) HWY_ATTR {
        const __m512bh w_pair = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(words, table));
        for (int i = 0; i < kM; ++i) {
          const uint32_t* xi = xc + kPairWords<kSplit> * i;
          const __m512bh x_hi = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(xi[j])));
          hi[i][j % kChains] = _mm512_dpbf16_ps(hi[i][j % kChains], w_pair, x_hi);
          if constexpr (kSplit) {
            const __m512bh x_lo = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(xi[4 + j])));
            lo[i][j % kChains] = _mm512_dpbf16_ps(lo[i][j % kChains], w_pair, x_lo);
          }
        }
      };
      pair(0, v);
      pair(1, _mm512_srli_epi16(v, 4));
      pair(2, _mm512_srli_epi16(v, 8));
      pair(3, _mm512_srli_epi16(v, 12));
    }
    const VF scale = BlockScales<kFormat>(scales + g * prepare::kScaleGroupStride, 1.f);
    for (int i = 0; i < kM; ++i) {
      __m512 sum = hi[i][0];
      if constexpr (kChains == 2) sum = _mm512_add_ps(sum, hi[i][1]);
      if constexpr (kSplit) sum = _mm512_add_ps(sum, kChains == 2 ? _mm512_add_ps(lo[i][0], lo[i][1]) : lo[i][0]);
      total[i] = hn::MulAdd(VF{sum}, scale, total[i]);
    }
  }
  for (int i = 0; i < kM; ++i) hn::StoreU(total[i], df, acc + i * kRows);
}

template <quant::BlockFormat kFormat, int kM, bool kSplit>
void Bf16PairLayer(const PreparedLinear& w, const uint32_t* xp, float* y) {
  ForEachRowItem<kM, kRows>(w, y, [&](int64_t ta, int64_t tb, float* acc) HWY_ATTR {
    Bf16PairTiles<kFormat, kM, kSplit>(w, ta, tb, xp, acc);
  });
}

// kSplit: x carried as hi + lo (ActivationPrecision::Fp32); otherwise rounded to bf16 (Bf16).
template <bool kSplit>
void Bf16PairGemv(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> pairs;
  thread_local size_t capacity = 0;
  // The pointer, not `pairs`: inside the threads that name would be their own buffers.
  uint32_t* xp = micro::Scratch(pairs, capacity, static_cast<size_t>(m * w.in_features / 8 * kPairWords<kSplit>));
  PairActivations<kSplit>(x, m, w.in_features, xp);
  quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
    ForRowCount<static_cast<int>(kMaxM)>(m, [&]<int kM>() HWY_ATTR { Bf16PairLayer<F, kM, kSplit>(w, xp, y); });
  });
}

// Rows per chunk of the batch-invariant pair GEMV: two chains per row (as m ≤ 2 runs by default) fit 4 rows' hi and
// lo accumulators in the 32 registers.
constexpr int kPairInvariantChunk = 4;

// Bf16PairGemv for any m ≥ 1 with the same arithmetic per row for every m (batch_invariant.h): chunks of
// kPairInvariantChunk rows, two chains each; x paired per chunk, so that a chunk of kM rows reads [K/8][kM] blocks.
template <bool kSplit>
void Bf16PairGemvInvariant(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  constexpr int kChunk = kPairInvariantChunk;
  const int64_t k = w.in_features;
  const int64_t chunk_words = kChunk * k / 8 * kPairWords<kSplit>;
  const int64_t chunks = (m + kChunk - 1) / kChunk;
  thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> pairs;
  thread_local size_t capacity = 0;
  uint32_t* xp = micro::Scratch(pairs, capacity, static_cast<size_t>(chunks * chunk_words));
  for (int64_t c = 0; c < chunks; ++c) {
    PairActivations<kSplit>(x + c * kChunk * k, std::min<int64_t>(kChunk, m - c * kChunk), k, xp + c * chunk_words);
  }
  quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
    ForEachRowItemChunked<kChunk, kRows>(w, m, y, [&]<int kM>(int64_t ta, int64_t tb, int64_t r0, float* acc) HWY_ATTR {
      Bf16PairTiles<F, kM, kSplit, /*kChains=*/2>(w, ta, tb, xp + r0 / kChunk * chunk_words, acc);
    });
  });
}

#pragma GCC pop_options

#else
#define FP4SERVE_BF16_DOT 0
#endif

template <quant::BlockFormat kFormat, int kM>
void GemvLayer(const PreparedLinear& w, const float* x, float* y) {
  ForEachRowItem<kM, kRows * kTilesPerCall<kM>>(w, y, [&](int64_t ta, int64_t tb, float* acc) {
    GemvTiles<kFormat, kM>(w, ta, tb, x, acc);
  });
}

template <quant::BlockFormat kFormat>
void GemvRows(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  ForRowCount<static_cast<int>(kMaxM)>(m, [&]<int kM>() { GemvLayer<kFormat, kM>(w, x, y); });
}

// ---- batch-invariant forms (batch_invariant.h): the kernels above for any m, rows in chunks inside each item ----

// The fp32 FP4 GEMV in chunks of kMaxM rows (its per-row sums do not depend on kM).
template <quant::BlockFormat kFormat>
void GemvRowsInvariant(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  const int64_t k = w.in_features;
  ForEachRowItemChunked<static_cast<int>(kMaxM), kRows>(
      w, m, y, [&]<int kM>(int64_t ta, int64_t tb, int64_t r0, float* acc) HWY_ATTR {
        GemvTiles<kFormat, kM, 1>(w, ta, tb, x + r0 * k, acc);
      });
}

// Every m ≥ 1 with one fixed arithmetic per row, for the layouts that have a fused GEMV here (false otherwise, and
// writes nothing). bf16_input: ActivationPrecision::Bf16 of an Fp4 layout (false where no bf16 dot products run).
bool GemvInvariantImpl(const PreparedLinear& w, const float* x, int64_t m, float* y, bool bf16_input) {
  if (m < 1) return false;
  switch (w.layout) {
    case WeightLayout::Fp4:
#if FP4SERVE_BF16_DOT
      if (bf16_dot_usable()) {
        if (bf16_input) {
          Bf16PairGemvInvariant<false>(w, x, m, y);
        } else {
          Bf16PairGemvInvariant<true>(w, x, m, y);
        }
        return true;
      }
#endif
      if (bf16_input) return false;
      quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR { GemvRowsInvariant<F>(w, x, m, y); });
      return true;
    case WeightLayout::Int4: return false;
    case WeightLayout::Fp8:
    case WeightLayout::Int8:
      if (bf16_input) return false;
      return dense_rows_gemv(w, x, m, y);
    case WeightLayout::Dense:
      if (bf16_input || w.dense_storage != prepare::DenseStorage::Bf16 || w.in_features % (kRows / 4) != 0) return false;
      return dense_rows_gemv(w, x, m, y);
  }
  return false;
}

int64_t GemvMaxRows() { return kMaxM; }

bool GemvBf16DotActive() {
#if FP4SERVE_BF16_DOT
  return bf16_dot_usable();
#else
  return false;
#endif
}

// ActivationPrecision::Bf16 for m ≤ kMaxM: x rounded to bf16, one vdpbf16ps per pair (false: no such path here).
bool GemvBf16Impl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
#if FP4SERVE_BF16_DOT
  if (w.layout != WeightLayout::Fp4 || m < 1 || m > kMaxM || !bf16_dot_usable()) return false;
  Bf16PairGemv<false>(w, x, m, y);
  return true;
#else
  (void)w, (void)x, (void)m, (void)y;
  return false;
#endif
}

bool GemvImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (m < 1) return false;
  switch (w.layout) {
    case WeightLayout::Fp4:
      if (m > kMaxM) return false;
#if FP4SERVE_BF16_DOT
      if (bf16_dot_usable()) {
        Bf16PairGemv<true>(w, x, m, y);
        return true;
      }
#endif
      quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR { GemvRows<F>(w, x, m, y); });
      return true;
    case WeightLayout::Int4: return false;
    case WeightLayout::Fp8:
    case WeightLayout::Int8:
      if (m > 4) return false;
      return dense_rows_gemv(w, x, m, y);
    case WeightLayout::Dense:
      if (m > 4 || w.dense_storage != prepare::DenseStorage::Bf16 || w.in_features % (kRows / 4) != 0) return false;
      return dense_rows_gemv(w, x, m, y);
  }
  return false;
}
#undef FP4SERVE_BF16_DOT

#elif HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR

// Portable fused GEMV (NEON, SVE, and any other non-x86 Highway target): the AVX2 decode in target-neutral ops
// (the int8 E2M1·2 table through TableLookupBytes, a shift pair per column) over kTileLanes rows of a tile at a
// time: 4 on NEON and 128-bit SVE, 8 on wider SVE. Accumulators are named per x row because SVE vectors cannot
// form arrays; 4 rows fill NEON's 32 registers without spills.
constexpr int64_t kMaxM = 4;
using DT = hn::CappedTag<float, kTileRows>;
using DTI = hn::RebindToSigned<DT>;
using DTU = hn::RebindToUnsigned<DT>;

// Raw sums acc[i · kTileRows + r0 + r] for rows r0 .. r0 + Lanes − 1 of `tile` (block scales applied), i < kM.
template <quant::BlockFormat kFormat, int kM>
HWY_INLINE void PortableGemvRows(const PreparedLinear& w, int64_t tile, int64_t r0, const float* HWY_RESTRICT x,
                                 float* HWY_RESTRICT acc) {
  const DT df;
  const DTI di;
  const hn::Repartition<uint8_t, DT> du8;
  const int64_t k_total = w.in_features;
  const int64_t groups = w.groups();
  const int64_t octets_per_group = w.group_size / 8;
  const uint8_t* codes = w.codes.as<uint8_t>() + prepare::code_tile_offset(k_total, tile) + 4 * r0;
  const uint8_t* scales = w.scales.as<uint8_t>() + prepare::scale_tile_offset(groups, tile) + r0;
  alignas(16) static constexpr int8_t kLut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const auto lut = hn::BitCast(du8, hn::LoadDup128(hn::Repartition<int8_t, DT>(), kLut));
  const auto mask = hn::Set(du8, uint8_t{0x0F});
  auto t0 = hn::Zero(df), t1 = hn::Zero(df), t2 = hn::Zero(df), t3 = hn::Zero(df);
  for (int64_t g = 0; g < groups; ++g) {
    auto p0 = hn::Zero(df), p1 = hn::Zero(df), p2 = hn::Zero(df), p3 = hn::Zero(df);
    for (int64_t o = 0; o < octets_per_group; ++o) {
      const int64_t c = g * octets_per_group + o;
      const float* xc = x + 8 * c;
      // Byte b of lane r holds columns 2b (low nibble) and 2b + 1 (high nibble) of row r0 + r.
      const auto v = hn::LoadU(du8, codes + prepare::kOctetStride * c);
      const auto even = hn::BitCast(di, hn::TableLookupBytes(lut, hn::And(v, mask)));
      const auto odd = hn::BitCast(di, hn::TableLookupBytes(lut, hn::And(hn::ShiftRight<4>(v), mask)));
#define FP4SERVE_GEMV_COLUMN(J)                                                                                 \
  {                                                                                                             \
    const auto col = hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<24 - 8 * ((J) / 2)>((J) % 2 == 0 ? even : odd))); \
    p0 = hn::MulAdd(col, hn::Set(df, xc[J]), p0);                                                               \
    if constexpr (kM > 1) p1 = hn::MulAdd(col, hn::Set(df, xc[k_total + (J)]), p1);                             \
    if constexpr (kM > 2) p2 = hn::MulAdd(col, hn::Set(df, xc[2 * k_total + (J)]), p2);                         \
    if constexpr (kM > 3) p3 = hn::MulAdd(col, hn::Set(df, xc[3 * k_total + (J)]), p3);                         \
  }
      FP4SERVE_GEMV_COLUMN(0)
      FP4SERVE_GEMV_COLUMN(1)
      FP4SERVE_GEMV_COLUMN(2)
      FP4SERVE_GEMV_COLUMN(3)
      FP4SERVE_GEMV_COLUMN(4)
      FP4SERVE_GEMV_COLUMN(5)
      FP4SERVE_GEMV_COLUMN(6)
      FP4SERVE_GEMV_COLUMN(7)
#undef FP4SERVE_GEMV_COLUMN
    }
    const auto scale = Fp4ScaleBytes<kFormat>(DT(), scales + g * prepare::kScaleGroupStride);
    t0 = hn::MulAdd(p0, scale, t0);
    if constexpr (kM > 1) t1 = hn::MulAdd(p1, scale, t1);
    if constexpr (kM > 2) t2 = hn::MulAdd(p2, scale, t2);
    if constexpr (kM > 3) t3 = hn::MulAdd(p3, scale, t3);
  }
  hn::StoreU(t0, df, acc + r0);
  if constexpr (kM > 1) hn::StoreU(t1, df, acc + kTileRows + r0);
  if constexpr (kM > 2) hn::StoreU(t2, df, acc + 2 * kTileRows + r0);
  if constexpr (kM > 3) hn::StoreU(t3, df, acc + 3 * kTileRows + r0);
}

template <quant::BlockFormat kFormat, int kM>
void PortableGemvLayer(const PreparedLinear& w, const float* x, float* y) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DT()));
  ForEachRowItem<kM, kTileRows>(w, y, [&](int64_t t, int64_t, float* acc) {
    for (int64_t r0 = 0; r0 < kTileRows; r0 += lanes) PortableGemvRows<kFormat, kM>(w, t, r0, x, acc);
  });
}

template <quant::BlockFormat kFormat>
void PortableGemvRowsOf(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  ForRowCount<static_cast<int>(kMaxM)>(m, [&]<int kM>() { PortableGemvLayer<kFormat, kM>(w, x, y); });
}

int64_t GemvMaxRows() { return kMaxM; }

bool GemvBf16DotActive() { return false; }

bool GemvBf16Impl(const PreparedLinear&, const float*, int64_t, float*) { return false; }

// The batch-invariant form (batch_invariant.h): FP4 in chunks of kMaxM rows inside each tile (the per-row sums do
// not depend on kM).
bool GemvInvariantImpl(const PreparedLinear& w, const float* x, int64_t m, float* y, bool bf16_input) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DT()));
  if (m < 1 || bf16_input || w.layout != WeightLayout::Fp4 || lanes < 4 || kTileRows % lanes != 0) return false;
  const int64_t k = w.in_features;
  quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
    ForEachRowItemChunked<static_cast<int>(kMaxM), kTileRows>(
        w, m, y, [&]<int kM>(int64_t t, int64_t, int64_t r0, float* acc) HWY_ATTR {
          for (int64_t sub = 0; sub < kTileRows; sub += lanes) PortableGemvRows<F, kM>(w, t, sub, x + r0 * k, acc);
        });
  });
  return true;
}

bool GemvImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  // Sub-tiles of Lanes rows must cover a tile, and the byte table needs a 16-byte vector.
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DT()));
  if (m < 1 || m > kMaxM || lanes < 4 || kTileRows % lanes != 0) return false;
  switch (w.layout) {
    case WeightLayout::Fp4:
      quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR { PortableGemvRowsOf<F>(w, x, m, y); });
      return true;
    case WeightLayout::Int4:
    case WeightLayout::Fp8:
    case WeightLayout::Int8:
    case WeightLayout::Dense: return false;
  }
  return false;
}

#else

int64_t GemvMaxRows() { return 0; }

bool GemvBf16DotActive() { return false; }

bool GemvBf16Impl(const PreparedLinear&, const float*, int64_t, float*) { return false; }

bool GemvInvariantImpl(const PreparedLinear&, const float*, int64_t, float*, bool) { return false; }

bool GemvImpl(const PreparedLinear&, const float*, int64_t, float*) { return false; }

#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels {

HWY_EXPORT(GemvImpl);
HWY_EXPORT(GemvMaxRows);
HWY_EXPORT(GemvBf16DotActive);
HWY_EXPORT(GemvBf16Impl);
HWY_EXPORT(GemvInvariantImpl);

bool gemv_invariant_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y, bool bf16_input) {
  return HWY_DYNAMIC_DISPATCH(GemvInvariantImpl)(w, x, m, y, bf16_input);
}

bool gemv_bf16_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  return HWY_DYNAMIC_DISPATCH(GemvBf16Impl)(w, x, m, y);
}

bool bf16_dot_active() { return HWY_DYNAMIC_DISPATCH(GemvBf16DotActive)(); }

int64_t gemv_max_rows() { return HWY_DYNAMIC_DISPATCH(GemvMaxRows)(); }

bool gemv_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  return HWY_DYNAMIC_DISPATCH(GemvImpl)(w, x, m, y);
}

}  // namespace fp4serve::kernels
#endif
