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
// The two products run in fp32 (ProductsF32) or, where AttentionParams::bf16_dot_products asks and a bf16 cache and
// AVX512-BF16 allow, on bf16 dot products (ProductsBf16: Q and P rounded to bf16, 1.7–2.1× on Zen 4); one body
// (BlockedPrefill) holds the blocking and the online softmax for both.
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
#include "backends/cpu/kernels/gemm_shared.h"
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
bool PrefillBf16Impl(KvElement, const AttentionParams&) { return false; }

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

// A call as the packing and the products see it.
struct CallShape {
  const KvRows& cache;
  int64_t kv_heads, d;
  int64_t total;        // keys 0 … total − 1 exist (start_pos + t)
  int64_t first_panel;  // key panels first_panel … first_panel + key_panels − 1 are packed: a sliding window
  int64_t key_panels;   // leaves out the keys before the first row's window
  int64_t first_read;   // the first row's first key: a paged cache's earlier blocks may have been released
};

// Packs `keys` keys of a paged cache from position p0 on into `panel` ([d][kNR], key l in column l) and their
// values into `values` ([keys][d] fp32), widening 16-bit rows through `row` (d floats). Positions before
// `first_read` pack as zeros.
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

// ---- the products in fp32 -------------------------------------------------------------------------------------
// Keys as fp32 panels [d][kNR] (K transposed); values read in place from an unpaged fp32 cache, else widened (or
// gathered, when paged) once per call into fp32 rows [KV heads][keys][d]; Q as it is; the fp32 micro-kernel.
class ProductsF32 {
 public:
  explicit ProductsF32(const CallShape& c)
      : c_(c), in_place_(c.cache.element == KvElement::F32 && c.cache.block_table == nullptr),
        first_key_(c.first_panel * kNR), value_rows_(c.total - first_key_) {
    // Kept by the calling thread between calls: one layer's keys of the sequence, 1/(2·layers) of its KV cache.
    static thread_local hwy::AlignedFreeUniquePtr<float[]> kt_buf, vt_buf;
    static thread_local size_t kt_cap = 0, vt_cap = 0;
    kt_ = Scratch(kt_buf, kt_cap, static_cast<size_t>(c.kv_heads * c.key_panels * c.d * kNR));
    vt_ = in_place_ ? nullptr : Scratch(vt_buf, vt_cap, static_cast<size_t>(c.kv_heads * value_rows_ * c.d));
  }

  // Key panel b of KV head kvh (keys [b·kNR, (b + 1)·kNR), zeros past the last key) and, unless read in place,
  // its values.
  void pack(int64_t kvh, int64_t b) const {
    const KvRows& cache = c_.cache;
    const int64_t d = c_.d, keys = std::min(kNR, c_.total - b * kNR);
    static thread_local hwy::AlignedFreeUniquePtr<float[]> row_buf;
    static thread_local size_t row_cap = 0;
    float* rows_f32 = in_place_ ? nullptr : Scratch(row_buf, row_cap, static_cast<size_t>(kNR * d));
    float* panel = panel_of(kvh, b);
    if (keys < kNR) std::fill(panel, panel + d * kNR, 0.0f);
    if (cache.block_table != nullptr) {
      PackPagedKeys(cache, kvh, b * kNR, keys, c_.first_read, d, rows_f32, panel, value_row(kvh, b * kNR));
      return;
    }
    const int64_t stride = cache.row_stride, at = b * kNR * stride + kvh * cache.head_stride;
    const float* key0 = rows_f32;
    int64_t key_stride = d;
    if (in_place_) {
      key0 = static_cast<const float*>(cache.keys) + at;
      key_stride = stride;
    } else {
      kv::WidenRows(static_cast<const uint16_t*>(cache.keys) + at, cache.element, stride, keys, keys, d, rows_f32);
      kv::WidenRows(static_cast<const uint16_t*>(cache.values) + at, cache.element, stride, keys, keys, d,
                    value_row(kvh, b * kNR));
    }
    for (int64_t l = 0; l < keys; ++l) {
      const float* key = key0 + l * key_stride;
      for (int64_t e = 0; e < d; ++e) panel[e * kNR + l] = key[e];
    }
  }

  // The block's query vectors as the products take them: `nq` rows of d floats, vector n at q + n·d.
  const float* queries(const float* q, int64_t nq) const { return q; }

  // x[i] = e^(x[i] − m) for i < len; returns their sum. simd_ops.cpp's, as attend_group's softmax.
  static float exp_sum(float* x, int64_t len, float m) { return exp_shifted_sum(x, len, m); }

  // s[n · kKeyTile + l] = q_n · k_(b·kNR + l) for the nq vectors and the kNR keys of panel b.
  void scores(const float* qv, int64_t nq, int64_t kvh, int64_t b, float* s) const {
    for (int64_t n0 = 0; n0 < nq; n0 += kMR) {
      MicroDispatch(static_cast<int>(std::min(kMR, nq - n0)), qv + n0 * c_.d, c_.d, panel_of(kvh, b), kNR, c_.d,
                    s + n0 * kKeyTile, kKeyTile, /*load_c=*/false);
    }
  }

  // o[n · d + e] += Σ_key P[n][key − j0] · v_key[e] over keys [v_lo, j_end); P rows kKeyTile apart, zero outside
  // each row's keys from v_lo on (what lies in [j0, v_lo) is never read).
  void accumulate(const float* pr, int64_t nq, int64_t kvh, int64_t j0, int64_t v_lo, int64_t j_end, float* o) const {
    const KvRows& cache = c_.cache;
    const int64_t d = c_.d, span = j_end - v_lo;
    const float* pv = pr + (v_lo - j0);
    const float* v0 = in_place_ ? static_cast<const float*>(cache.values) + v_lo * cache.row_stride +
                                      kvh * cache.head_stride
                                : value_row(kvh, v_lo);
    const int64_t v_stride = in_place_ ? cache.row_stride : d;
    int64_t e0 = 0;
    for (; e0 + kNR <= d; e0 += kNR) {  // full kNR-wide column chunks on the micro-kernel
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

 private:
  float* panel_of(int64_t kvh, int64_t b) const { return kt_ + (kvh * c_.key_panels + b - c_.first_panel) * c_.d * kNR; }
  float* value_row(int64_t kvh, int64_t key) const { return vt_ + (kvh * value_rows_ + key - first_key_) * c_.d; }

  const CallShape& c_;
  bool in_place_;
  int64_t first_key_, value_rows_;  // the widened values: rows first_key_ … first_key_ + value_rows_ − 1
  float* kt_ = nullptr;
  float* vt_ = nullptr;
};

#if FP4SERVE_BF16_MICRO_TARGET
using kernels::HWY_NAMESPACE::micro::MicroBf16Dispatch;

// Whether the products run on bf16 dot products (ProductsBf16): asked for (AttentionParams::bf16_dot_products),
// the CPU has AVX512-BF16 and allows it (bf16_dot_usable), the cache holds bf16 (so the keys and values are used
// as stored) and the head dim is whole panels.
bool UsesBf16(KvElement element, const AttentionParams& p) {
  return p.bf16_dot_products && element == KvElement::Bf16 && p.head_dim % kNR == 0 && bf16_dot_usable();
}

#pragma GCC push_options
#pragma GCC target("avx512bf16")
// ---- the products on bf16 dot products (AVX512-BF16, a bf16 cache, d a multiple of kNR) -----------------------
// What GPU flash attention does with a bf16 model: Q and P rounded to bf16 (nearest even), keys and values as the
// cache stores them, each product pair summed in fp32 by vdpbf16ps (twice the FMA's rate). Keys as panels of
// pairs [d/2][kNR] (word (i, l) holds elements 2i and 2i + 1 of key l: the cache's own two halves); values as
// pairs of positions [KV heads][key pairs][d] (word (j, e) = v_(2j)[e] | v_(2j+1)[e] << 16), so that both
// products run on MicroBf16. Positions before first_read and past the last key pack as zeros.
class ProductsBf16 {
 public:
  explicit ProductsBf16(const CallShape& c) : c_(c), first_key_(c.first_panel * kNR), pair_rows_(c.key_panels * kNR / 2) {
    static thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> kt_buf, vt_buf;
    static thread_local size_t kt_cap = 0, vt_cap = 0;
    kt_ = Scratch(kt_buf, kt_cap, static_cast<size_t>(c.kv_heads * c.key_panels * c.d / 2 * kNR));
    vt_ = Scratch(vt_buf, vt_cap, static_cast<size_t>(c.kv_heads * pair_rows_ * c.d));
  }

  void pack(int64_t kvh, int64_t b) const {
    const int64_t d = c_.d, half = d / 2;
    const auto* k16 = static_cast<const uint16_t*>(c_.cache.keys);
    const auto* v16 = static_cast<const uint16_t*>(c_.cache.values);
    // The key and value rows of positions b·kNR … (b + 1)·kNR − 1, null where they pack as zeros.
    const uint16_t* keys[kNR];
    const uint16_t* values[kNR];
    for (int64_t l = 0; l < kNR; ++l) {
      const int64_t pos = b * kNR + l;
      const bool real = pos >= c_.first_read && pos < c_.total;
      const int64_t off = real ? kv_offset(c_.cache, kvh, pos) : 0;
      keys[l] = real ? k16 + off : nullptr;
      values[l] = real ? v16 + off : nullptr;
    }
    uint32_t* panel = kt_ + (kvh * c_.key_panels + b - c_.first_panel) * half * kNR;
    for (int64_t l = 0; l < kNR; ++l) {
      if (keys[l] == nullptr) {
        for (int64_t i = 0; i < half; ++i) panel[i * kNR + l] = 0;
        continue;
      }
      for (int64_t i = 0; i < half; ++i) {
        uint32_t word;
        std::memcpy(&word, keys[l] + 2 * i, sizeof(word));
        panel[i * kNR + l] = word;
      }
    }
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t j = 0; j < kNR / 2; ++j) {
      uint32_t* row = value_pairs(kvh, b * kNR + 2 * j);
      const uint16_t* even = values[2 * j];
      const uint16_t* odd = values[2 * j + 1];
      for (int64_t e = 0; e < d; e += 16) {
        const __m512i lo = even != nullptr ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + e))) : zero;
        const __m512i hi = odd != nullptr ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd + e))) : zero;
        _mm512_storeu_si512(row + e, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
    }
  }

  // The nq query vectors (d floats each, one after another) rounded to bf16 pairs [nq][d/2], in the thread's scratch.
  const uint32_t* queries(const float* q, int64_t nq) const {
    static thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> q_buf;
    static thread_local size_t q_cap = 0;
    uint32_t* qp = Scratch(q_buf, q_cap, static_cast<size_t>(nq * c_.d / 2));
    for (int64_t i = 0; i < nq * c_.d; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qp + i / 2),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(q + i))));
    }
    return qp;
  }

  // As ProductsF32::exp_sum with a shorter e^x, whose error vanishes under the bf16 rounding of P (2^−8): x·log2(e)
  // = n + f with n an integer and |f| ≤ 1/2, 2^f by its Taylor polynomial of degree 6 (remainder (ln 2 / 2)^7 / 7!
  // < 1.3e-7), times 2^n by vscalefps (which also gives 0 far below the fp32 range). Measured against float64 over
  // 32M inputs: ≤ 6.7e-7 relative for x ≥ −10, ≤ 4e-6 down to −87 (the rounding of x·log2(e) grows with |x|).
  // About 14 instructions per 16 lanes against Highway's Exp's ~22, which took 22% of the kernel's time here.
  static float exp_sum(float* x, int64_t len, float m) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), shift = _mm512_set1_ps(m);
    const __m512 floor_t = _mm512_set1_ps(-160.0f);  // e^x < 2^−150 there: 0 after the scaling
    // ln(2)^k / k!, k = 6 … 1.
    const __m512 c6 = _mm512_set1_ps(1.5403530393381606e-4f), c5 = _mm512_set1_ps(1.3333558146428443e-3f),
                 c4 = _mm512_set1_ps(9.6181291076284772e-3f), c3 = _mm512_set1_ps(5.5504108664821580e-2f),
                 c2 = _mm512_set1_ps(2.4022650695910071e-1f), c1 = _mm512_set1_ps(6.9314718055994531e-1f);
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < len; i += 16) {
      const __mmask16 live = static_cast<__mmask16>(len - i >= 16 ? 0xFFFF : (1u << (len - i)) - 1);
      // vmaxps returns its second operand when either is NaN: a NaN score stays NaN, as in the fp32 path.
      const __m512 t = _mm512_max_ps(floor_t, _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, x + i), shift), log2e));
      const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 f = _mm512_sub_ps(t, n);
      __m512 p = _mm512_fmadd_ps(c6, f, c5);
      p = _mm512_fmadd_ps(p, f, c4);
      p = _mm512_fmadd_ps(p, f, c3);
      p = _mm512_fmadd_ps(p, f, c2);
      p = _mm512_fmadd_ps(p, f, c1);
      p = _mm512_fmadd_ps(p, f, one);
      const __m512 e = _mm512_scalef_ps(p, n);
      _mm512_mask_storeu_ps(x + i, live, e);
      sum = _mm512_mask_add_ps(sum, live, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
  }

  void scores(const uint32_t* qv, int64_t nq, int64_t kvh, int64_t b, float* s) const {
    const int64_t half = c_.d / 2;
    const uint32_t* panel = kt_ + (kvh * c_.key_panels + b - c_.first_panel) * half * kNR;
    for (int64_t n0 = 0; n0 < nq; n0 += kMR) {
      MicroBf16Dispatch(static_cast<int>(std::min(kMR, nq - n0)), qv + n0 * half, half, panel, kNR, half,
                        s + n0 * kKeyTile, kKeyTile, /*load_c=*/false);
    }
  }

  // As ProductsF32::accumulate, from the tile's first key j0 (even) in pairs: P rounded to bf16 pairs, its entries
  // before v_lo and the odd key past j_end set to zero first (pr is the caller's scratch).
  void accumulate(float* pr, int64_t nq, int64_t kvh, int64_t j0, int64_t v_lo, int64_t j_end, float* o) const {
    static thread_local hwy::AlignedFreeUniquePtr<uint32_t[]> p_buf;
    static thread_local size_t p_cap = 0;
    uint32_t* pp = Scratch(p_buf, p_cap, static_cast<size_t>(nq * kKeyTile / 2));
    const int64_t keys = j_end - j0, pairs = (keys + 1) / 2, d = c_.d;
    for (int64_t n = 0; n < nq; ++n) {
      float* row = pr + n * kKeyTile;
      std::fill(row, row + (v_lo - j0), 0.0f);
      if (keys % 2 != 0) row[keys] = 0.0f;  // keys < kKeyTile here
      for (int64_t j = 0; j < 2 * pairs; j += 16) {
        // Past the last pair the words are zeros (the row's scratch beyond it holds stale scores).
        const __mmask16 live = static_cast<__mmask16>(2 * pairs - j >= 16 ? 0xFFFF : (1u << (2 * pairs - j)) - 1);
        const __m256i words = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, row + j)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp + n * kKeyTile / 2 + j / 2), words);
      }
    }
    const uint32_t* v0 = value_pairs(kvh, j0);
    for (int64_t e0 = 0; e0 < d; e0 += kNR) {
      for (int64_t n0 = 0; n0 < nq; n0 += kMR) {
        MicroBf16Dispatch(static_cast<int>(std::min(kMR, nq - n0)), pp + n0 * kKeyTile / 2, kKeyTile / 2, v0 + e0, d,
                          pairs, o + n0 * d + e0, d, /*load_c=*/true);
      }
    }
  }

 private:
  uint32_t* value_pairs(int64_t kvh, int64_t key) const { return vt_ + (kvh * pair_rows_ + (key - first_key_) / 2) * c_.d; }

  const CallShape& c_;
  int64_t first_key_, pair_rows_;  // value pair rows of keys first_key_ … first_key_ + 2·pair_rows_ − 1
  uint32_t* kt_ = nullptr;
  uint32_t* vt_ = nullptr;
};
#pragma GCC pop_options
#endif  // FP4SERVE_BF16_MICRO_TARGET

// The blocked attention of one call on either kind of products.
template <class Products>
void BlockedPrefill(const Products& products, const CallShape& c, const float* q, int64_t t, int64_t start_pos,
                    const AttentionParams& p, float* out) {
  const DF df;
  const int64_t heads = p.num_heads, kv_heads = c.kv_heads, d = c.d, group = heads / kv_heads;
  // Query rows per block: as many as keep rows × group ≤ kMaxBlockVectors, so that each key tile (in L2) serves
  // several micro-kernel calls, but fewer when that would leave less than two blocks × KV heads per thread.
  const int64_t threads = omp_get_max_threads();
  const int64_t rows_per_block = std::max<int64_t>(1, std::min(kMaxBlockVectors / group, t * kv_heads / (2 * threads)));
  const int64_t vectors = rows_per_block * group;
  const int64_t blocks = (t + rows_per_block - 1) / rows_per_block;
  const int64_t window = p.sliding_window;
  const auto lo_of = [&](int64_t pos) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; };

#pragma omp parallel
  {
#pragma omp for schedule(static) collapse(2)
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
      for (int64_t b = c.first_panel; b < c.first_panel + c.key_panels; ++b) products.pack(kvh, b);
    }

    static thread_local hwy::AlignedFreeUniquePtr<float[]> q_buf, s_buf, o_buf;
    static thread_local size_t q_cap = 0, s_cap = 0, o_cap = 0;
    float* qf = Scratch(q_buf, q_cap, static_cast<size_t>(vectors * d));
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
        std::memcpy(qf + r * group * d, q + ((i0 + r) * heads + h0) * d, sizeof(float) * static_cast<size_t>(group * d));
      }
      const auto* qv = products.queries(qf, nq);
      std::fill(o, o + nq * d, 0.0f);
      std::fill(row_max, row_max + nq, -INFINITY);
      std::fill(row_sum, row_sum + nq, 0.0f);
      // Key tiles of kKeyTile keys from the block's first key panel to its last row's key: S = Q·Kᵀ of the tile,
      // the online softmax (each row's max so far; what was summed before a larger max is rescaled), O += P·V.
      for (int64_t j0 = lo_min / kNR * kNR; j0 <= hi_max; j0 += kKeyTile) {
        const int64_t j_end = std::min(j0 + kKeyTile, hi_max + 1);  // keys [j0, j_end) of the tile
        // S[n][key − j0] = q_n · k_key for every key of the tile's panels.
        for (int64_t b = j0 / kNR; b <= (j_end - 1) / kNR; ++b) products.scores(qv, nq, kvh, b, s + (b * kNR - j0));
        // Values are read from v_lo on (never before the block's first key: a window's earlier blocks may be gone).
        const int64_t v_lo = std::max(j0, lo_min);
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
          row_sum[n] += products.exp_sum(sn + lo, len, m);
          std::fill(sn + v_lo, sn + lo, 0.0f);
          std::fill(sn + hi + 1, sn + j_end, 0.0f);
        }
        products.accumulate(s, nq, kvh, j0, v_lo, j_end, o);  // O += P · V
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
}

bool PrefillAttentionImpl(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& p,
                          float* out) {
  if (hn::Lanes(DF()) != static_cast<size_t>(kLanes)) return false;  // an SVE length the panels do not assume
  const int64_t window = p.sliding_window;
  const int64_t total = start_pos + t;
  const int64_t first_read = window > 0 ? std::max<int64_t>(0, start_pos - window + 1) : 0;
  const int64_t first_panel = first_read / kNR;
  const CallShape shape{cache, p.num_kv_heads, p.head_dim, total, first_panel, (total + kNR - 1) / kNR - first_panel,
                        first_read};
#if FP4SERVE_BF16_MICRO_TARGET
  if (UsesBf16(cache.element, p)) {
    BlockedPrefill(ProductsBf16(shape), shape, q, t, start_pos, p, out);
    return true;
  }
#endif
  BlockedPrefill(ProductsF32(shape), shape, q, t, start_pos, p, out);
  return true;
}

bool PrefillBf16Impl(KvElement element, const AttentionParams& p) {
#if FP4SERVE_BF16_MICRO_TARGET
  return hn::Lanes(DF()) == static_cast<size_t>(kLanes) && UsesBf16(element, p);
#else
  (void)element;
  (void)p;
  return false;
#endif
}

#endif  // FP4SERVE_PANEL_TARGET

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels::cpu {

HWY_EXPORT(PrefillAttentionImpl);
HWY_EXPORT(PrefillBf16Impl);

bool prefill_attention(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& params,
                       float* out) {
  return HWY_DYNAMIC_DISPATCH(PrefillAttentionImpl)(q, t, start_pos, cache, params, out);
}

bool prefill_attention_bf16(KvElement element, const AttentionParams& params) {
  return HWY_DYNAMIC_DISPATCH(PrefillBf16Impl)(element, params);
}

}  // namespace fp4serve::kernels::cpu
#endif  // HWY_ONCE
