// SPDX-License-Identifier: Apache-2.0
// The SIMD GEMM over prepared weights, compiled once per Highway target (foreach_target.h re-includes this
// file). NVFP4/MXFP4 with m ≤ gemv_max_rows() (4 on AVX2, 8 on AVX-512) go to the fused GEMV (gemm_gemv.cpp) first. Structure: weights are
// decoded tile by tile into an fp32 row panel [kc][kNR] (block scales applied,
// the global scale left for the epilogue), which a register-blocked micro-kernel multiplies with up to kMR
// rows of x. The code is target-neutral Highway except one AVX-512 FP4 decoder of tile pairs (guarded, with
// the portable decoder beside it): the prepared layout's 8-row tiles are decoded kTileLanes rows at a time (8 on
// AVX2 and AVX-512, 4 on NEON and SVE), and the panel width follows the target's vectors. EMU128 runs the
// scalar reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/gemm_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/fp4_scales-inl.h"
#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "quant/formats.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using prepare::kTileRows;
using prepare::PreparedLinear;
using prepare::WeightLayout;

int64_t TargetId() { return HWY_TARGET; }

#if !FP4SERVE_PANEL_TARGET

void GemmImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) { reference_gemm(w, x, m, y); }

bool Bf16GemmImpl(const PreparedLinear&, const float*, int64_t, float*) { return false; }

int64_t DecodeBf16PanelImpl(const PreparedLinear&, int64_t, int64_t, int64_t, uint32_t*) { return 0; }

#else

using micro::DF;
using micro::kLanes;
using micro::kMR;
using micro::kNR;
using micro::MicroDispatch;
using micro::Scratch;
constexpr int64_t kPanelTiles = kNR / kTileRows;
constexpr int64_t kKc = 256;                     // columns decoded per panel chunk (panel ≤ 32 KiB, in L1)
static_assert(kNR % kTileRows == 0, "a panel holds whole tiles");

// ---- decoders: tile `tile`, columns [k0, k0 + kc) → panel[kk · kNR + r] (panel already offset to the tile) --

// The decoders handle kTileLanes rows of a tile per vector, kTileRows / kTileLanes sub-tiles one after another.
constexpr int64_t kTileLanes = kLanes < kTileRows ? kLanes : kTileRows;
using DT = hn::CappedTag<float, kTileLanes>;
using DTI = hn::RebindToSigned<DT>;
using DTU = hn::RebindToUnsigned<DT>;
static_assert(kTileRows % kTileLanes == 0, "sub-tiles cover a tile");

// Column j (0..7) of kTileLanes rows in a row-word block (prepared_linear.h), as int32 lanes.
// Int4: the unsigned nibble. FP4: E2M1 · 2 from the int8 table, where `even`/`odd` hold the table value of the
// low/high nibble of every byte (byte b of lane r = columns 2b, 2b + 1 of row r); a shift pair sign-extends it.
template <int kJ>
HWY_INLINE hn::Vec<DTI> Int4Column(hn::Vec<DTU> words) {
  const auto nibble = hn::And(hn::ShiftRight<4 * kJ>(words), hn::Set(DTU(), 0xFu));
  return hn::BitCast(DTI(), nibble);
}

template <int kJ>
HWY_INLINE hn::Vec<DTI> Fp4Column(hn::Vec<DTI> even, hn::Vec<DTI> odd) {
  const auto bytes = kJ % 2 == 0 ? even : odd;
  return hn::ShiftRight<24>(hn::ShiftLeft<24 - 8 * (kJ / 2)>(bytes));
}

// Int4 or Fp4 codes; kFormat is the block format of an Fp4 layout (ignored for Int4).
template <WeightLayout kLayout, quant::BlockFormat kFormat>
void DecodeNibbleRows(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, int64_t r0, float* panel) {
  const hn::Repartition<uint8_t, DT> du8;
  const DT df;
  const int64_t groups = w.groups();
  // Rows r0 .. r0 + kTileLanes − 1 of each octet block: 4 bytes (one word) per row.
  const uint8_t* codes =
      w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, tile) + (k0 / 8) * prepare::kOctetStride + 4 * r0;
  alignas(16) static constexpr int8_t kLut[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const auto lut = hn::BitCast(du8, hn::LoadDup128(hn::Repartition<int8_t, DT>(), kLut));
  const auto mask = hn::Set(du8, uint8_t{0x0F});
  int64_t group = -1;
  hn::Vec<DT> scale = hn::Zero(df), offset = hn::Zero(df);
  for (int64_t c = 0; c < kc / 8; ++c) {
    const int64_t k = k0 + 8 * c;
    if (k / w.group_size != group) {
      group = k / w.group_size;
      if constexpr (kLayout == WeightLayout::Int4) {  // fp32 scales and offsets: [T][groups][8]
        const int64_t at = (tile * groups + group) * kTileRows + r0;
        scale = hn::Load(df, w.scales.as<float>() + at);
        offset = hn::Load(df, w.offsets.as<float>() + at);
      } else {
        scale = Fp4ScaleBytes<kFormat>(
            DT(), w.scales.as<uint8_t>() + prepare::scale_tile_offset(groups, tile) + group * prepare::kScaleGroupStride + r0);
      }
    }
    const auto v = hn::LoadU(du8, codes + prepare::kOctetStride * c);
    float* out = panel + 8 * c * kNR + r0;
    const auto emit = [&](int j, hn::Vec<DTI> q) HWY_ATTR {
      const auto f = hn::ConvertTo(df, q);
      hn::Store(kLayout == WeightLayout::Int4 ? hn::MulAdd(f, scale, offset) : hn::Mul(f, scale), df, out + j * kNR);
    };
    if constexpr (kLayout == WeightLayout::Int4) {
      const auto words = hn::BitCast(DTU(), v);
      emit(0, Int4Column<0>(words));
      emit(1, Int4Column<1>(words));
      emit(2, Int4Column<2>(words));
      emit(3, Int4Column<3>(words));
      emit(4, Int4Column<4>(words));
      emit(5, Int4Column<5>(words));
      emit(6, Int4Column<6>(words));
      emit(7, Int4Column<7>(words));
    } else {
      const auto even = hn::BitCast(DTI(), hn::TableLookupBytes(lut, hn::And(v, mask)));
      const auto odd = hn::BitCast(DTI(), hn::TableLookupBytes(lut, hn::And(hn::ShiftRight<4>(v), mask)));
      emit(0, Fp4Column<0>(even, odd));
      emit(1, Fp4Column<1>(even, odd));
      emit(2, Fp4Column<2>(even, odd));
      emit(3, Fp4Column<3>(even, odd));
      emit(4, Fp4Column<4>(even, odd));
      emit(5, Fp4Column<5>(even, odd));
      emit(6, Fp4Column<6>(even, odd));
      emit(7, Fp4Column<7>(even, odd));
    }
  }
}

// All rows of the tile, kTileLanes at a time (one pass on AVX2 and AVX-512).
template <WeightLayout kLayout, quant::BlockFormat kFormat = quant::BlockFormat::Nvfp4>
void DecodeNibbles(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, float* panel) {
  for (int64_t r0 = 0; r0 < kTileRows; r0 += kTileLanes) DecodeNibbleRows<kLayout, kFormat>(w, tile, k0, kc, r0, panel);
}

void DecodeFp8(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, float* panel) {
  const DT df;
  const DTI di32;
  const int64_t groups = w.groups();
  const uint8_t* codes = w.codes.as<uint8_t>() + (tile * w.in_features + k0) * kTileRows;
  const auto keep = hn::Set(di32, static_cast<int32_t>(0x87F00000u));
  for (int64_t r0 = 0; r0 < kTileRows; r0 += kTileLanes) {
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t k = k0 + kk;
      const auto scale = hn::Load(df, w.scales.as<float>() + (tile * groups + k / w.group_size) * kTileRows + r0);
      // Sign-extended byte << 20 puts the sign at bit 31 and the magnitude at bits 26..20 (value · 2^−120).
      const auto b = hn::PromoteTo(di32, hn::LoadU(hn::Rebind<int8_t, DT>(), reinterpret_cast<const int8_t*>(codes + kk * kTileRows + r0)));
      const auto f = hn::BitCast(df, hn::And(hn::ShiftLeft<20>(b), keep));
      hn::Store(hn::Mul(f, scale), df, panel + kk * kNR + r0);
    }
  }
}

void DecodeInt8(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, float* panel) {
  const DT df;
  const DTI di32;
  const int8_t* codes = w.codes.as<int8_t>() + (tile * w.in_features + k0) * kTileRows;
  for (int64_t r0 = 0; r0 < kTileRows; r0 += kTileLanes) {
    const auto scale = hn::Load(df, w.scales.as<float>() + tile * kTileRows + r0);  // one group: group_size = K
    for (int64_t kk = 0; kk < kc; ++kk) {
      const auto b = hn::PromoteTo(di32, hn::LoadU(hn::Rebind<int8_t, DT>(), codes + kk * kTileRows + r0));
      hn::Store(hn::Mul(hn::ConvertTo(df, b), scale), df, panel + kk * kNR + r0);
    }
  }
}

void DecodeDense(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, float* panel) {
  const DT df;
  for (int64_t r0 = 0; r0 < kTileRows; r0 += kTileLanes) {
    if (w.dense_storage == prepare::DenseStorage::Bf16) {
      const DTU du32;
      const uint16_t* src = w.codes.as<uint16_t>() + (tile * w.in_features + k0) * kTileRows + r0;
      for (int64_t kk = 0; kk < kc; ++kk) {
        const auto b = hn::PromoteTo(du32, hn::Load(hn::Rebind<uint16_t, DT>(), src + kk * kTileRows));
        hn::Store(hn::BitCast(df, hn::ShiftLeft<16>(b)), df, panel + kk * kNR + r0);
      }
    } else {
      const float* src = w.codes.as<float>() + (tile * w.in_features + k0) * kTileRows + r0;
      for (int64_t kk = 0; kk < kc; ++kk) hn::Store(hn::Load(df, src + kk * kTileRows), df, panel + kk * kNR + r0);
    }
  }
}

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
// The FP4 tile pair `tile`, `tile + 1` at once (they sit side by side in the panel: 16 consecutive floats per
// column), with the fused GEMV's DecodeOctet: a column of both costs one shift, one 512-bit vpermps, the scale
// multiplication and one store. DecodeNibbleRows gives the same values: e2m1 · s is exact either way (2 and 4
// significant bits). Against a 256-bit vpermt2ps per tile (the previous AVX-512 decoder): perf of `fp4serve bench
// model -p 128`, default model, one thread, the FP4 decoder 13% of the prefill's GEMM time beside the micro-kernel,
// 9% after; bench_gemm_fp4 NVFP4/MXFP4 M = 16 and 64, alternating, per-round medians 1.02–1.18×; model prefill
// moved within its noise (1.00–1.02×).
// use(c, j, column) for the octets c < kc/8 of columns from k0 and j = 0 … 7: column 8c + j of the tile pair that
// starts at `tile` (even: lanes 0–7 its first tile, 8–15 its second), E2M1 · block scale (exact in fp32).
template <quant::BlockFormat kFormat, class Use>
HWY_INLINE void ForEachScaledColumn(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, Use&& use) {
  const uint8_t* codes = w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, tile) + (k0 / 8) * prepare::kOctetStride;
  const uint8_t* scales = w.scales.as<uint8_t>() + prepare::scale_tile_offset(w.groups(), tile);
  int64_t group = -1;
  hn::Vec<DF> scale = hn::Zero(DF());
  for (int64_t c = 0; c < kc / 8; ++c) {
    const int64_t k = k0 + 8 * c;
    if (k / w.group_size != group) {
      group = k / w.group_size;
      scale = BlockScales<kFormat>(scales + group * prepare::kScaleGroupStride, 1.f);
    }
    prefetch_ahead(codes + prepare::kOctetStride * c);  // the tile pair's codes, one stream along K
    DecodeOctet(codes + prepare::kOctetStride * c, [&](int j, hn::Vec<DF> column) HWY_ATTR { use(c, j, hn::Mul(column, scale)); });
  }
}

template <quant::BlockFormat kFormat>
void DecodeFp4TilePair(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, float* panel) {
  ForEachScaledColumn<kFormat>(w, tile, k0, kc, [&](int64_t c, int j, hn::Vec<DF> column) HWY_ATTR {
    hn::Store(column, DF(), panel + (8 * c + j) * kNR);
  });
}
#endif

// Decodes columns [k0, k0 + kc) of panel p (kPanelTiles tiles) into panel; tiles past the end become zeros.
void DecodePanel(const PreparedLinear& w, int64_t p, int64_t k0, int64_t kc, float* panel) {
  for (int64_t s = 0; s < kPanelTiles; ++s) {
    const int64_t tile = p * kPanelTiles + s;
    float* out = panel + s * kTileRows;
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
    if (w.layout == WeightLayout::Fp4 && s % 2 == 0 && tile < w.tiles()) {  // a pair: Fp4 holds an even count
      quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
        DecodeFp4TilePair<F>(w, tile, k0, kc, out);
      });
      ++s;
      continue;
    }
#endif
    if (tile >= w.tiles()) {
      for (int64_t kk = 0; kk < kc; ++kk) std::memset(out + kk * kNR, 0, kTileRows * sizeof(float));
      continue;
    }
    switch (w.layout) {
      case WeightLayout::Fp4:
        quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
          DecodeNibbles<WeightLayout::Fp4, F>(w, tile, k0, kc, out);
        });
        break;
      case WeightLayout::Int4: DecodeNibbles<WeightLayout::Int4>(w, tile, k0, kc, out); break;
      case WeightLayout::Fp8: DecodeFp8(w, tile, k0, kc, out); break;
      case WeightLayout::Int8: DecodeInt8(w, tile, k0, kc, out); break;
      case WeightLayout::Dense: DecodeDense(w, tile, k0, kc, out); break;
    }
  }
}

// ---- driver -------------------------------------------------------------------------------------------------

// The GEMM loops around a panel decoder and a micro-kernel, shared by the fp32 panel (GemmImpl) and the bf16-pair
// one (Bf16GemmImpl). ops.decode(p, k0, kc, panel) fills the thread's panel scratch (kKc · kNR floats of room)
// with columns [k0, k0 + kc) of panel p; ops.micro(mm, m0, k0, kc, panel, c, ldc, load_c) adds rows
// [m0, m0 + mm) of x times that panel into c [mm][ldc] (or stores them when !load_c).
template <class Ops>
void PanelGemm(const PreparedLinear& w, int64_t m, float* y, const Ops& ops) {
  const int64_t k_total = w.in_features;
  const int64_t n_total = w.out_features;
  // Panels that hold output rows: FP4 / int4 pad N to whole tile pairs, so on a target whose panel is one tile
  // (NEON: kNR = 8) the last tile can lie wholly past N.
  const int64_t panels = (n_total + kNR - 1) / kNR;
  const int64_t k_blocks = (k_total + kKc - 1) / kKc;
  const bool streaming = m <= kMR;
  // Large m: up to 8 panels per work item, but at least two items per thread for balance.
  const int64_t threads = omp_get_max_threads();
  const int64_t group_panels = std::max<int64_t>(1, std::min<int64_t>(8, panels / (2 * threads)));
  const int64_t panel_groups = (panels + group_panels - 1) / group_panels;
  // Large m accumulates raw sums in y across k blocks; the epilogue runs once at the end.
#pragma omp parallel
  {
    static thread_local hwy::AlignedFreeUniquePtr<float[]> panel_buf, acc_buf;
    static thread_local size_t panel_cap = 0, acc_cap = 0;
    float* panel = Scratch(panel_buf, panel_cap, kKc * kNR);
    float* acc = Scratch(acc_buf, acc_cap, kMR * kNR);
    if (streaming) {
      // Each chunk of decoded weights is used by all m rows while it is in L1; acc stays across chunks.
#pragma omp for schedule(dynamic, 2)
      for (int64_t p = 0; p < panels; ++p) {
        std::memset(acc, 0, sizeof(float) * kMR * kNR);
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          const int64_t k0 = kb * kKc, kc = std::min(kKc, k_total - k0);
          ops.decode(p, k0, kc, panel);
          ops.micro(static_cast<int>(m), 0, k0, kc, panel, acc, kNR, /*load_c=*/true);
        }
        const int64_t cols = std::min(kNR, n_total - p * kNR);
        for (int64_t i = 0; i < m; ++i) EpilogueRow(w, p * kNR, cols, acc + i * kNR, y + i * n_total + p * kNR);
      }
    } else {
      // GotoBLAS order inside a group of panels owned by one thread: for each k block every panel of the group
      // is decoded once and swept over all m rows, whose x block (m × kKc) stays in L2 across the group;
      // partial sums live in y. Groups (not single k blocks) are the unit of work, so there is no barrier
      // per k block, which matters when the cores are shared with other processes.
#pragma omp for schedule(dynamic, 1)
      for (int64_t g = 0; g < panel_groups; ++g) {
        const int64_t p_end = std::min(panels, (g + 1) * group_panels);
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          const int64_t k0 = kb * kKc, kc = std::min(kKc, k_total - k0);
          for (int64_t p = g * group_panels; p < p_end; ++p) {
            ops.decode(p, k0, kc, panel);
            const int64_t cols = std::min(kNR, n_total - p * kNR);
            for (int64_t m0 = 0; m0 < m; m0 += kMR) {
              const int64_t mm = std::min(kMR, m - m0);
              if (cols == kNR) {
                // A full panel accumulates in y itself (the last block then applies the epilogue in place).
                float* c = y + m0 * n_total + p * kNR;
                ops.micro(static_cast<int>(mm), m0, k0, kc, panel, c, n_total, kb > 0);
                if (kb + 1 == k_blocks) {
                  for (int64_t i = 0; i < mm; ++i) EpilogueRow(w, p * kNR, kNR, c + i * n_total, c + i * n_total);
                }
                continue;
              }
              // The last, partial panel: its rows past N have no room in y, so the sums go through acc.
              for (int64_t i = 0; i < mm; ++i) {
                float* yi = y + (m0 + i) * n_total + p * kNR;
                if (kb == 0) {
                  std::memset(acc + i * kNR, 0, sizeof(float) * kNR);
                } else {
                  std::memcpy(acc + i * kNR, yi, sizeof(float) * static_cast<size_t>(cols));
                }
              }
              ops.micro(static_cast<int>(mm), m0, k0, kc, panel, acc, kNR, /*load_c=*/true);
              for (int64_t i = 0; i < mm; ++i) {
                float* yi = y + (m0 + i) * n_total + p * kNR;
                if (kb + 1 < k_blocks) {
                  std::memcpy(yi, acc + i * kNR, sizeof(float) * static_cast<size_t>(cols));
                } else {
                  EpilogueRow(w, p * kNR, cols, acc + i * kNR, yi);
                }
              }
            }
          }
        }
      }
    }
  }
}

struct Fp32PanelOps {
  const PreparedLinear& w;
  const float* x;
  void decode(int64_t p, int64_t k0, int64_t kc, float* panel) const { DecodePanel(w, p, k0, kc, panel); }
  void micro(int mm, int64_t m0, int64_t k0, int64_t kc, const float* panel, float* c, int64_t ldc, bool load_c) const {
    MicroDispatch(mm, x + m0 * w.in_features + k0, w.in_features, panel, kNR, kc, c, ldc, load_c);
  }
};

void GemmImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  // The panel assumes kLanes lanes per vector; SVE lengths (≥ 128 bits) always hold them.
  if (hn::Lanes(DF()) != static_cast<size_t>(kLanes)) return reference_gemm(w, x, m, y);
  PanelGemm(w, m, y, Fp32PanelOps{w, x});
}

#if FP4SERVE_BF16_MICRO_TARGET
// ---- ActivationPrecision::Bf16 with AVX512-BF16: the panel holds bf16 pairs, the micro-kernel runs vdpbf16ps ---
// Highway 1.0 has no AVX512-BF16 target: this section adds the instructions (as gemm_gemv.cpp's pair GEMV does),
// and Bf16GemmImpl runs only where bf16_dot_usable(). A panel row is a pair of columns k, k + 1 of the 32 output
// rows: lane r of a 32-bit word holds W[r, k] in its low half and W[r, k + 1] in its high one, and x arrives as the
// same pairs, so one vdpbf16ps does what two FMAs do in the fp32 micro-kernel. Decoded FP4 and bf16 Dense weights
// are the fp32 panel's values exactly (E2M1 · E4M3 needs 6 significant bits, E2M1 · 2^e 2; bf16 has 8, and the same
// exponent range, so ±inf and NaN carry over too), except that vdpbf16ps reads a subnormal as 0: MXFP4 blocks with
// E8M0 bytes 0 and 1, whose weights are below 2^−125 (≈ 2.4e-38), count as zero. FP8 and Int8 weights are
// code · scale rounded to bf16 (DecodeRowScaledTileBf16), Int4 ones (q − z)·s (DecodeInt4TileBf16).

// Columns [k0, k0 + kc) of the FP4 tile pair that starts at `tile` as bf16 pairs: panel[(kk/2) · kNR + r] for kk
// even, panel already offset to the tile pair. No bf16 instruction here.
template <quant::BlockFormat kFormat>
void DecodeFp4TilePairBf16(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, uint32_t* panel) {
  __m512i even{};
  ForEachScaledColumn<kFormat>(w, tile, k0, kc, [&](int64_t c, int j, hn::Vec<DF> column) HWY_ATTR {
    // Exact in bf16, so the top half of the fp32 bits is the bf16.
    const __m512i bits = _mm512_castps_si512(column.raw);
    if (j % 2 == 0) {
      even = _mm512_srli_epi32(bits, 16);
      return;
    }
    const __m512i pair = _mm512_or_si512(even, _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
    _mm512_storeu_si512(panel + (4 * c + j / 2) * kNR, pair);
  });
}

// Columns [k0, k0 + kc) of the bf16 Dense tile `tile` as pairs, panel already offset to the tile: the stored
// [K][8] columns kk and kk + 1 interleaved (vpunpcklwd / vpunpckhwd), a copy with no rounding (the weights are
// bf16 already). kc even.
void DecodeDenseTileBf16(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, uint32_t* panel) {
  const uint16_t* src = w.codes.as<uint16_t>() + (tile * w.in_features + k0) * kTileRows;
  for (int64_t kk = 0; kk < kc; kk += 2) {
    if (kk % 4 == 0) prefetch_ahead(src + kk * kTileRows);  // one 64-byte line per 4 columns of the tile
    const __m128i even = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kk * kTileRows));
    const __m128i odd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (kk + 1) * kTileRows));
    uint32_t* out = panel + (kk / 2) * kNR;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(even, odd));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpackhi_epi16(even, odd));
  }
}

#pragma GCC push_options
#pragma GCC target("avx512bf16")
// From here on AVX512-BF16 instructions: everything below runs only where bf16_dot_usable() (Bf16GemmImpl checks
// it, and so does amx_bf16_gemm before it asks DecodeBf16PanelImpl for panels).

// Columns [k0, k0 + kc) of the FP8 or Int8 tile `tile` as bf16 pairs, panel already offset to the tile: each
// weight code · scale (the stored scale, one per row and group; FP8's holds s·2^120, see DecodeFp8) rounded to the
// nearest even bf16 (vcvtne2ps2bf16). That is the bf16 weight compressed-tensors and ModelOpt dequantize FP8 to
// (e4m3 · s in the scale's bf16), bit for bit where the checkpoint's scale is bf16: the fp32 product of 4 and 8
// significant bits is exact. kc even; a column pair never straddles a scale group (HasBf16Panel: even groups).
// The bytes of a column pair are interleaved before they are widened, so each 16-lane vector is already in pair
// order (row r's column k in lane 2r, column k + 1 in lane 2r + 1) and one conversion packs two pairs of columns.
template <WeightLayout kLayout>
void DecodeRowScaledTileBf16(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, uint32_t* panel) {
  static_assert(kLayout == WeightLayout::Fp8 || kLayout == WeightLayout::Int8);
  const int8_t* codes = w.codes.as<int8_t>() + (tile * w.in_features + k0) * kTileRows;
  const float* scales = w.scales.as<float>() + tile * w.groups() * kTileRows;
  const __m512i e4m3_keep = _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u));
  const __m512i each_twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  // The group of column k0 and where the next one starts (no division per pair).
  int64_t group = k0 / w.group_size, next_group_at = (group + 1) * w.group_size;
  __m512 scale = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(scales + group * kTileRows)));
  // Columns kk, kk + 1 (16 bytes: column kk's 8 rows, then column kk + 1's) as 16 fp32 in pair order, scaled.
  const auto pair_values = [&](int64_t kk) HWY_ATTR {
    if (k0 + kk == next_group_at) {
      ++group;
      next_group_at += w.group_size;
      scale = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(scales + group * kTileRows)));
    }
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kk * kTileRows));
    const __m512i wide = _mm512_cvtepi8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_si128(bytes, 8)));
    __m512 value;
    if constexpr (kLayout == WeightLayout::Fp8) {
      // Sign-extended byte << 20: the sign at bit 31, the magnitude at bits 26..20 (value · 2^−120).
      value = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(wide, 20), e4m3_keep));
    } else {
      value = _mm512_cvtepi32_ps(wide);
    }
    return _mm512_mul_ps(value, scale);
  };
  int64_t kk = 0;
  for (; kk + 4 <= kc; kk += 4) {
    if (kk % 8 == 0) prefetch_ahead(codes + kk * kTileRows);  // one 64-byte line per 8 columns of the tile
    const __m512 first = pair_values(kk);
    const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(pair_values(kk + 2), first));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (kk / 2) * kNR), _mm512_castsi512_si256(both));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (kk / 2 + 1) * kNR), _mm512_extracti64x4_epi64(both, 1));
  }
  if (kk < kc) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (kk / 2) * kNR),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(pair_values(kk))));
  }
}

// Columns [k0, k0 + kc) of the Int4 tile `tile` as bf16 pairs, panel already offset to the tile: each weight
// nibble · scale + offset = (q − z) · s (one FMA, exact in fp32 with bf16 or f16 scales: at most 15 significant
// bits) rounded to the nearest even bf16. That is the bf16 weight a bf16 dequantization of GPTQ / AWQ int4 gives where the scale is bf16, as
// compressed-tensors stores it: (q − z) is exact in bf16 and the product rounds once. k0 and kc multiples of 8 and
// the group size too (HasBf16Panel), so an octet of columns never straddles a group. Each row's word of an octet
// (8 nibbles) is read twice, into lanes 2r and 2r + 1, so that one variable shift per column pair puts the vector in
// pair order (row r's column k in lane 2r, column k + 1 in lane 2r + 1), as DecodeRowScaledTileBf16's bytes.
void DecodeInt4TileBf16(const PreparedLinear& w, int64_t tile, int64_t k0, int64_t kc, uint32_t* panel) {
  const uint8_t* codes = w.codes.as<uint8_t>() + prepare::code_tile_offset(w.in_features, tile);
  const int64_t groups = w.groups();
  const float* scales = w.scales.as<float>() + tile * groups * kTileRows;
  const float* offsets = w.offsets.as<float>() + tile * groups * kTileRows;
  const __m512i each_twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i nibble = _mm512_set1_epi32(0xF);
  // Shifts of column pair p (columns 2p, 2p + 1 of the octet): 8p in even lanes, 8p + 4 in odd ones.
  const __m512i pair_shift[4] = {_mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0),
                                 _mm512_set_epi32(12, 8, 12, 8, 12, 8, 12, 8, 12, 8, 12, 8, 12, 8, 12, 8),
                                 _mm512_set_epi32(20, 16, 20, 16, 20, 16, 20, 16, 20, 16, 20, 16, 20, 16, 20, 16),
                                 _mm512_set_epi32(28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24, 28, 24)};
  // The group of column k0 and where the next one starts (no division per octet).
  int64_t group = k0 / w.group_size, next_group_at = (group + 1) * w.group_size;
  const auto load_group = [&](__m512& scale, __m512& offset) HWY_ATTR {
    scale = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(scales + group * kTileRows)));
    offset = _mm512_permutexvar_ps(each_twice, _mm512_castps256_ps512(_mm256_loadu_ps(offsets + group * kTileRows)));
  };
  __m512 scale, offset;
  load_group(scale, offset);
  for (int64_t c = k0 / 8; c < (k0 + kc) / 8; ++c) {
    if (8 * c == next_group_at) {
      ++group;
      next_group_at += w.group_size;
      load_group(scale, offset);
    }
    const uint8_t* octet = codes + c * prepare::kOctetStride;
    prefetch_ahead(octet);
    const __m512i words = _mm512_permutexvar_epi32(
        each_twice, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(octet))));
    const auto pair_values = [&](int p) HWY_ATTR {
      const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(words, pair_shift[p]), nibble);
      return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), scale, offset);
    };
    uint32_t* out = panel + (8 * c - k0) / 2 * kNR;
    const __m512i lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(pair_values(1), pair_values(0)));
    const __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(pair_values(3), pair_values(2)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(lo));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kNR), _mm512_extracti64x4_epi64(lo, 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * kNR), _mm512_castsi512_si256(hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 3 * kNR), _mm512_extracti64x4_epi64(hi, 1));
  }
}

// Whether DecodePanelBf16 has a panel for the layer: Fp4, bf16 Dense, FP8 and Int8 rows, Int4 with groups of whole
// octets, K a multiple of 16 (the bf16 pairs of x come 16 columns at a time; Fp4 has it by construction).
bool HasBf16Panel(const PreparedLinear& w) {
  switch (w.layout) {
    case WeightLayout::Fp4: return true;
    case WeightLayout::Dense: return w.dense_storage == prepare::DenseStorage::Bf16 && w.in_features % 16 == 0;
    case WeightLayout::Fp8:
    case WeightLayout::Int8: return w.in_features % 16 == 0 && w.group_size > 0 && w.group_size % 2 == 0;
    case WeightLayout::Int4: return w.in_features % 16 == 0 && w.group_size > 0 && w.group_size % 8 == 0;
  }
  return false;
}

// Columns [k0, k0 + kc) of panel p as bf16 pairs; tiles past the end become zeros.
void DecodePanelBf16(const PreparedLinear& w, int64_t p, int64_t k0, int64_t kc, uint32_t* panel) {
  if (w.layout != WeightLayout::Fp4) {  // tile by tile
    for (int64_t s = 0; s < kPanelTiles; ++s) {
      const int64_t tile = p * kPanelTiles + s;
      uint32_t* out = panel + s * kTileRows;
      if (tile < w.tiles() && w.layout == WeightLayout::Fp8) {
        DecodeRowScaledTileBf16<WeightLayout::Fp8>(w, tile, k0, kc, out);
      } else if (tile < w.tiles() && w.layout == WeightLayout::Int8) {
        DecodeRowScaledTileBf16<WeightLayout::Int8>(w, tile, k0, kc, out);
      } else if (tile < w.tiles() && w.layout == WeightLayout::Int4) {
        DecodeInt4TileBf16(w, tile, k0, kc, out);
      } else if (tile < w.tiles()) {
        DecodeDenseTileBf16(w, tile, k0, kc, out);
      } else {
        for (int64_t kk = 0; kk < kc / 2; ++kk) std::memset(out + kk * kNR, 0, kTileRows * sizeof(uint32_t));
      }
    }
    return;
  }
  for (int64_t s = 0; s < kPanelTiles; s += 2) {
    const int64_t tile = p * kPanelTiles + s;
    uint32_t* out = panel + s * kTileRows;
    if (tile >= w.tiles()) {
      for (int64_t kk = 0; kk < kc / 2; ++kk) std::memset(out + kk * kNR, 0, 2 * kTileRows * sizeof(uint32_t));
      continue;
    }
    quant::visit_block_format(w.block_format, [&]<quant::BlockFormat F>() HWY_ATTR {
      DecodeFp4TilePairBf16<F>(w, tile, k0, kc, out);
    });
  }
}

// x [m][K] fp32 → [m][K/2] bf16 pairs (x[2q] in the low half), rounded to nearest even; K a multiple of 16.
HWY_INLINE void RoundToBf16Pairs(const float* HWY_RESTRICT x, int64_t m, int64_t k, uint32_t* HWY_RESTRICT xp) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; j += 16) {
      const __m256i pairs = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i * k + j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xp + (i * k + j) / 2), pairs);
    }
  }
}

using micro::MicroBf16Dispatch;

struct Bf16PanelOps {
  const PreparedLinear& w;
  const uint32_t* xp;  // [m][K/2] pairs
  void decode(int64_t p, int64_t k0, int64_t kc, float* panel) const {
    DecodePanelBf16(w, p, k0, kc, reinterpret_cast<uint32_t*>(panel));  // half the fp32 panel's room
  }
  void micro(int mm, int64_t m0, int64_t k0, int64_t kc, const float* panel, float* c, int64_t ldc, bool load_c) const {
    const int64_t ldx = w.in_features / 2;
    MicroBf16Dispatch(mm, xp + m0 * ldx + k0 / 2, ldx, reinterpret_cast<const uint32_t*>(panel), kNR, kc / 2, c, ldc,
                      load_c);
  }
};

bool Bf16GemmImpl(const PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (!bf16_dot_usable() || !HasBf16Panel(w) || m < 1) return false;
  thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> pairs;
  thread_local size_t capacity = 0;
  uint32_t* xp = Scratch(pairs, capacity, static_cast<size_t>(m * w.in_features / 2));
  RoundToBf16Pairs(x, m, w.in_features, xp);
  // A few rows (a server's decode steps) multiply the stored tiles directly (gemm_bf16_direct.cpp).
  if (m > kBf16DirectMaxRows || !bf16_direct_gemm(w, xp, m, y)) PanelGemm(w, m, y, Bf16PanelOps{w, xp});
  return true;
}

#pragma GCC pop_options

// decode_bf16_panel (gemm_shared.h): the panel decoder above for the AMX kernel (gemm_amx.cpp), which multiplies
// the same panels on tiles.
int64_t DecodeBf16PanelImpl(const PreparedLinear& w, int64_t p, int64_t k0, int64_t kc, uint32_t* panel) {
  if (!HasBf16Panel(w)) return 0;
  DecodePanelBf16(w, p, k0, kc, panel);
  return kNR;
}
#else
bool Bf16GemmImpl(const PreparedLinear&, const float*, int64_t, float*) { return false; }
int64_t DecodeBf16PanelImpl(const PreparedLinear&, int64_t, int64_t, int64_t, uint32_t*) { return 0; }
#endif

#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels {

HWY_EXPORT(GemmImpl);
HWY_EXPORT(Bf16GemmImpl);
HWY_EXPORT(DecodeBf16PanelImpl);
HWY_EXPORT(TargetId);

void gemm_dispatch(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (gemv_dispatch(w, x, m, y)) return;
  HWY_DYNAMIC_DISPATCH(GemmImpl)(w, x, m, y);
}

namespace {
// x [m, K] rounded to bf16 (nearest even), widened back to fp32, in a per-thread buffer.
const float* rounded_to_bf16(const prepare::PreparedLinear& w, const float* x, int64_t m) {
  thread_local std::vector<float> rounded;
  rounded.resize(static_cast<size_t>(m * w.in_features));
  for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = quant::bf16_to_float(quant::float_to_bf16(x[i]));
  return rounded.data();
}
}  // namespace

int64_t decode_bf16_panel(const prepare::PreparedLinear& w, int64_t p, int64_t k0, int64_t kc, uint32_t* panel) {
  return HWY_DYNAMIC_DISPATCH(DecodeBf16PanelImpl)(w, p, k0, kc, panel);
}

void bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (gemv_bf16_dispatch(w, x, m, y) || amx_bf16_gemm(w, x, m, y) || HWY_DYNAMIC_DISPATCH(Bf16GemmImpl)(w, x, m, y)) {
    return;
  }
  // No bf16 dot products here: the same rounded x through the fp32 kernels (the same numbers up to the summation
  // order and vdpbf16ps's flush of subnormal inputs).
  gemm_dispatch(w, rounded_to_bf16(w, x, m), m, y);
}

bool bf16_dot_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  // Int4 has no GEMV today; should it gain an fp32-x one, its decode rows under bf16 must still not take it.
  return (w.layout != prepare::WeightLayout::Int4 && gemv_dispatch(w, x, m, y)) || amx_bf16_gemm(w, x, m, y) || HWY_DYNAMIC_DISPATCH(Bf16GemmImpl)(w, x, m, y);
}

void invariant_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (gemv_invariant_dispatch(w, x, m, y, /*bf16_input=*/false)) return;
  HWY_DYNAMIC_DISPATCH(GemmImpl)(w, x, m, y);
}

void invariant_bf16_gemm(const prepare::PreparedLinear& w, const float* x, int64_t m, float* y) {
  if (gemv_invariant_dispatch(w, x, m, y, /*bf16_input=*/true)) return;
  invariant_gemm(w, rounded_to_bf16(w, x, m), m, y);
}

std::vector<int64_t> gemm_targets() { return hwy::SupportedAndGeneratedTargets(); }

const char* gemm_target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetId)()); }

}  // namespace fp4serve::kernels
#endif
