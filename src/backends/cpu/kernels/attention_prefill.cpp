// SPDX-License-Identifier: Apache-2.0
// Blocked causal attention for prefill, compiled once per Highway target (foreach_target.h re-includes this file).
// attend_group (simd_ops.cpp) computes one query row at a time with a dot product and a horizontal sum per key
// and head, then one axpy per key and head through memory: ~35 GFLOP/s on an AVX-512 core, a fifth of what the
// panel GEMM's micro-kernel reaches. Here a block of query rows × the heads of one KV head is a small matrix Q,
// and both products of attention are GEMMs on the shared micro-kernel (gemm_micro-inl.h), tiled flash-style:
//   keys of the KV head packed once per call as panels [D][kNR] (K transposed); then per block of query rows,
//   per tile of kKeyTile keys: S = Q · Kᵀ of the tile, each row's online softmax over its own causal (or
//   windowed) keys of the tile (a running max m and Σ exp(s − m); a larger max rescales the sum and the output
//   so far), masked keys getting P = 0, and O += P · V with the value rows read straight from an fp32 cache (row
//   stride = the cache row stride) or from a 16-bit cache's rows widened once per call.
// Scratch per thread is one tile of scores ([query vectors][kKeyTile]) and the block's O whatever the prompt's
// length, and a tile's keys, values and scores stay in L2 while all the block's query vectors use them (tile sizes
// measured: docs/performance.md "Long-prompt prefill attention").
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/attention_prefill.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/kv_paging.h"
#include "backends/cpu/kernels/kv_rows-inl.h"
#include "backends/cpu/kernels/simd.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if !FP4SERVE_PANEL_TARGET

bool PrefillAttentionImpl(const float*, int64_t, int64_t, const KvRows&, const AttentionParams&, float*) {
  return false;
}

#else

using kernels::HWY_NAMESPACE::micro::DF;
using kernels::HWY_NAMESPACE::micro::kLanes;
using kernels::HWY_NAMESPACE::micro::kMR;
using kernels::HWY_NAMESPACE::micro::kNR;
using kernels::HWY_NAMESPACE::micro::MicroDispatch;
using kernels::HWY_NAMESPACE::micro::Scratch;
namespace kv = kernels::HWY_NAMESPACE::kv;

// Keys per tile of the online softmax (a multiple of kNR): a tile's scores ([query vectors][kKeyTile]) and its keys
// and values stay in L2 while every query vector of the block uses them.
constexpr int64_t kKeyTile = 256;
// Query vectors (rows × heads of one KV head) per block: several micro-kernel calls per key panel read.
constexpr int64_t kMaxBlockVectors = 4 * kMR;
static_assert(kKeyTile % kNR == 0, "key tiles are whole panels");

// Packs `keys` keys of a paged cache from position p0 on into `panel` ([d][kNR], key l in column l) and their
// values into `values` ([keys][d] fp32), widening 16-bit rows through `row` (d floats). Positions before
// `first_read` (before the first query's sliding window: their blocks may have been released) pack as zeros.
void PackPagedKeys(const KvRows& cache, int64_t kvh, int64_t p0, int64_t keys, int64_t first_read, int64_t d,
                   float* row, float* panel, float* values) {
  const bool f32 = cache.element == KvElement::F32;
  for (int64_t l = 0; l < keys; ++l) {
    const int64_t pos = p0 + l;
    float* value = values + l * d;
    if (pos < first_read) {
      for (int64_t e = 0; e < d; ++e) panel[e * kNR + l] = 0.0f;
      std::fill(value, value + d, 0.0f);
      continue;
    }
    const int64_t off = kv_offset(cache, kvh, pos);
    const float* key = row;
    if (f32) {
      key = static_cast<const float*>(cache.keys) + off;
      std::memcpy(value, static_cast<const float*>(cache.values) + off, sizeof(float) * static_cast<size_t>(d));
    } else {
      kv::WidenRows(static_cast<const uint16_t*>(cache.keys) + off, cache.element, d, 1, 1, d, row);
      kv::WidenRows(static_cast<const uint16_t*>(cache.values) + off, cache.element, d, 1, 1, d, value);
    }
    for (int64_t e = 0; e < d; ++e) panel[e * kNR + l] = key[e];
  }
}

bool PrefillAttentionImpl(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& p,
                          float* out) {
  if (hn::Lanes(DF()) != static_cast<size_t>(kLanes)) return false;  // an SVE length the panels do not assume
  const DF df;
  const int64_t heads = p.num_heads, kv_heads = p.num_kv_heads, d = p.head_dim, group = heads / kv_heads;
  const int64_t total = start_pos + t;
  const int64_t stride = cache.row_stride, head_stride = cache.head_stride;
  // An unpaged fp32 cache's values are read in place; 16-bit rows are widened to fp32 below, and a paged cache's
  // values are gathered into the same scratch (its rows are not one stride apart).
  const bool paged = cache.block_table != nullptr;
  const bool in_place = cache.element == KvElement::F32 && !paged;
  const auto* k16 = static_cast<const uint16_t*>(cache.keys);
  const auto* v16 = static_cast<const uint16_t*>(cache.values);
  // Query rows per block: as many as keep rows × group ≤ kMaxBlockVectors, so that each key tile (in L2) serves
  // several micro-kernel calls, but fewer when that would leave less than two blocks × KV heads per thread.
  const int64_t threads = omp_get_max_threads();
  const int64_t rows_per_block = std::max<int64_t>(1, std::min(kMaxBlockVectors / group, t * kv_heads / (2 * threads)));
  const int64_t vectors = rows_per_block * group;
  const int64_t blocks = (t + rows_per_block - 1) / rows_per_block;
  const int64_t window = p.sliding_window;
  const auto lo_of = [&](int64_t pos) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; };
  // Key panels first_panel … first_panel + key_panels − 1 are packed: a sliding window leaves out the keys before
  // the first row's window.
  const int64_t first_panel = lo_of(start_pos) / kNR;
  const int64_t key_panels = (total + kNR - 1) / kNR - first_panel;

  // The packed keys, kept by the calling thread between calls: as large as one layer's keys of the sequence
  // (KV heads × keys × D floats), i.e. 1/(2·layers) of its KV cache.
  static thread_local hwy::AlignedFreeUniquePtr<float[]> kt_buf;
  static thread_local size_t kt_cap = 0;
  float* kt = Scratch(kt_buf, kt_cap, static_cast<size_t>(kv_heads * key_panels * d * kNR));
  // Panel of key panel index b (keys [b·kNR, (b + 1)·kNR)) of KV head kvh, b ≥ first_panel.
  const auto panel_of = [&](int64_t kvh, int64_t b) { return kt + (kvh * key_panels + b - first_panel) * d * kNR; };
  // A 16-bit cache's values widened once per call: [KV heads][total − first_key][d] fp32, the rows from the first
  // packed key on (a sliding window leaves the earlier ones out).
  const int64_t first_key = first_panel * kNR, widened_rows = total - first_key;
  static thread_local hwy::AlignedFreeUniquePtr<float[]> vt_buf;
  static thread_local size_t vt_cap = 0;
  float* vt = in_place ? nullptr : Scratch(vt_buf, vt_cap, static_cast<size_t>(kv_heads * widened_rows * d));
  const auto widened_value = [&](int64_t kvh, int64_t row) { return vt + (kvh * widened_rows + row - first_key) * d; };

#pragma omp parallel
  {
    // K of each KV head as panels: panel b holds keys [b·kNR, (b + 1)·kNR) as [d][kNR], zeros past the last key.
    // A 16-bit cache's keys are widened kNR rows at a time first; its values go to vt.
    static thread_local hwy::AlignedFreeUniquePtr<float[]> row_buf;
    static thread_local size_t row_cap = 0;
    float* rows_f32 = in_place ? nullptr : Scratch(row_buf, row_cap, static_cast<size_t>(kNR * d));
#pragma omp for schedule(static) collapse(2)
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
      for (int64_t b = first_panel; b < first_panel + key_panels; ++b) {
        float* panel = panel_of(kvh, b);
        const int64_t keys = std::min(kNR, total - b * kNR);
        if (keys < kNR) std::fill(panel, panel + d * kNR, 0.0f);
        if (paged) {
          PackPagedKeys(cache, kvh, b * kNR, keys, lo_of(start_pos), d, rows_f32, panel, widened_value(kvh, b * kNR));
          continue;
        }
        const float* key0 = rows_f32;
        int64_t key_stride = d;
        if (in_place) {
          key0 = static_cast<const float*>(cache.keys) + b * kNR * stride + kvh * head_stride;
          key_stride = stride;
        } else {
          kv::WidenRows(k16 + b * kNR * stride + kvh * head_stride, cache.element, stride, keys, keys, d, rows_f32);
          kv::WidenRows(v16 + b * kNR * stride + kvh * head_stride, cache.element, stride, keys, keys, d,
                        widened_value(kvh, b * kNR));
        }
        for (int64_t l = 0; l < keys; ++l) {
          const float* key = key0 + l * key_stride;
          for (int64_t e = 0; e < d; ++e) panel[e * kNR + l] = key[e];
        }
      }
    }

    static thread_local hwy::AlignedFreeUniquePtr<float[]> q_buf, s_buf, o_buf;
    static thread_local size_t q_cap = 0, s_cap = 0, o_cap = 0;
    float* qp = Scratch(q_buf, q_cap, static_cast<size_t>(vectors * d));
    float* s = Scratch(s_buf, s_cap, static_cast<size_t>(vectors * kKeyTile));
    float* o = Scratch(o_buf, o_cap, static_cast<size_t>(vectors * (d + 2)));
    float* row_max = o + vectors * d;        // [vectors]: the running max score m of each row
    float* row_sum = row_max + vectors;      // [vectors]: Σ exp(s − m) over the keys so far

    // Later blocks attend to more keys: hand them out first (longest first balances the dynamic schedule).
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < blocks * kv_heads; ++item) {
      const int64_t blk = blocks - 1 - item / kv_heads, kvh = item % kv_heads;
      const int64_t i0 = blk * rows_per_block, rows = std::min(rows_per_block, t - i0), nq = rows * group;
      const int64_t h0 = kvh * group;
      const int64_t hi_max = start_pos + i0 + rows - 1, lo_min = lo_of(start_pos + i0);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(qp + r * group * d, q + ((i0 + r) * heads + h0) * d, sizeof(float) * static_cast<size_t>(group * d));
      }
      std::fill(o, o + nq * d, 0.0f);
      std::fill(row_max, row_max + nq, -INFINITY);
      std::fill(row_sum, row_sum + nq, 0.0f);
      // Key tiles of kKeyTile keys from the block's first key panel to its last row's key: S = Q·Kᵀ of the tile,
      // the online softmax (each row's max so far; what was summed before a larger max is rescaled), O += P·V.
      for (int64_t j0 = lo_min / kNR * kNR; j0 <= hi_max; j0 += kKeyTile) {
        const int64_t j_end = std::min(j0 + kKeyTile, hi_max + 1);  // keys [j0, j_end) of the tile
        // S[n][key − j0] = q_n · k_key for every key of the tile's panels.
        for (int64_t b = j0 / kNR; b <= (j_end - 1) / kNR; ++b) {
          for (int64_t n0 = 0; n0 < nq; n0 += kMR) {
            MicroDispatch(static_cast<int>(std::min(kMR, nq - n0)), qp + n0 * d, d, panel_of(kvh, b), kNR, d,
                          s + n0 * kKeyTile + (b * kNR - j0), kKeyTile, /*load_c=*/false);
          }
        }
        // Values are read from v_lo on (never before the block's first key: a window's earlier blocks may be gone).
        const int64_t v_lo = std::max(j0, lo_min), span = j_end - v_lo;
        for (int64_t n = 0; n < nq; ++n) {
          const int64_t pos = start_pos + i0 + n / group;
          // This row's keys in the tile: [lo, hi] (its window and causal limit); P = 0 for the tile's others.
          const int64_t lo = std::max(lo_of(pos), j0), hi = std::min(pos, j_end - 1);
          float* sn = s + n * kKeyTile - j0;  // sn[key]
          if (hi < lo) {
            std::fill(sn + v_lo, sn + j_end, 0.0f);
            continue;
          }
          const int64_t len = hi - lo + 1;
          const auto vscale = hn::Set(df, p.scale);
          auto vmax = hn::Set(df, -INFINITY);
          int64_t j = 0;
          for (; j + kLanes <= len; j += kLanes) {
            const auto x = hn::Mul(hn::LoadU(df, sn + lo + j), vscale);
            hn::StoreU(x, df, sn + lo + j);
            vmax = hn::Max(vmax, x);
          }
          float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
          for (; j < len; ++j) m = std::max(m, sn[lo + j] *= p.scale);
          m = std::max(m, row_max[n]);
          if (m > row_max[n] && row_max[n] != -INFINITY) {  // a larger max: rescale what was summed (−inf: nothing yet)
            const float correction = std::exp(row_max[n] - m);
            row_sum[n] *= correction;
            for (int64_t e = 0; e < d; ++e) o[n * d + e] *= correction;
          }
          row_max[n] = m;
          row_sum[n] += exp_shifted_sum(sn + lo, len, m);  // simd_ops.cpp's, as attend_group's softmax
          std::fill(sn + v_lo, sn + lo, 0.0f);
          std::fill(sn + hi + 1, sn + j_end, 0.0f);
        }
        // O += P · V over keys [v_lo, j_end); full kNR-wide column chunks on the micro-kernel.
        const float* pv = s + (v_lo - j0);
        const float* v0 = in_place ? static_cast<const float*>(cache.values) + v_lo * stride + kvh * head_stride
                                   : widened_value(kvh, v_lo);
        const int64_t v_stride = in_place ? stride : d;
        int64_t e0 = 0;
        for (; e0 + kNR <= d; e0 += kNR) {
          for (int64_t n0 = 0; n0 < nq; n0 += kMR) {
            MicroDispatch(static_cast<int>(std::min(kMR, nq - n0)), pv + n0 * kKeyTile, kKeyTile, v0 + e0, v_stride,
                          span, o + n0 * d + e0, d, /*load_c=*/true);
          }
        }
        for (int64_t j = 0; e0 < d && j < span; ++j) {  // head dims not a multiple of kNR: the last columns by row
          const float* vj = v0 + j * v_stride;
          for (int64_t n = 0; n < nq; ++n) {
            const float w = pv[n * kKeyTile + j];
            for (int64_t e = e0; e < d; ++e) o[n * d + e] += w * vj[e];
          }
        }
      }
      // out = O / (Σ exp(s − m) + e^(sink − m)) with M = max(m, sink) as the common shift: the sink joins the max
      // and the denominator only (GPT-OSS: an extra logit whose probability is dropped).
      for (int64_t n = 0; n < nq; ++n) {
        float* dst = out + ((i0 + n / group) * heads + h0 + n % group) * d;
        const float sink = p.sinks != nullptr ? p.sinks[h0 + n % group] : -INFINITY;
        const float big = std::max(row_max[n], sink);
        const float keep = std::exp(row_max[n] - big);
        const float denom = row_sum[n] * keep + (p.sinks != nullptr ? std::exp(sink - big) : 0.0f);
        const auto vinv = hn::Set(df, keep / denom);
        int64_t e = 0;
        for (; e + kLanes <= d; e += kLanes) hn::StoreU(hn::Mul(hn::LoadU(df, o + n * d + e), vinv), df, dst + e);
        for (; e < d; ++e) dst[e] = o[n * d + e] * (keep / denom);
      }
    }
  }
  return true;
}

#endif  // FP4SERVE_PANEL_TARGET

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels::cpu {

HWY_EXPORT(PrefillAttentionImpl);

bool prefill_attention(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& params,
                       float* out) {
  return HWY_DYNAMIC_DISPATCH(PrefillAttentionImpl)(q, t, start_pos, cache, params, out);
}

}  // namespace fp4serve::kernels::cpu
#endif  // HWY_ONCE
