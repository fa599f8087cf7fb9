// SPDX-License-Identifier: Apache-2.0
// Widening of 16-bit KV cache rows (bf16, fp16) to fp32, shared by the decode attention (simd_ops.cpp) and the
// blocked prefill attention (attention_prefill.cpp). Re-included once per Highway target by foreach_target.h
// through the including file, hence the toggle guard instead of #pragma once.
#if defined(FP4SERVE_KERNELS_CPU_KV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP4SERVE_KERNELS_CPU_KV_ROWS_INL_H_
#undef FP4SERVE_KERNELS_CPU_KV_ROWS_INL_H_
#else
#define FP4SERVE_KERNELS_CPU_KV_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/kernels/attention.h"
#include "quant/formats.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
namespace kv {
namespace hn = hwy::HWY_NAMESPACE;

// out[0..n) = the fp32 values of the 16-bit elements src[0..n) (exact: both types are subsets of fp32).
template <KvElement kElement>
HWY_INLINE void Widen16(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if constexpr (kElement == KvElement::Bf16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(df)> dh;
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(src + i))), df, out + i);
    }
    for (; i < n; ++i) out[i] = quant::bf16_to_float(src[i]);
  } else {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i))), df, out + i);
    }
    for (; i < n; ++i) out[i] = quant::f16_to_float(src[i]);
  }
}

// The widening loop prefetches rows this many bytes ahead of the one it converts (bench_ops BM_AttentionCold,
// bf16: 2 and 8 KiB alike, 1 KiB up to 1.5× slower), into L2 (prefetcht1: the L1's few miss buffers would stall
// the core; BM_AttentionCold's 16-bit cases 1.1–1.3× faster than with prefetcht0, fp32 ones unchanged).
constexpr int64_t kWidenAheadBytes = 8192;

// A prefetch of the line at `p` into L2 (locality 2: prefetcht1 on x86).
HWY_INLINE void PrefetchL2(const void* p) { __builtin_prefetch(p, 0, 2); }

// Rows WidenRows fetches ahead of the one it converts.
inline int64_t WidenAheadRows(int64_t d) { return std::max<int64_t>(1, kWidenAheadBytes / (2 * d)); }

// Prefetches the first min(rows, WidenAheadRows(d)) 16-bit rows: the ones a WidenRows call starting at `src`
// converts before its own prefetches arrive.
HWY_INLINE void PrefetchFirstRows(const void* src, int64_t stride, int64_t rows, int64_t d) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t r = 0; r < std::min(rows, WidenAheadRows(d)); ++r) {
    const auto* row = reinterpret_cast<const char*>(s + r * stride);
    for (int64_t b = 0; b < 2 * d; b += 64) PrefetchL2(row + b);
  }
}

// out[r·d + e] = row r's element e as fp32 for rows r in [0, rows): row r starts at src + r·stride elements and
// holds d elements of type `element` (bf16 or fp16). Rows up to kWidenAheadBytes ahead are prefetched, also past
// `rows` when `prefetch_rows` allows (the caller's next chunk).
HWY_INLINE void WidenRows(const void* src, KvElement element, int64_t stride, int64_t rows, int64_t prefetch_rows,
                          int64_t d, float* HWY_RESTRICT out) {
  const auto* s = static_cast<const uint16_t*>(src);
  const int64_t row_bytes = 2 * d;
  const int64_t ahead = WidenAheadRows(d);
  for (int64_t r = 0; r < rows; ++r) {
    if (r + ahead < prefetch_rows) {
      const auto* next = reinterpret_cast<const char*>(s + (r + ahead) * stride);
      for (int64_t b = 0; b < row_bytes; b += 64) PrefetchL2(next + b);
    }
    if (element == KvElement::Bf16) {
      Widen16<KvElement::Bf16>(s + r * stride, d, out + r * d);
    } else {
      Widen16<KvElement::F16>(s + r * stride, d, out + r * d);
    }
  }
}

}  // namespace kv
}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#endif  // include guard
