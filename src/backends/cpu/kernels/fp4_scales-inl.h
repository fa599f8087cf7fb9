// SPDX-License-Identifier: Apache-2.0
// Per-target helpers shared by the fused decode kernels (gemm_gemv.cpp, gemm_int8.cpp): their parallel loop over
// output rows, the prefetch of the work items ahead, and the block-scale bytes of one group of an 8-row
// tile (AVX2) or of two tiles (AVX-512) as fp32 lanes; also the linear epilogue, which the panel GEMM
// (gemm_simd.cpp) shares. Re-included once per Highway target by foreach_target.h
// through the including file, hence the toggle guard instead of #pragma once.
#if defined(FP4SERVE_KERNELS_CPU_FP4_SCALES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP4SERVE_KERNELS_CPU_FP4_SCALES_INL_H_
#undef FP4SERVE_KERNELS_CPU_FP4_SCALES_INL_H_
#else
#define FP4SERVE_KERNELS_CPU_FP4_SCALES_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/prepare/prepared_linear.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {

/// Lanes(df) block-scale bytes of format kFormat (E4M3 for NVFP4, E8M0 for MXFP4) at `p` as fp32 · 0.5 (the
/// decode tables hold E2M1 · 2), for the target-neutral decoders (the panel GEMM, the portable GEMV).
template <quant::BlockFormat kFormat, class D>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<D> Fp4ScaleBytes(D df, const uint8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<D> du32;
  const auto b = hn::PromoteTo(du32, hn::LoadU(hn::Rebind<uint8_t, D>(), p));
  constexpr quant::ElementFormat kScale = quant::block_format_traits(kFormat).scale;
  static_assert(kScale == quant::ElementFormat::E4M3 || kScale == quant::ElementFormat::E8M0, "one-byte scale decoders");
  if constexpr (kScale == quant::ElementFormat::E4M3) {
    // (sign << 31) | (magnitude << 20) is the E4M3 value · 2^−120 as an fp32, subnormals included.
    const auto bits = hn::Or(hn::ShiftLeft<24>(hn::And(b, hn::Set(du32, 0x80u))),
                             hn::ShiftLeft<20>(hn::And(b, hn::Set(du32, 0x7Fu))));
    return hn::Mul(hn::BitCast(df, bits), hn::Set(df, 0x1p119f));
  } else {
    // 2^(b−127) is the fp32 with exponent field b, except b = 0 → 2^−127 (a subnormal: bit 22).
    const auto bits = hn::Max(hn::ShiftLeft<23>(b), hn::Set(du32, 0x00400000u));
    return hn::Mul(hn::BitCast(df, bits), hn::Set(df, 0.5f));
  }
}

/// y[j] = apply_epilogue(w, n0 + j, acc[j]) for j < count, in vectors: the same operations per element (a division
/// or multiplication by the global scale, then the bias; a multiplication and the bias may be contracted into one
/// FMA in either form, as GCC's default -ffp-contract=fast allows for C++). acc may equal y. Scalar,
/// it was 14% of an int8 prefill's linear time (a division per output; perf, `bench model -p 512 --activation-
/// precision int8`, one thread).
HWY_INLINE void EpilogueRow(const prepare::PreparedLinear& w, int64_t n0, int64_t count, const float* acc, float* y) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const float* scale = w.global_scale.empty() ? nullptr : w.global_scale.data() + n0;
  const float* bias = w.bias.empty() ? nullptr : w.bias.data() + n0;
  const bool divisor = w.convention == prepare::GlobalScaleConvention::Divisor;
  int64_t j = 0;
  for (; j + lanes <= count; j += lanes) {
    auto v = hn::LoadU(df, acc + j);
    if (scale != nullptr) v = divisor ? hn::Div(v, hn::LoadU(df, scale + j)) : hn::Mul(v, hn::LoadU(df, scale + j));
    if (bias != nullptr) v = hn::Add(v, hn::LoadU(df, bias + j));
    hn::StoreU(v, df, y + j);
  }
  for (; j < count; ++j) y[j] = apply_epilogue(w, n0 + j, acc[j]);
}

/// Calls rows.template operator()<kM>() with kM = m for 1 ≤ m ≤ kMaxM (any other m: kMaxM), so each row count
/// of a kernel (the fused GEMVs' 4 or 8 rows, the direct bf16 kernel's 16) gets its own unrolled instance.
template <int kMaxM, class Rows>
HWY_INLINE void ForRowCount(int64_t m, const Rows& rows) {
  static_assert(kMaxM >= 1, "at least one row");
  if constexpr (kMaxM > 1) {
    if (m >= 1 && m < kMaxM) return ForRowCount<kMaxM - 1>(m, rows);
  }
  return rows.template operator()<kMaxM>();
}

/// The parallel loop of the fused decode GEMVs: the output rows in work items of kItemRows (whole tiles), and
/// item(ta, tb) called for tiles ta … tb of each. Each thread takes one contiguous, equal range of items
/// (schedule(static)): its streams then continue from item to item, ItemAheadPrefetch's lines land in the thread
/// that reads them (except for a thread's first `ahead` items, which nothing prefetches, and its last, whose
/// prefetches serve the next thread: prefetching the first ones at the start of a range measured no gain at one
/// or two threads), and a 576-row layer splits 18 / 18 items where dynamic chunks of 4 split it 10 / 8.
/// `fp4serve bench model`, default model, two threads, alternating binaries: decode 188–202 tok/s with dynamic
/// chunks of 4, 210–228 static, 219–225 guided; with a busy loop on one of the two cores 90–91 dynamic, 111–113
/// static, 93–96 guided.
template <int64_t kItemRows, class Item>
HWY_INLINE void ForEachItem(const prepare::PreparedLinear& w, const Item& item) {
  constexpr int64_t kTilesPerItem = kItemRows / prepare::kTileRows;
  const int64_t items = (w.tiles() + kTilesPerItem - 1) / kTilesPerItem;
#pragma omp parallel for schedule(static)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t ta = it * kTilesPerItem;
    item(ta, std::min(ta + kTilesPerItem - 1, w.tiles() - 1));
  }
}

/// ForEachItem with the output rows: `tiles(ta, tb, acc)` fills acc [kM][kItemRows] for tiles ta … tb, and every
/// real row goes through EpilogueRow into y [kM, N]. With two tiles per item an odd last tile comes as ta = tb:
/// read twice, its second copy lands in acc rows ≥ N − 8·ta that are never written.
template <int kM, int64_t kItemRows, class Tiles>
HWY_INLINE void ForEachRowItem(const prepare::PreparedLinear& w, float* y, const Tiles& tiles) {
  const int64_t n_total = w.out_features;
  ForEachItem<kItemRows>(w, [&](int64_t ta, int64_t tb) {
    const int64_t n0 = ta * prepare::kTileRows;
    if (n0 >= n_total) return;  // the padding tile of a pair (FP4 / int4), when an item is one tile
    alignas(64) float acc[kM * kItemRows];
    tiles(ta, tb, acc);
    const int64_t rows = std::min(kItemRows, n_total - n0);
    for (int64_t i = 0; i < kM; ++i) EpilogueRow(w, n0, rows, acc + i * kItemRows, y + i * n_total + n0);
  });
}

/// Batch-invariant ForEachRowItem for any m ≥ 1 (batch_invariant.h): inside each work item the rows of x run in
/// chunks of kChunk (the last one shorter), `tiles.template operator()<kM>(ta, tb, r0, acc)` filling acc
/// [kM][kItemRows] for x rows r0 … r0 + kM − 1, so an item's weights are read from memory once and stay in L1 / L2
/// for its other chunks. A kernel whose per-row arithmetic is the same for every kM ≤ kChunk thus gives each row of
/// y the same bits whatever m is and wherever the row lies in x.
template <int kChunk, int64_t kItemRows, class Tiles>
HWY_INLINE void ForEachRowItemChunked(const prepare::PreparedLinear& w, int64_t m, float* y, const Tiles& tiles) {
  const int64_t n_total = w.out_features;
  ForEachItem<kItemRows>(w, [&](int64_t ta, int64_t tb) {
    const int64_t n0 = ta * prepare::kTileRows;
    if (n0 >= n_total) return;  // the padding tile of a pair (FP4 / int4), when an item is one tile
    const int64_t rows = std::min(kItemRows, n_total - n0);
    alignas(64) float acc[kChunk * kItemRows];
    for (int64_t r0 = 0; r0 < m; r0 += kChunk) {
      const int64_t mm = std::min<int64_t>(kChunk, m - r0);
      ForRowCount<kChunk>(mm, [&]<int kM>() HWY_ATTR { tiles.template operator()<kM>(ta, tb, r0, acc); });
      for (int64_t i = 0; i < mm; ++i) EpilogueRow(w, n0, rows, acc + i * kItemRows, y + (r0 + i) * n_total + n0);
    }
  });
}

/// The software prefetch of the fused decode kernels: while a work item reads group g of its tiles, the same group
/// of the tile pair `ahead` pairs later is prefetched (codes and block scales), with `ahead` the fewest pairs whose
/// codes span kItemAheadBytes. The tiles of a pair lie side by side (prepared_linear.h), so a pair's codes are one
/// stream and its scale bytes another; a fixed distance per stream (prefetch_ahead) either stopped short of DRAM's
/// latency · bandwidth or, at the model's K = 576, ran into the neighbouring tiles, which are read anyway.
/// Prefetching whole pairs ahead keeps one stream's worth of lines in flight whatever K is.
/// bench_gemm_fp4, cold weights, M = 1, one thread, AVX-512 (AMD EPYC, 32 MiB L3), NVFP4, per-stream 1 KiB + the
/// next item's heads → items ahead (then over two separate tiles), same run: fp32 576×1536 35.0–37.9 → 25.1–27.0 µs,
/// 4096² 632–671 → 465–471 µs; int8 576×1536 34.6–36.2 → 21.1–22.1 µs, 4096² 642–644 → 349–373 µs. kItemAheadBytes
/// 4 KiB and 16 KiB measured within the noise of 8 KiB.
/// step() is a handful of straight-line instructions: written as loops over tiles and lines, with its pointers kept
/// as integers, it cost the kernels more than its lines saved at the model's shapes (GCC kept the loop, and the
/// kernel's pointers spilled around it); straight-line (then over two separate tiles), bench_gemm_fp4 M = 1, one
/// thread, 4 alternating rounds, per-round medians old/new: NVFP4 fp32 / int8 1.27–1.31× at 576×1536, 1536×576 and
/// 4096², MXFP4 1.16–1.25×.
class ItemAheadPrefetch {
 public:
  /// The current item starts at tile first_tile of w (Fp4 layout) and lies within one tile pair. Pairs past the
  /// last are not prefetched; a pair that belongs to another thread's share is (a hint). An item on the second tile
  /// of a pair prefetches nothing: the item on the first did.
  ItemAheadPrefetch(const prepare::PreparedLinear& w, int64_t first_tile) {
    const int64_t pair_bytes = prepare::code_tile_offset(w.in_features, prepare::kPairedTiles);
    const int64_t pair_scale_bytes = prepare::scale_tile_offset(w.groups(), prepare::kPairedTiles);
    group_code_bytes_ = w.group_size / 8 * prepare::kOctetStride;
    const int64_t ahead = std::max<int64_t>(1, (kItemAheadBytes + pair_bytes - 1) / pair_bytes);
    const int64_t target = first_tile / prepare::kPairedTiles + ahead;
    // Only formed for a pair that exists: past the last the address would leave the arrays.
    if (first_tile % prepare::kPairedTiles == 0 && target < w.tiles() / prepare::kPairedTiles) {
      codes_ = w.codes.as<uint8_t>() + target * pair_bytes;
      scales_ = w.scales.as<uint8_t>() + target * pair_scale_bytes;
    }
  }

  /// Issues the prefetches that go with the current item's group g: its code lines in the pair ahead (a group of 16
  /// rows: NVFP4 128 bytes, MXFP4 256) and, every fourth group, the line of scale bytes.
  HWY_INLINE void step(int64_t g) const {
    if (codes_ == nullptr) return;
    const uint8_t* codes = codes_ + g * group_code_bytes_;
    prefetch_weights(codes);
    prefetch_weights(codes + 64);
    if (group_code_bytes_ > 128) {
      prefetch_weights(codes + 128);
      prefetch_weights(codes + 192);
    }
    if ((g * prepare::kScaleGroupStride) % 64 == 0) prefetch_weights(scales_ + g * prepare::kScaleGroupStride);
  }

 private:
  const uint8_t* codes_ = nullptr;
  const uint8_t* scales_ = nullptr;
  int64_t group_code_bytes_ = 0;
};

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)

/// Output rows one fp32 vector covers in the fused kernels: one tile (AVX2) or two (AVX-512).
#if HWY_TARGET == HWY_AVX2
inline constexpr int64_t kFusedRows = 8;
#else
inline constexpr int64_t kFusedRows = 16;
#endif

/// Block scales (format kFormat) of one group of kFusedRows rows as fp32, times `unit`: the 8 bytes of a tile at
/// `p` (AVX2), or the 16 of a tile pair (AVX-512: p at the pair's first tile, the second's follow).
template <quant::BlockFormat kFormat>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<hwy::HWY_NAMESPACE::FixedTag<float, kFusedRows>> BlockScales(const uint8_t* p, float unit) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::FixedTag<float, kFusedRows> df;
  const hn::FixedTag<int32_t, kFusedRows> di;
  static_assert(kFusedRows == prepare::kTileRows || kFusedRows == prepare::kTileRows * prepare::kPairedTiles,
                "a tile or a tile pair");
  const auto bytes = hn::BitCast(di, hn::PromoteTo(hn::FixedTag<uint32_t, kFusedRows>(), hn::LoadU(hn::FixedTag<uint8_t, kFusedRows>(), p)));
  constexpr quant::ElementFormat kScale = quant::block_format_traits(kFormat).scale;
  static_assert(kScale == quant::ElementFormat::E4M3 || kScale == quant::ElementFormat::E8M0, "one-byte scale decoders");
  if constexpr (kScale == quant::ElementFormat::E4M3) {
    // Byte at the top, arithmetic shift by 4, clear bits 30..27: (sign << 31) | (magnitude << 20), which is
    // the E4M3 value · 2^−120 as an fp32, subnormals included.
    const auto bits = hn::And(hn::ShiftRight<4>(hn::ShiftLeft<24>(bytes)), hn::Set(di, static_cast<int32_t>(0x87FFFFFFu)));
    return hn::Mul(hn::BitCast(df, bits), hn::Set(df, 0x1p120f * unit));
  } else {
    // 2^(b−127) is the fp32 with exponent field b, except b = 0 → 2^−127 (a subnormal: bit 22).
    const hn::FixedTag<uint32_t, kFusedRows> du32;
    const auto bits = hn::Max(hn::ShiftLeft<23>(hn::BitCast(du32, bytes)), hn::Set(du32, 0x00400000u));
    return hn::Mul(hn::BitCast(df, bits), hn::Set(df, unit));
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
/// The 64 bytes of one column octet (8 columns) of a tile pair → use(j, column j as fp32 E2M1 values, rows of the
/// first tile in lanes 0–7 and of the second in lanes 8–15) for j = 0 … 7: one vpermps per column, the 16 E2M1 values
/// being the whole table, which reads only bits [3:0] of each index lane (so `word >> 4j` needs no mask). Shared by
/// the fused GEMV and the panel GEMM's decoder.
template <class Use>
HWY_INLINE void DecodeOctet(const uint8_t* p, Use&& use) {
  using VF = hwy::HWY_NAMESPACE::Vec<hwy::HWY_NAMESPACE::FixedTag<float, kFusedRows>>;
  const __m512 table = _mm512_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,  //
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
  const __m512i v = _mm512_load_si512(p);
  use(0, VF{_mm512_permutexvar_ps(v, table)});
  use(1, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table)});
  use(2, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), table)});
  use(3, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), table)});
  use(4, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 16), table)});
  use(5, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 20), table)});
  use(6, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 24), table)});
  use(7, VF{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 28), table)});
}
#endif

#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#endif  // FP4SERVE_KERNELS_CPU_FP4_SCALES_INL_H_
