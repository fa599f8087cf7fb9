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
// once. On AVX-512 the bytes run two tiles per vector (ByteTiles): bench_gemm_fp4 fp8row, 2 threads, weight GB/s
// against 8 rows per 256-bit vector, two alternating rounds: 4096² M = 1 19.8 / 21.9 vs 17.2 / 18.0, M = 4
// 16.6 / 19.5 vs 12.8 / 12.9, 49152×576 M = 4 16.6 / 19.8 vs 12.1 / 13.0; the default model's 576×1536 at M = 1
// 0.92–0.95× (half as many work items). Two columns of one tile per vector against x pairs replicated 8× in memory
// read 0.46–0.59 of the bandwidth at 4096², M = 1, against one tile per vector's 0.58–0.87 (the replicated x is 4 bytes per
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

// The bytes of kRows / 8 tiles per vector: tile ta alone (AVX2), or ta and tb side by side (AVX-512: each column's
// 8 bytes of both widened together, one broadcast of x[k] for 16 rows as the FP4 GEMV does, half the instructions
// per weight; tb = ta for an odd last tile, its copy landing in rows past N). kInt8: the Int8 layout (code ·
// scale); else E4M3 (value · 2^−120, the 2^120 in the stored scale). acc gets kM rows of kRows sums.
// (kTiles is a template parameter so that the branch for the other width is discarded.)
template <bool kInt8, int kM, int64_t kTiles = kRows / kTileRows>
HWY_INLINE void ByteTiles(const PreparedLinear& w, int64_t ta, int64_t tb, const float* HWY_RESTRICT x,
                          float* HWY_RESTRICT acc) {
  constexpr bool kPair = kTiles == 2;
  static_assert(kTiles * kTileRows == kRows, "a vector holds whole tiles");
  const hn::FixedTag<float, kTiles * kTileRows> df;  // = DF, spelled through kTiles
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> db;
  const hn::FixedTag<int8_t, kTileRows> d_tile_bytes;
  const hn::FixedTag<float, kTileRows> d_tile_floats;
  const int64_t k_total = w.in_features, groups = w.groups();
  const int8_t* src_a = w.codes.as<int8_t>() + ta * k_total * kTileRows;
  const int8_t* src_b = w.codes.as<int8_t>() + tb * k_total * kTileRows;
  const float* scales = w.scales.as<float>();
  const auto keep = hn::Set(di, static_cast<int32_t>(0x87F00000u));
  const auto column = [&](int64_t k) HWY_ATTR {
    const auto a = hn::LoadU(d_tile_bytes, src_a + k * kTileRows);
    hn::Vec<decltype(db)> bytes;
    if constexpr (kPair) {
      bytes = hn::Combine(db, hn::LoadU(d_tile_bytes, src_b + k * kTileRows), a);
    } else {
      bytes = a;
    }
    const auto wide = hn::PromoteTo(di, bytes);
    if constexpr (kInt8) return hn::ConvertTo(df, wide);
    // Sign-extended byte << 20 puts the sign at bit 31 and the magnitude at bits 26..20 (value · 2^−120).
    return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(wide), keep));
  };
  // Per scale group: the raw sums, then times the group's scales (one group for tensor and row scales).
  hn::Vec<decltype(df)> total[kM];
  for (int i = 0; i < kM; ++i) total[i] = hn::Zero(df);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k_end = std::min(k_total, (g + 1) * w.group_size);
    // Two chains per row, unrolled by hand: an accumulator indexed by k & 1 would live in memory.
    hn::Vec<decltype(df)> a0[kM], a1[kM];
    for (int i = 0; i < kM; ++i) a0[i] = a1[i] = hn::Zero(df);
    int64_t k = g * w.group_size;
    for (; k + 2 <= k_end; k += 2) {
      if (k % 8 == 0) {
        prefetch_ahead(src_a + k * kTileRows);
        if constexpr (kPair) prefetch_ahead(src_b + k * kTileRows);
      }
      const auto f0 = column(k), f1 = column(k + 1);
      for (int i = 0; i < kM; ++i) {
        a0[i] = hn::MulAdd(f0, hn::Set(df, x[i * k_total + k]), a0[i]);
        a1[i] = hn::MulAdd(f1, hn::Set(df, x[i * k_total + k + 1]), a1[i]);
      }
    }
    if (k < k_end) {
      const auto f0 = column(k);
      for (int i = 0; i < kM; ++i) a0[i] = hn::MulAdd(f0, hn::Set(df, x[i * k_total + k]), a0[i]);
    }
    const auto scale_a = hn::LoadU(d_tile_floats, scales + (ta * groups + g) * kTileRows);
    hn::Vec<decltype(df)> scale;
    if constexpr (kPair) {
      scale = hn::Combine(df, hn::LoadU(d_tile_floats, scales + (tb * groups + g) * kTileRows), scale_a);
    } else {
      scale = scale_a;
    }
    for (int i = 0; i < kM; ++i) total[i] = hn::MulAdd(hn::Add(a0[i], a1[i]), scale, total[i]);
  }
  for (int i = 0; i < kM; ++i) hn::StoreU(total[i], df, acc + i * kRows);
}

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
  if (!bf16) {
    ForEachRowItemChunked<kChunk, kRows>(w, m, y, [&]<int kM>(int64_t ta, int64_t tb, int64_t r0, float* acc) HWY_ATTR {
      if (w.layout == WeightLayout::Int8) {
        ByteTiles<true, kM>(w, ta, tb, x + r0 * k, acc);
      } else {
        ByteTiles<false, kM>(w, ta, tb, x + r0 * k, acc);
      }
    });
    return true;
  }
  ForEachRowItemChunked<kChunk, kTileRows>(w, m, y, [&]<int kM>(int64_t t, int64_t, int64_t r0, float* acc) HWY_ATTR {
    Bf16Tile<kM>(w, t, xin + 4 * r0 * k, acc);
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
