// SPDX-License-Identifier: Apache-2.0
// NVFP4 / MXFP4 (and int4, Int4Tiles) with ActivationPrecision::Int8: activations quantized once per call to int8
// per row and weight group, integer dot products against the E2M1 codes. Compiled once per Highway target (foreach_target.h
// re-includes this file); this file alone also builds AVX3_DL (AVX-512 VNNI, HWY_WANT_AVX3_DL in CMake).
//
// Why: the fp32 decode GEMV (gemm_gemv.cpp) spends one fp32 FMA per weight and row, plus a shift and a table
// lookup per weight column; it is bound by instructions, not by DRAM. Here one byte shuffle decodes 32 (AVX2)
// or 64 (AVX-512) weights to int8 and one vpmaddubsw (or vpdpbusd with VNNI) multiplies and pairs 32 / 64 of
// them with the activation bytes:
//   Σ_k x[k]·w[n,k] ≈ Σ_g d[g] · s[n,g]/2 · Σ_{k∈g} q[k]·(2·e2m1[n,k])
// with q = round(x/d), d = amax_g(|x|)/127, s the block scale. The byte multiplies take an unsigned operand, so
// the codes are looked up as u = 2·e2m1 + 12 ∈ [0, 24] and neg_off = −12·Σ_{k∈g} q[k] (per row and group, computed
// with q) is added to each integer group sum. vpmaddubsw sums of two products are ≤ 2·24·128 = 6144, so four of
// them add in int16 without saturation before vpmaddwd widens them to int32.
//
// Fine groups: the int8 rounding of the few groups whose amax dominates a row (RMSNorm outputs times a norm
// weight with outlier channels) carried most of the int8 path's KLD. Those groups get a 16-bit grid
// Q = round(x·32512/amax) split into two int8, hi and lo, both dotted with the same decoded weight bytes and
// combined as 256·Σu·hi + Σu·lo in int32; the other groups keep the single int8 dot. Which groups are fine is
// decided per row by quantize_int8_blocks' rule (kInt8ActivationFineRatio), which the GEMM applies as it quantizes
// each pass (QuantizeRows).
//
// Layout: the row-word layout of prepared_linear.h, unchanged. Byte b of lane r holds columns 2b (low nibble)
// and 2b + 1 (high nibble) of row r, so the low nibbles of a lane are columns 0, 2, 4, 6 of its octet and the
// high ones 1, 3, 5, 7; the quantized activations are stored per octet as [q0 q2 q4 q6 | q1 q3 q5 q7], so a
// 32-bit broadcast of either half lines up with every lane. Threads split N as in gemm_gemv.cpp; larger m runs
// in passes of kMaxM rows (x interleaved per pass, Int8Pass), each thread running blocks of passes over its share
// of N.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/gemm_int8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels/fp4_scales-inl.h"
#include "backends/cpu/kernels/gemm_int8_rules.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "fp4serve/error.h"
#include "quant/formats.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

#if HWY_TARGET != HWY_SCALAR
// Where QuantizeRows writes: row i's octet c of q and r at byte i·row_bytes + c·octet_bytes, its group g's d, neg_off
// and fine at element i·row_groups + g·group_stride; neg_off, fine and any_fine may be null. any_fine[g] |= the rows'
// fine flags of group g (the caller zeroes it). Rows one after another (quantize_int8_blocks): row_bytes K,
// octet_bytes 8, row_groups K/block, group_stride 1; one pass of kM rows interleaved (Int8Pass): 8, 8·kM, 1, kM.
struct Int8Out {
  int8_t* q;
  int8_t* r;
  float* d;
  int32_t* neg_off;
  uint8_t* fine;
  uint8_t* any_fine;
  int64_t row_bytes, octet_bytes, row_groups, group_stride;
};

// Whether QuantizeRows takes blocks of `block` columns on this target.
HWY_INLINE bool QuantizableBlock(int64_t block) {
  const auto lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  return block % 16 == 0 && block % lanes == 0 && block <= 256;
}

// quantize_int8_blocks (gemm_shared.h) in vectors, the same rule and the same integers as its scalar form, into
// `out`'s layout: a decode step quantizes every linear input, and the scalar loop (a nearbyint call per element)
// took ~30% of an int8 GEMV at K = 1536 (bench_gemm_fp4, AVX-512, M = 1); the int8 GEMM writes each pass of rows
// in its interleaved layout directly (a separate copy cost 2.8% of a 16-stream server's samples). Returns false
// where !QuantizableBlock(block) (the caller runs the scalar form).
HWY_INLINE bool QuantizeRows(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order, float fine_ratio,
                             const Int8Out& out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<int8_t, decltype(di)> d8;
  const hn::FixedTag<uint8_t, 16> d16;
  const hn::FixedTag<uint8_t, 8> d8h;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kMaxBlock = 256;
  // AVX-512: a vector is 16 columns, two octets, stored straight from registers; other targets go through a
  // buffer of a group's bytes.
  constexpr bool kSixteenLanes = !HWY_HAVE_SCALABLE && HWY_LANES(float) == 16;
  if (!QuantizableBlock(block)) return false;
  const int64_t groups = k / block;
  thread_local std::vector<float> amax_of_thread;
  amax_of_thread.resize(static_cast<size_t>(groups));
  // A local pointer: stores through the int8_t outputs may alias anything, so the vector's would be reloaded.
  float* const amax = amax_of_thread.data();
  // Octet order within each 16 bytes: [c0 c2 c4 c6 c1 c3 c5 c7] per 8 columns (gemm_int8.cpp's layout note).
  alignas(16) static constexpr uint8_t kOctetOrder[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
  const auto order = hn::Load(d16, kOctetOrder);
  // 16 bytes of columns col … col + 15: two octets, contiguous or octet_bytes apart.
  const auto store_octets = [&](hn::Vec<decltype(d16)> v, int8_t* row, int64_t col) HWY_ATTR {
    if (octet_order) v = hn::TableLookupBytes(v, order);
    auto* at = reinterpret_cast<uint8_t*>(row + col / 8 * out.octet_bytes);
    if (out.octet_bytes == 8) {
      hn::StoreU(v, d16, at);
    } else {
      hn::StoreU(hn::LowerHalf(d8h, v), d8h, at);
      hn::StoreU(hn::UpperHalf(d8h, v), d8h, at + out.octet_bytes);
    }
  };
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    int8_t* qi = out.q + i * out.row_bytes;
    int8_t* ri = out.r + i * out.row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      auto va = hn::Zero(df);
      auto nan = hn::FirstN(df, 0);
      for (int64_t j = 0; j < block; j += lanes) {
        const auto v = hn::LoadU(df, xi + g * block + j);
        va = hn::Max(va, hn::Abs(v));
        nan = hn::Or(nan, hn::IsNaN(v));
      }
      amax[g] = hn::AllFalse(df, nan) ? hn::GetLane(hn::MaxOfLanes(df, va)) : std::numeric_limits<float>::quiet_NaN();
    }
    const double fine_threshold = int8_fine_threshold(amax_of_thread, fine_ratio);
    for (int64_t g = 0; g < groups; ++g) {
      const float a = amax[g];
      const auto [degenerate, is_fine, top] = int8_group_grid(a, fine_threshold);
      alignas(64) int8_t hi_bytes[kMaxBlock], lo_bytes[kMaxBlock];
      // The demoted bytes of columns col … col + lanes − 1: on AVX-512 (16 lanes, two octets) stored from the
      // register, elsewhere into the group's buffer (`buffer`), which goes out in 16-byte steps below.
      const auto put = [&](auto bytes, int8_t* buffer, int8_t* row, int64_t col) HWY_ATTR {
        if constexpr (kSixteenLanes) {
          store_octets(hn::BitCast(d16, bytes), row, col);
        } else {
          hn::StoreU(bytes, d8, buffer + col % block);
        }
      };
      auto vsum = hn::Zero(di);
      if (!degenerate) {
        const auto inv = hn::Set(df, top / a), vtop = hn::Set(df, top), vbottom = hn::Set(df, -top);
        for (int64_t j = 0; j < block; j += lanes) {
          const int64_t col = g * block + j;
          // Round to nearest even, as nearbyint in the default rounding mode.
          const auto v = hn::NearestInt(hn::Clamp(hn::Mul(hn::LoadU(df, xi + col), inv), vbottom, vtop));
          vsum = hn::Add(vsum, v);
          // Q = 256·hi + lo with lo ∈ [−128, 127]: hi = ⌊(Q + 128) / 256⌋ (an arithmetic shift).
          const auto hi = is_fine ? hn::ShiftRight<8>(hn::Add(v, hn::Set(di, 128))) : v;
          put(hn::DemoteTo(d8, hi), hi_bytes, qi, col);
          if (is_fine) put(hn::DemoteTo(d8, hn::Sub(v, hn::ShiftLeft<8>(hi))), lo_bytes, ri, col);
        }
      }
      for (int64_t j = 0; j < block; j += 16) {
        const int64_t col = g * block + j;
        // Q = 0 in a degenerate group, lo = 0 in a coarse one.
        if (degenerate) store_octets(hn::Zero(d16), qi, col);
        if (!is_fine) store_octets(hn::Zero(d16), ri, col);
        if constexpr (!kSixteenLanes) {
          if (!degenerate) store_octets(hn::LoadU(d16, reinterpret_cast<const uint8_t*>(hi_bytes + j)), qi, col);
          if (is_fine) store_octets(hn::LoadU(d16, reinterpret_cast<const uint8_t*>(lo_bytes + j)), ri, col);
        }
      }
      const int64_t at = i * out.row_groups + g * out.group_stride;
      out.d[at] = std::isnan(a) ? a : a / top;
      if (out.neg_off != nullptr) out.neg_off[at] = -12 * static_cast<int32_t>(hn::GetLane(hn::SumOfLanes(di, vsum)));
      if (out.fine != nullptr) out.fine[at] = is_fine ? 1 : 0;
      if (out.any_fine != nullptr) out.any_fine[g] = static_cast<uint8_t>(out.any_fine[g] | (is_fine ? 1 : 0));
    }
  }
  return true;
}
#endif

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)

// Highway 1.0's AVX3_DL target string names avxvnni (the VEX form) but not avx512vnni, which vpdpbusd on zmm
// needs, while its run-time check requires AVX512-VNNI: add it for this section (GCC's target pragmas accumulate).
// Other compilers run the vpmaddubsw form there.
#if HWY_TARGET == HWY_AVX3_DL && HWY_COMPILER_GCC_ACTUAL
#define FP4SERVE_VNNI 1
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#else
#define FP4SERVE_VNNI 0
#endif

constexpr int64_t kRows = kFusedRows;
// Up to kMaxM rows of x share one pass over the weights: one int32 accumulator and one fp32 total per row.
#if HWY_TARGET == HWY_AVX2
constexpr int64_t kMaxM = 4;
#else
constexpr int64_t kMaxM = 8;
#endif
using DF = hn::FixedTag<float, kRows>;
using DI = hn::FixedTag<int32_t, kRows>;
using DU8 = hn::FixedTag<uint8_t, 4 * kRows>;
using DU32 = hn::FixedTag<uint32_t, kRows>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU8 = hn::Vec<DU8>;

// One column octet at p: the 32 bytes of a tile (AVX2), or the 64 of a tile pair (AVX-512: p at its first tile).
HWY_INLINE VU8 LoadOctet(const uint8_t* p) { return hn::Load(DU8(), p); }

// Four activation bytes broadcast to every 32-bit lane.
HWY_INLINE VU8 Broadcast4(const int8_t* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  return hn::BitCast(DU8(), hn::Set(DU32(), word));
}

// acc += Σ over the 4 bytes of each lane of u[b]·s[b] for the two (u, s) pairs, u unsigned, s signed.
HWY_INLINE VI DotAdd(VI acc, VU8 u0, VU8 s0, VU8 u1, VU8 s1, VU8 u2, VU8 s2, VU8 u3, VU8 s3) {
#if FP4SERVE_VNNI
  acc.raw = _mm512_dpbusd_epi32(acc.raw, u0.raw, s0.raw);
  acc.raw = _mm512_dpbusd_epi32(acc.raw, u1.raw, s1.raw);
  acc.raw = _mm512_dpbusd_epi32(acc.raw, u2.raw, s2.raw);
  acc.raw = _mm512_dpbusd_epi32(acc.raw, u3.raw, s3.raw);
  return acc;
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m512i p = _mm512_add_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(u0.raw, s0.raw), _mm512_maddubs_epi16(u1.raw, s1.raw)),
                                     _mm512_add_epi16(_mm512_maddubs_epi16(u2.raw, s2.raw), _mm512_maddubs_epi16(u3.raw, s3.raw)));
  return VI{_mm512_add_epi32(acc.raw, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))};
#else
  const __m256i p = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0.raw, s0.raw), _mm256_maddubs_epi16(u1.raw, s1.raw)),
                                     _mm256_add_epi16(_mm256_maddubs_epi16(u2.raw, s2.raw), _mm256_maddubs_epi16(u3.raw, s3.raw)));
  return VI{_mm256_add_epi32(acc.raw, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))};
#endif
}

// DotAdd with each s the 4 activation bytes at x0 … x3 broadcast to every lane. With VNNI the broadcast is the
// instruction's own memory operand ({1to16}): one instruction per dot product instead of a broadcast load and the dot
// product (GCC does not fold _mm512_set1_epi32 of a load into vpdpbusd).
HWY_INLINE VI DotAddBroadcast(VI acc, VU8 u0, const int8_t* x0, VU8 u1, const int8_t* x1, VU8 u2, const int8_t* x2,
                              VU8 u3, const int8_t* x3) {
#if FP4SERVE_VNNI
  // The asm reads 4 bytes of the int8 activations as one word: a may_alias word, so that the compiler keeps every
  // earlier write of those bytes before it.
  using Word = int32_t __attribute__((may_alias));
  __m512i a = acc.raw;
  asm("vpdpbusd %[x0]%{1to16%}, %[u0], %[a]\n\t"
      "vpdpbusd %[x1]%{1to16%}, %[u1], %[a]\n\t"
      "vpdpbusd %[x2]%{1to16%}, %[u2], %[a]\n\t"
      "vpdpbusd %[x3]%{1to16%}, %[u3], %[a]"
      : [a] "+v"(a)
      : [u0] "v"(u0.raw), [u1] "v"(u1.raw), [u2] "v"(u2.raw), [u3] "v"(u3.raw),
        [x0] "m"(*reinterpret_cast<const Word*>(x0)), [x1] "m"(*reinterpret_cast<const Word*>(x1)),
        [x2] "m"(*reinterpret_cast<const Word*>(x2)), [x3] "m"(*reinterpret_cast<const Word*>(x3)));
  return VI{a};
#else
  return DotAdd(acc, u0, Broadcast4(x0), u1, Broadcast4(x1), u2, Broadcast4(x2), u3, Broadcast4(x3));
#endif
}

// The kM (≤ kMaxM) rows of x one pass over the weights serves, interleaved so that everything a group needs of
// them is contiguous and one base pointer with constant offsets reaches it (eight row pointers and their strides
// did not fit in the general registers beside the kernel's).
struct Int8Pass {
  const int8_t* q;          // [K/8][kM][8]: each row's q octets (octet order), row after row
  const int8_t* r;          // [K/8][kM][8]: the same for r (lo bytes, 0 outside fine groups)
  const float* d;           // [groups][kM]
  const int32_t* neg_off;   // [groups][kM]
  const uint8_t* fine;      // [groups][kM]
  const uint8_t* any_fine;  // [groups]: 1 where some row's group is fine
  const float* xsum;        // Int4 weights: [weight groups][kM], Σ Q·d over each weight group; null otherwise
};

// A work item is a tile pair: one vector of rows on AVX-512; on AVX2 two, the pair's tiles side by side in each
// octet's 64-byte line, so the item reads each line once and each x broadcast serves both. Items of one tile read
// each line twice, the second time from L2 (bench_gemm_fp4 linear_a8 M = 1 on AVX2, one thread, bw_ratio
// 0.74–0.76 → 0.59–0.60 at 4096²), and so did a pass over a chunk of columns per tile (0.55–0.66 with 2048-column
// chunks) and tile after tile per scale group (MXFP4 0.59–0.61).
constexpr int64_t kItemTiles = prepare::kPairedTiles * prepare::kTileRows / kRows;
constexpr int64_t kItemRows = kItemTiles * kRows;

// isum[t][i] += Σ u·q over the group's octet pairs for tile t of the item and rows i < kM, and with kFine isum2[t][i]
// += Σ u·r.
template <quant::BlockFormat kFormat, int kM, bool kFine>
HWY_INLINE void GroupDots(const uint8_t* codes, int64_t g, const Int8Pass& x, VU8 lut, VU8 low4, VI (*isum)[kM],
                          VI (*isum2)[kM]) {
  constexpr int64_t kPairsPerGroup = quant::block_format_traits(kFormat).group_size / 16;  // octet pairs per group
  (void)isum2;
  for (int64_t p = 0; p < kPairsPerGroup; ++p) {
    const int64_t c = (g * kPairsPerGroup + p) * 2;
    const int8_t* xq = x.q + c * kM * 8;
    const int8_t* xr = x.r + c * kM * 8;
    (void)xr;
    for (int64_t t = 0; t < kItemTiles; ++t) {
      // The second tile of a pair (AVX2) is the upper 32 bytes of each line.
      const VU8 v0 = LoadOctet(codes + 32 * t + prepare::kOctetStride * c);
      const VU8 v1 = LoadOctet(codes + 32 * t + prepare::kOctetStride * (c + 1));
      const VU8 even0 = hn::TableLookupBytes(lut, hn::And(v0, low4));
      const VU8 odd0 = hn::TableLookupBytes(lut, hn::ShiftRight<4>(v0));
      const VU8 even1 = hn::TableLookupBytes(lut, hn::And(v1, low4));
      const VU8 odd1 = hn::TableLookupBytes(lut, hn::ShiftRight<4>(v1));
      for (int i = 0; i < kM; ++i) {
        isum[t][i] = DotAddBroadcast(isum[t][i], even0, xq + 8 * i, odd0, xq + 8 * i + 4, even1, xq + 8 * (kM + i),
                                     odd1, xq + 8 * (kM + i) + 4);
        if constexpr (kFine) {
          isum2[t][i] = DotAddBroadcast(isum2[t][i], even0, xr + 8 * i, odd0, xr + 8 * i + 4, even1, xr + 8 * (kM + i),
                                        odd1, xr + 8 * (kM + i) + 4);
        }
      }
    }
  }
}

// Raw sums acc[i][r] for the kItemRows rows r of the tile pair from tile ta and x rows i < kM (block scales applied,
// global scale not).
template <quant::BlockFormat kFormat, int kM>
HWY_INLINE void Int8Tiles(const PreparedLinear& w, int64_t ta, const Int8Pass& x, float* HWY_RESTRICT acc) {
  const DF df;
  const DI di;
  const DU8 du8;
  const int64_t groups = w.groups();
  const uint8_t* codes = w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, ta);
  const uint8_t* scales = w.scales.as<uint8_t>() + prepare::scale_tile_offset(groups, ta);
  // u = 2·e2m1 + 12: codes 0..7 = +0 … +6, 8..15 = −0 … −6.
  alignas(16) static constexpr uint8_t kLut[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
  const VU8 lut = hn::LoadDup128(du8, kLut);
  const VU8 low4 = hn::Set(du8, uint8_t{0x0F});
  VF total[kItemTiles][kM];
  for (auto& per_tile : total) {
    for (VF& v : per_tile) v = hn::Zero(df);
  }
  const ItemAheadPrefetch ahead(w, ta);
  // total += (Σ u·Q + neg_off) · d · s, where the tile's block scales s hold the table's ½.
  const auto accumulate = [&](int64_t g, VI (*exact)[kM]) HWY_ATTR {
    for (int64_t t = 0; t < kItemTiles; ++t) {
      // The second tile's bytes follow the first's.
      const VF scale = BlockScales<kFormat>(scales + kTileRows * t + g * prepare::kScaleGroupStride, 0.5f);
      for (int i = 0; i < kM; ++i) {
        // (sum · d) · s: s · d alone can fall below the fp32 normal range for tiny E8M0 scales.
        total[t][i] =
            hn::MulAdd(hn::Mul(hn::ConvertTo(df, exact[t][i]), hn::Set(df, x.d[g * kM + i])), scale, total[t][i]);
      }
    }
  };
  for (int64_t g = 0; g < groups; ++g) {
    ahead.step(g);
    VI isum[kItemTiles][kM];
    if (x.any_fine[g] == 0) {
      // Most groups are coarse in every row: one dot whose sums start at neg_off (a broadcast load instead of a
      // zeroed register and a subtraction: the epilogue shares its vector pipes with the dots), and no per-row
      // test or second accumulator (the registers of eight rows' sums and totals leave none to spare).
      for (auto& per_tile : isum) {
        for (int i = 0; i < kM; ++i) per_tile[i] = hn::Set(di, x.neg_off[g * kM + i]);
      }
      GroupDots<kFormat, kM, false>(codes, g, x, lut, low4, isum, nullptr);
      accumulate(g, isum);
      continue;
    }
    // Some row's group is fine: the second dot runs for every row (lo bytes are 0 where the group is coarse).
    VI isum2[kItemTiles][kM];
    for (int64_t t = 0; t < kItemTiles; ++t) {
      for (int i = 0; i < kM; ++i) isum[t][i] = isum2[t][i] = hn::Zero(di);
    }
    GroupDots<kFormat, kM, true>(codes, g, x, lut, low4, isum, isum2);
    for (int64_t t = 0; t < kItemTiles; ++t) {
      for (int i = 0; i < kM; ++i) {
        // Σ u·Q = 256·Σ u·hi + Σ u·lo in a fine group (|Σ u·Q| ≤ 32·24·32512 < 2^31).
        const VI uq = x.fine[g * kM + i] != 0 ? hn::Add(hn::ShiftLeft<8>(isum[t][i]), isum2[t][i]) : isum[t][i];
        isum[t][i] = hn::Add(uq, hn::Set(di, x.neg_off[g * kM + i]));
      }
    }
    accumulate(g, isum);
  }
  for (int64_t t = 0; t < kItemTiles; ++t) {
    for (int i = 0; i < kM; ++i) hn::StoreU(total[t][i], df, acc + i * kItemRows + t * kRows);
  }
}

// Int4 weights (w = nibble·s + o per row and weight group of w.group_size columns, prepared_linear.h) on the same
// dots: the nibble is the unsigned operand itself (the identity table), the activations keep blocks of
// kInt4ActivationBlock columns, so a weight group holds several activation blocks:
//   Σ_k x̂[k]·w[n,k] = Σ_g s[n,g] · Σ_{b∈g} d[b]·Σ_{k∈b} nibble·Q + o[n,g] · Σ_{b∈g} d[b]·Σ_{k∈b} Q
// The second sum is x̂'s sum over the group (Int8Pass::xsum), one FMA per weight group and row.
template <int kM>
HWY_INLINE void Int4Tiles(const PreparedLinear& w, int64_t ta, const Int8Pass& x, float* HWY_RESTRICT acc) {
  const DF df;
  const DI di;
  const DU8 du8;
  const int64_t wgroups = w.groups();
  const int64_t per_group = w.group_size / kInt4ActivationBlock;
  const uint8_t* codes = w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, ta);
  alignas(16) static constexpr uint8_t kIdentity[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const VU8 lut = hn::LoadDup128(du8, kIdentity);
  const VU8 low4 = hn::Set(du8, uint8_t{0x0F});
  // The codes of the tile pair kItemAheadBytes ahead (as ItemAheadPrefetch for FP4), where it exists.
  const int64_t pair_bytes = prepare::code_tile_offset(w.in_features, prepare::kPairedTiles);
  const int64_t ahead_pairs = std::max<int64_t>(1, (kItemAheadBytes + pair_bytes - 1) / pair_bytes);
  const bool prefetch = ta % prepare::kPairedTiles == 0 && ta / prepare::kPairedTiles + ahead_pairs < w.tiles() / prepare::kPairedTiles;
  // Scales and offsets [T][groups][8] fp32: the item's rows of one group gathered per weight group (a tile past
  // the last one, in an odd tile count, reads as zeros).
  const int64_t tiles_here = std::min<int64_t>(kItemRows / kTileRows, w.tiles() - ta);
  alignas(64) float group_scale[kItemRows] = {}, group_offset[kItemRows] = {};
  VF total[kItemTiles][kM];
  for (auto& per_tile : total) {
    for (VF& v : per_tile) v = hn::Zero(df);
  }
  for (int64_t g = 0; g < wgroups; ++g) {
    for (int64_t t = 0; t < tiles_here; ++t) {
      const int64_t at = ((ta + t) * wgroups + g) * kTileRows;
      std::memcpy(group_scale + t * kTileRows, w.scales.as<float>() + at, kTileRows * sizeof(float));
      std::memcpy(group_offset + t * kTileRows, w.offsets.as<float>() + at, kTileRows * sizeof(float));
    }
    VF scale[kItemTiles];
    for (int64_t t = 0; t < kItemTiles; ++t) scale[t] = hn::Load(df, group_scale + t * kRows);
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      if (prefetch) {
        const uint8_t* ahead = codes + ahead_pairs * pair_bytes + b * 2 * prepare::kOctetStride;
        prefetch_weights(ahead);
        prefetch_weights(ahead + 64);
      }
      VI isum[kItemTiles][kM];
      for (int64_t t = 0; t < kItemTiles; ++t) {
        for (int i = 0; i < kM; ++i) isum[t][i] = hn::Zero(di);
      }
      if (x.any_fine[b] == 0) {
        GroupDots<quant::BlockFormat::Nvfp4, kM, false>(codes, b, x, lut, low4, isum, nullptr);
      } else {
        VI isum2[kItemTiles][kM];
        for (int64_t t = 0; t < kItemTiles; ++t) {
          for (int i = 0; i < kM; ++i) isum2[t][i] = hn::Zero(di);
        }
        GroupDots<quant::BlockFormat::Nvfp4, kM, true>(codes, b, x, lut, low4, isum, isum2);
        for (int64_t t = 0; t < kItemTiles; ++t) {
          for (int i = 0; i < kM; ++i) {
            // Σ nibble·Q = 256·Σ nibble·hi + Σ nibble·lo (|Σ| ≤ 16·15·32512 < 2^31).
            if (x.fine[b * kM + i] != 0) isum[t][i] = hn::Add(hn::ShiftLeft<8>(isum[t][i]), isum2[t][i]);
          }
        }
      }
      for (int64_t t = 0; t < kItemTiles; ++t) {
        for (int i = 0; i < kM; ++i) {
          total[t][i] = hn::MulAdd(hn::Mul(hn::ConvertTo(df, isum[t][i]), hn::Set(df, x.d[b * kM + i])), scale[t], total[t][i]);
        }
      }
    }
    for (int64_t t = 0; t < kItemTiles; ++t) {
      const VF offset = hn::Load(df, group_offset + t * kRows);
      for (int i = 0; i < kM; ++i) total[t][i] = hn::MulAdd(offset, hn::Set(df, x.xsum[g * kM + i]), total[t][i]);
    }
  }
  for (int64_t t = 0; t < kItemTiles; ++t) {
    for (int i = 0; i < kM; ++i) hn::StoreU(total[t][i], df, acc + i * kItemRows + t * kRows);
  }
}

// The mm rows of x at `x` quantized as one pass's Int8Pass, its arrays in `buffer`.
struct PassBuffer {
  std::vector<int8_t> q, r;
  std::vector<float> d;
  std::vector<int32_t> neg_off;
  std::vector<uint8_t> fine, any_fine;
  std::vector<float> xsum;
};
// weight_group > 0 (Int4 weights): also the sums of x̂ over each weight_group columns (a multiple of block).
Int8Pass QuantizePass(const float* x, int64_t k, int64_t block, int64_t mm, int64_t weight_group, PassBuffer& buffer) {
  const int64_t groups = k / block;
  buffer.q.resize(static_cast<size_t>(mm * k));
  buffer.r.resize(static_cast<size_t>(mm * k));
  buffer.d.resize(static_cast<size_t>(mm * groups));
  buffer.neg_off.resize(static_cast<size_t>(mm * groups));
  buffer.fine.resize(static_cast<size_t>(mm * groups));
  buffer.any_fine.assign(static_cast<size_t>(groups), 0);
  const Int8Out pass{buffer.q.data(),    buffer.r.data(),        buffer.d.data(), buffer.neg_off.data(),
                     buffer.fine.data(), buffer.any_fine.data(), /*row_bytes=*/8, /*octet_bytes=*/8 * mm,
                     /*row_groups=*/1,   /*group_stride=*/mm};
  QuantizeRows(x, mm, k, block, /*octet_order=*/true, kInt8ActivationFineRatio, pass);
  const float* xsum = nullptr;
  if (weight_group > 0) {
    const int64_t per_group = weight_group / block;
    buffer.xsum.assign(static_cast<size_t>(mm * (k / weight_group)), 0.f);
    for (int64_t b = 0; b < groups; ++b) {
      for (int64_t i = 0; i < mm; ++i) {
        // Σ Q = −neg_off / 12 exactly (|Σ Q| ≤ block·32512 ≤ 256·32512 < 2^24).
        const float sum_q = static_cast<float>(-buffer.neg_off[static_cast<size_t>(b * mm + i)] / 12);
        buffer.xsum[static_cast<size_t>(b / per_group * mm + i)] += sum_q * buffer.d[static_cast<size_t>(b * mm + i)];
      }
    }
    xsum = buffer.xsum.data();
  }
  return {buffer.q.data(), buffer.r.data(), buffer.d.data(), buffer.neg_off.data(), buffer.fine.data(),
          buffer.any_fine.data(), xsum};
}

// Quantized bytes of x (its q bytes) per block of passes that a thread runs item by item over its share of the
// output rows, so a work item runs all of them while its weights are in L1 (x itself comes from L1 or L2). When
// each block was its own parallel loop, one pass per loop cost a fork and join per kMaxM rows (since then all blocks
// share one region); all rows in one block streamed the whole of x per item from L2 or beyond (int8
// perplexity over 512-token windows 15% slower than one pass per loop); a pass count chosen inside the item loop
// (ForRowCount per pass) compiled the kernel worse. Measured with the parallel quantization and interleaving of
// the same commit, against one pass per loop with both serial, alternating: `fp4serve perplexity …
// --activation-precision int8` (512-token windows) one thread 4.15–4.37 → 3.96–4.15 s user, two threads
// 3.32–3.62 → 2.77–2.91 s wall; `bench model -p 128 --activation-precision int8` prefill, per-round medians,
// T=1 1229 → 1328 tok/s, T=2 1593 → 2440.
constexpr int64_t kBlockXBytes = 32 * 1024;

// Passes [first, first + count) of kM rows each (rows first·kMaxM …) on the tile pair from tile ta.
template <quant::BlockFormat kFormat, bool kInt4, int kM>
HWY_INLINE void Int8Item(const PreparedLinear& w, int64_t ta, const Int8Pass* passes, int64_t first, int64_t count,
                         float* y) {
  const int64_t n_total = w.out_features;
  alignas(64) float acc[kM * kItemRows];
  const int64_t n0 = ta * kTileRows;
  const int64_t rows = std::min(kItemRows, n_total - n0);
  for (int64_t p = first; p < first + count; ++p) {
    if constexpr (kInt4) {
      Int4Tiles<kM>(w, ta, passes[p], acc);
    } else {
      Int8Tiles<kFormat, kM>(w, ta, passes[p], acc);
    }
    float* yp = y + p * kMaxM * n_total + n0;
    for (int64_t i = 0; i < kM; ++i) EpilogueRow(w, n0, rows, acc + i * kItemRows, yp + i * n_total);
  }
}

// All passes of m rows of x on one thread's share of the tile pairs, called by every thread of a team (equal
// contiguous shares, no barrier). Full passes go in blocks of block_passes per item (kBlockXBytes), the tail pass
// of m % kMaxM rows last. Each block of passes streams the thread's whole share of
// the weights: in chunks of 384 KiB of weights, each chunk running every pass while it stayed in L2, a 512-token
// prefill at hidden 4096 (weights of 29–58 MB per layer) ran 2–7% slower on Zen 4 (x streamed from L3 per chunk
// instead, and the weights' item-ahead prefetch ran past each chunk), although bench_gemm_fp4's 4096² at M = 256
// gained 1–3%.
template <quant::BlockFormat kFormat, bool kInt4>
HWY_INLINE void Int8TeamShare(const PreparedLinear& w, const Int8Pass* passes, int64_t m, int64_t block_passes,
                              float* y) {
  constexpr int64_t kTilesPerItem = kItemRows / kTileRows;
  const int64_t items = (w.tiles() + kTilesPerItem - 1) / kTilesPerItem;
  const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
  const int64_t lo = items * t / threads, hi = items * (t + 1) / threads;
  const int64_t full_passes = m / kMaxM;
  for (int64_t p = 0; p < full_passes; p += block_passes) {
    const int64_t count = std::min(block_passes, full_passes - p);
    for (int64_t it = lo; it < hi; ++it) {
      Int8Item<kFormat, kInt4, static_cast<int>(kMaxM)>(w, it * kTilesPerItem, passes, p, count, y);
    }
  }
  if (m % kMaxM != 0) {
    ForRowCount<static_cast<int>(kMaxM)>(m % kMaxM, [&]<int kM>() HWY_ATTR {
      for (int64_t it = lo; it < hi; ++it) Int8Item<kFormat, kInt4, kM>(w, it * kTilesPerItem, passes, full_passes, 1, y);
    });
  }
}

bool Int8Impl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  switch (w.layout) {
    case WeightLayout::Fp4:
    case WeightLayout::Int4: break;
    case WeightLayout::Fp8:
    case WeightLayout::Int8:
    case WeightLayout::Dense: return false;
  }
  const bool int4 = w.layout == WeightLayout::Int4;
  if (int4 && !int8_takes_int4(w)) return false;
  const int64_t block = int8_activation_block(w);
  if (!QuantizableBlock(block)) return false;
  const int64_t k = w.in_features;
  const int64_t pass_count = (m + kMaxM - 1) / kMaxM;
  // The calling thread's buffers (inside the parallel loop a thread_local name would be each thread's own).
  thread_local std::vector<PassBuffer> buffers_of_caller;
  thread_local std::vector<Int8Pass> passes_of_caller;
  std::vector<PassBuffer>& buffers = buffers_of_caller;
  std::vector<Int8Pass>& passes = passes_of_caller;
  if (static_cast<int64_t>(buffers.size()) < pass_count) buffers.resize(static_cast<size_t>(pass_count));
  passes.resize(static_cast<size_t>(pass_count));
  const auto quantize = [&](int64_t p) {
    const int64_t m0 = p * kMaxM;
    passes[static_cast<size_t>(p)] =
        QuantizePass(x + m0 * k, k, block, std::min(kMaxM, m - m0), int4 ? w.group_size : 0, buffers[static_cast<size_t>(p)]);
  };
  const Int8Pass* all = passes.data();
  const int64_t block_passes = std::max<int64_t>(1, kBlockXBytes / (kMaxM * k));
  // Up to kSerialPrepRows rows are quantized before the region; above, in it: one fork and join per call either
  // way (a decode step of 9–32 streams calls this for every FP4 linear), the passes ready for every thread after
  // the quantizing loop's barrier. The threads' shares of y's columns are disjoint, so nothing waits after them.
  const bool serial_prep = m <= kSerialPrepRows;
  if (serial_prep) {
    for (int64_t p = 0; p < pass_count; ++p) quantize(p);
  }
#pragma omp parallel
  {
    if (!serial_prep) {
#pragma omp for schedule(static)
      for (int64_t p = 0; p < pass_count; ++p) quantize(p);
    }
    if (int4) {
      Int8TeamShare<quant::BlockFormat::Nvfp4, true>(w, all, m, block_passes, y);
    } else {
      quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
        Int8TeamShare<F, false>(w, all, m, block_passes, y);
      });
    }
  }
  return true;
}

int64_t Int8OnePassRows() { return kMaxM; }

#if FP4SERVE_VNNI
#pragma GCC pop_options
#endif
#undef FP4SERVE_VNNI

#else

bool Int8Impl(const PreparedLinear&, const float*, int64_t, float*) { return false; }

int64_t Int8OnePassRows() { return 0; }

#endif

int64_t Int8TargetId() { return HWY_TARGET; }

#if HWY_TARGET != HWY_SCALAR
bool QuantizeInt8Impl(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order, float fine_ratio,
                      int8_t* q, int8_t* r, float* d, int32_t* neg_off, uint8_t* fine) {
  const Int8Out rows{q, r, d, neg_off, fine, nullptr, /*row_bytes=*/k, /*octet_bytes=*/8, /*row_groups=*/k / block, 1};
  return QuantizeRows(x, m, k, block, octet_order, fine_ratio, rows);
}
#else
bool QuantizeInt8Impl(const float*, int64_t, int64_t, int64_t, bool, float, int8_t*, int8_t*, float*, int32_t*,
                      uint8_t*) {
  return false;
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels {

HWY_EXPORT(Int8Impl);
HWY_EXPORT(Int8TargetId);
HWY_EXPORT(QuantizeInt8Impl);

void quantize_int8_blocks(const float* x, int64_t m, int64_t k, int64_t block, bool octet_order, float fine_ratio,
                          int8_t* q, int8_t* r, float* d, int32_t* neg_off, uint8_t* fine) {
  if (HWY_DYNAMIC_DISPATCH(QuantizeInt8Impl)(x, m, k, block, octet_order, fine_ratio, q, r, d, neg_off, fine)) return;
  quantize_int8_blocks_scalar(x, m, k, block, octet_order, fine_ratio, q, r, d, neg_off, fine);
}
HWY_EXPORT(Int8OnePassRows);

namespace {

struct Int8Scratch {
  std::vector<int8_t> q, r;
  std::vector<float> d;
  std::vector<int32_t> neg_off;
  std::vector<uint8_t> fine;
};

}  // namespace

void int8_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (w.layout != prepare::WeightLayout::Fp4 && !int8_takes_int4(w)) {
    throw UsageError(fmt::format("int8_gemm: {} layer [{}, {}] with group size {}: int8 activations take FP4 layers and "
                                 "Int4 layers whose K and group size are multiples of {}",
                                 prepare::format_label(w), w.out_features, w.in_features, w.group_size,
                                 kInt4ActivationBlock));
  }
  // The SIMD kernel quantizes each pass of rows of x itself, straight into its interleaved layout.
  if (HWY_DYNAMIC_DISPATCH(Int8Impl)(w, x, m, y)) return;
  // No SIMD kernel for this target (or block size): every row quantized first, then the scalar loop. The scratch
  // is reused between calls (the decode step calls this for every layer with the same few sizes).
  thread_local Int8Scratch s;
  const int64_t k = w.in_features;
  const int64_t block = int8_activation_block(w);
  const int64_t groups = k / block;
  s.q.resize(static_cast<size_t>(m * k));
  s.r.resize(static_cast<size_t>(m * k));
  s.d.resize(static_cast<size_t>(m * groups));
  s.neg_off.resize(static_cast<size_t>(m * groups));
  s.fine.resize(static_cast<size_t>(m * groups));
  // Rows are quantized independently: in parallel for a prefill chunk. The pointers are taken here: inside the
  // loop `s` would name each thread's own scratch.
  int8_t* q = s.q.data();
  int8_t* r = s.r.data();
  float* d = s.d.data();
  int32_t* neg_off = s.neg_off.data();
  uint8_t* fine = s.fine.data();
#pragma omp parallel for schedule(static) if (m > kSerialPrepRows)
  for (int64_t i = 0; i < m; ++i) {
    quantize_int8_blocks(x + i * k, 1, k, block, /*octet_order=*/true, kInt8ActivationFineRatio, q + i * k,
                         r + i * k, d + i * groups, neg_off + i * groups, fine + i * groups);
  }
  int8_scalar(w, Int8Rows{q, r, d, neg_off, fine}, m, y);
}

std::vector<int64_t> int8_targets() { return hwy::SupportedAndGeneratedTargets(); }

const char* int8_target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(Int8TargetId)()); }

int64_t int8_one_pass_rows() { return HWY_DYNAMIC_DISPATCH(Int8OnePassRows)(); }

}  // namespace fp4serve::kernels
#endif
