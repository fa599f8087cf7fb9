// SPDX-License-Identifier: Apache-2.0
// Highway implementations of the inner loops declared in cpu/simd.h. Highway's foreach_target.h re-includes
// this file once per instruction set compiled in (HWY_TARGET_INCLUDE); each pass defines the functions in its
// own namespace (N_AVX2, N_SSE4, …) and the HWY_ONCE section at the bottom exports one dispatcher per
// function, which picks the best target the running CPU supports on first call.
// Every loop processes whole vectors and finishes the remainder with the same formula in scalar code, so any
// length works (odd head dims, odd intermediate sizes).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/kernels/simd_ops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "backends/cpu/kernels/gemm_micro-inl.h"
#include "backends/cpu/kernels/kv_paging.h"
#include "backends/cpu/kernels/kv_rows-inl.h"
#include "backends/cpu/kernels/simd.h"
#include "quant/formats.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
#if FP4SERVE_PANEL_TARGET
namespace micro = fp4serve::kernels::HWY_NAMESPACE::micro;
#endif
namespace kv = fp4serve::kernels::HWY_NAMESPACE::kv;

// Two accumulators hide the FMA latency for head dims of 64–128 without spilling on 16-register AVX2.
inline float dot_inline(DF d, const float* a, const float* b, int64_t n) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc0 = hn::Zero(d);
  auto acc1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes), acc1);
  }
  for (; i + lanes <= n; i += lanes) acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy_inline(DF d, float alpha, const float* x, int64_t n, float* y) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

inline float max_inline(DF d, const float* x, int64_t n) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= lanes) {
    auto vm = hn::LoadU(d, x);
    for (i = lanes; i + lanes <= n; i += lanes) vm = hn::Max(vm, hn::LoadU(d, x + i));
    m = hn::GetLane(hn::MaxOfLanes(d, vm));
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

inline float exp_shifted_sum_inline(DF d, float* x, int64_t n, float shift) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, shift);
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vs));
    hn::StoreU(e, d, x + i);
    acc = hn::Add(acc, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

float SumSquaresImpl(const float* x, int64_t n) { return dot_inline(DF(), x, x, n); }

void ScaleByWeightImpl(const float* x, const float* weight, float r, int64_t n, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vr = hn::Set(d, r);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(d, weight + i), hn::Mul(hn::LoadU(d, x + i), vr)), d, out + i);
  }
  for (; i < n; ++i) out[i] = weight[i] * (x[i] * r);
}

float ExpShiftedSumImpl(float* x, int64_t n, float shift) { return exp_shifted_sum_inline(DF(), x, n, shift); }

float MaxValueImpl(const float* x, int64_t n) { return max_inline(DF(), x, n); }

double ExpSumImpl(const float* x, int64_t n, float shift) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, shift);
  // fp32 lane sums over blocks of kBlock elements, blocks summed in float64: the error of a 50k-element sum stays
  // at a few fp32 ulps instead of growing with n / lanes.
  constexpr int64_t kBlock = 1024;
  double total = 0.0;
  int64_t i = 0;
  while (i + lanes <= n) {
    const int64_t block_end = std::min(n, i + kBlock);
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
    for (; i + 2 * lanes <= block_end; i += 2 * lanes) {
      acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vs)));
      acc1 = hn::Add(acc1, hn::Exp(d, hn::Sub(hn::LoadU(d, x + i + lanes), vs)));
    }
    for (; i + lanes <= block_end; i += lanes) acc0 = hn::Add(acc0, hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vs)));
    total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1))));
  }
  for (; i < n; ++i) total += static_cast<double>(std::exp(x[i] - shift));
  return total;
}

// sigmoid(a·g) as 1 / (1 + e^(−a·g)); e^(−a·g) overflows to +inf for a·g < −88, giving the correct limit 0.
template <class V>
inline V sigmoid_vec(DF d, V ag) {
  const auto one = hn::Set(d, 1.0f);
  // Highway Exp is valid up to +104 only; clamp the argument where e^x is already +inf in fp32.
  const auto arg = hn::Min(hn::Neg(ag), hn::Set(d, 88.5f));
  return hn::Div(one, hn::Add(one, hn::Exp(d, arg)));
}

inline float sigmoid_scalar(float ag) { return 1.0f / (1.0f + std::exp(-ag)); }

void SiluMulImpl(const float* gate, const float* up, int64_t n, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, gate + i);
    hn::StoreU(hn::Mul(hn::Mul(g, sigmoid_vec(d, g)), hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] * sigmoid_scalar(gate[i]) * up[i];
}

void SwigluOaiMulImpl(const float* gate, const float* up, int64_t n, float alpha, float limit, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  const auto hi = hn::Set(d, limit);
  const auto lo = hn::Set(d, -limit);
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::Min(hn::LoadU(d, gate + i), hi);
    const auto u = hn::Min(hn::Max(hn::LoadU(d, up + i), lo), hi);
    const auto glu = hn::Mul(g, sigmoid_vec(d, hn::Mul(va, g)));
    hn::StoreU(hn::Mul(hn::Add(u, one), glu), d, out + i);
  }
  for (; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = (u + 1.0f) * (g * sigmoid_scalar(alpha * g));
  }
}

void fwht_scalar(float* x, int64_t n, int64_t block, float scale) {
  for (int64_t base = 0; base < n; base += block) {
    float* b = x + base;
    for (int64_t h = 1; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float u = b[j];
          const float w = b[j + h];
          b[j] = u + w;
          b[j + h] = u - w;
        }
      }
    }
    for (int64_t j = 0; j < block; ++j) b[j] *= scale;
  }
}

// Butterfly strides below the vector width pair lanes i and i^h inside one register: the new lane is
// perm(x) + sign·x with perm swapping i and i^h and sign = +1 where bit h of i is clear, −1 where set.
// Strides of a vector or more are plain add/sub between registers. The stages commute, so the in-register
// ones (with the final scale) run first in one pass and the cross-register ones after. A block narrower than a
// vector (the p = 4 / 8 factors of a Kronecker-Hadamard transform) runs only its own strides in each register;
// whole vectors of its blocks go through the registers, a tail of fewer blocks through the scalar loop.
void FwhtImpl(float* x, int64_t n, int64_t block, float scale) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kMaxLanes = 64;
  if (lanes < 2 || lanes > kMaxLanes || (block < lanes && n < lanes)) {
    fwht_scalar(x, n, block, scale);
    return;
  }
  const int64_t in_register = std::min(lanes, block);
  const int64_t vector_end = n - n % lanes;  // n when block ≥ lanes (n is a multiple of block; both powers of two)
  int32_t idx[6][kMaxLanes];  // lanes ≤ 64 → at most 6 in-register stages
  float sign[6][kMaxLanes];
  int stages = 0;
  for (int64_t h = 1; h < in_register; h *= 2, ++stages) {
    for (int64_t i = 0; i < lanes; ++i) {
      idx[stages][i] = static_cast<int32_t>(i ^ h);
      sign[stages][i] = (i & h) ? -1.0f : 1.0f;
    }
  }
  const auto vscale = hn::Set(d, scale);
#if HWY_HAVE_SCALABLE
  // SVE vectors are sizeless and cannot form arrays: each stage's tables are loaded where they are used.
  for (int64_t i = 0; i < vector_end; i += lanes) {
    auto v = hn::LoadU(d, x + i);
    for (int s = 0; s < stages; ++s) {
      v = hn::MulAdd(hn::LoadU(d, sign[s]), v, hn::TableLookupLanes(v, hn::SetTableIndices(d, idx[s])));
    }
    hn::StoreU(hn::Mul(v, vscale), d, x + i);
  }
#else
  using VF = hn::Vec<DF>;
  using IF = decltype(hn::SetTableIndices(d, static_cast<const int32_t*>(nullptr)));
  IF perms[6];
  VF signs[6];
  for (int s = 0; s < stages; ++s) {
    perms[s] = hn::SetTableIndices(d, idx[s]);
    signs[s] = hn::LoadU(d, sign[s]);
  }
  for (int64_t i = 0; i < vector_end; i += lanes) {
    auto v = hn::LoadU(d, x + i);
    for (int s = 0; s < stages; ++s) v = hn::MulAdd(signs[s], v, hn::TableLookupLanes(v, perms[s]));
    hn::StoreU(hn::Mul(v, vscale), d, x + i);
  }
#endif
  if (vector_end < n) fwht_scalar(x + vector_end, n - vector_end, block, scale);
  for (int64_t base = 0; base < n; base += block) {
    float* b = x + base;
    for (int64_t h = lanes; h < block; h *= 2) {
      for (int64_t i = 0; i < block; i += 2 * h) {
        for (int64_t j = i; j < i + h; j += lanes) {
          const auto u = hn::LoadU(d, b + j);
          const auto w = hn::LoadU(d, b + j + h);
          hn::StoreU(hn::Add(u, w), d, b + j);
          hn::StoreU(hn::Sub(u, w), d, b + j + h);
        }
      }
    }
  }
}

// Row-vector times matrix as a sum of scaled matrix rows (contiguous reads of M), one block at a time.
void RotateBlocksImpl(float* x, int64_t n, const float* matrix, int64_t block, float* acc) {
  const DF d;
  for (int64_t base = 0; base < n; base += block) {
    float* xb = x + base;
    std::fill(acc, acc + block, 0.0f);
    for (int64_t i = 0; i < block; ++i) axpy_inline(d, xb[i], matrix + i * block, block, acc);
    std::copy(acc, acc + block, xb);
  }
}

// Cache rows of one KV head are `stride` floats apart (usually a full [KVH, D] row, 1–8 KiB), so each row sits
// in a different 4 KiB page where the hardware streamer does not follow; without software prefetch decode ran
// latency-bound at ~2–3 GB/s. Fetch the row this many iterations ahead, every 64-byte line of it.
constexpr int64_t kPrefetchRows = 6;

inline void prefetch_row(const float* row, int64_t d) {
  for (int64_t e = 0; e < d; e += 16) hwy::Prefetch(row + e);
}

#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)
// Keys per block of ScoresByKeyBlocks: one per lane.
constexpr int kBlockKeys = HWY_TARGET == HWY_AVX2 ? 8 : 16;
using VF = hn::Vec<DF>;

// a[j] holds the lane-wise partial sums of key j's dot product; returns the totals, lane j = key j. Pairs, then
// quads of keys are merged within 128-bit blocks, then the blocks: 45 instructions for 16 keys on AVX-512 (21 for
// 8 on AVX2), where a horizontal sum per key took ~9 (~6).
HWY_INLINE VF SumsOfKeys(const VF (&a)[kBlockKeys]) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  // Highway's interleaves work per 128-bit block (vunpcklps / vunpcklpd), the same on both targets.
  VF t[kBlockKeys / 2];
  for (int i = 0; i < kBlockKeys / 2; ++i) {  // per block [a0+a2, b0+b2, a1+a3, b1+b3] for keys a = 2i, b = 2i + 1
    t[i] = hn::Add(hn::InterleaveLower(df, a[2 * i], a[2 * i + 1]), hn::InterleaveUpper(df, a[2 * i], a[2 * i + 1]));
  }
  VF u[kBlockKeys / 4];
  for (int i = 0; i < kBlockKeys / 4; ++i) {  // per block the block's partial of keys 4i … 4i + 3
    const auto x = hn::BitCast(dd, t[2 * i]), y = hn::BitCast(dd, t[2 * i + 1]);
    u[i] = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, x, y)), hn::BitCast(df, hn::InterleaveUpper(dd, x, y)));
  }
  // Then across blocks, which has no per-target-neutral form.
#if HWY_TARGET == HWY_AVX2
  return VF{_mm256_add_ps(_mm256_permute2f128_ps(u[0].raw, u[1].raw, 0x20), _mm256_permute2f128_ps(u[0].raw, u[1].raw, 0x31))};
#else
  // w0 blocks: u0 (b0 + b2), u0 (b1 + b3), u1 (b0 + b2), u1 (b1 + b3); w1 the same for u2, u3.
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0].raw, u[1].raw, 0x44), _mm512_shuffle_f32x4(u[0].raw, u[1].raw, 0xEE));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2].raw, u[3].raw, 0x44), _mm512_shuffle_f32x4(u[2].raw, u[3].raw, 0xEE));
  return VF{_mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD))};
#endif
}

// scores[g · ld + j] = scale · q_g · k_j for j in [0, n − n % kBlockKeys), key j's row at k + j · stride: a block
// of keys at a time, the group's query held in registers one head at a time (the block's key rows stay in L1 across
// the heads), the next block's rows prefetched when `prefetch`. Returns the keys done (0 when d is not a multiple
// of the lanes).
HWY_INLINE int64_t ScoresByKeyBlocks(const float* q, int64_t group, int64_t d, const float* k, int64_t stride,
                                     int64_t n, float scale, float* scores, int64_t ld, bool prefetch) {
  const DF df;
  constexpr int64_t kB = kBlockKeys;
  if (d % kB != 0) return 0;
  const auto vscale = hn::Set(df, scale);
  int64_t j0 = 0;
  if (prefetch) {
    for (int64_t j = 0; j < std::min(kB, n); ++j) prefetch_row(k + j * stride, d);
  }
  for (; j0 + kB <= n; j0 += kB) {
    if (prefetch) {
      for (int64_t j = j0 + kB; j < std::min(j0 + 2 * kB, n); ++j) prefetch_row(k + j * stride, d);  // next block
    }
    const float* k0 = k + j0 * stride;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * d;
      VF acc[kB];
      for (auto& v : acc) v = hn::Zero(df);
      for (int64_t c = 0; c < d; c += kB) {
        const VF qc = hn::LoadU(df, qg + c);
        for (int64_t j = 0; j < kB; ++j) acc[j] = hn::MulAdd(qc, hn::LoadU(df, k0 + j * stride + c), acc[j]);
      }
      hn::StoreU(hn::Mul(SumsOfKeys(acc), vscale), df, scores + g * ld + j0);
    }
  }
  return j0;
}
#endif

// scores[g · ld + j] = scale · q_g · k_j for keys j in [0, n), key j's row at k + j · stride (fp32).
HWY_INLINE void ScoreKeys(const float* q, int64_t group, int64_t d, const float* k, int64_t stride, int64_t n,
                          float scale, float* scores, int64_t ld, bool prefetch) {
  const DF df;
  int64_t j_done = 0;
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)
  j_done = ScoresByKeyBlocks(q, group, d, k, stride, n, scale, scores, ld, prefetch);
#endif
  for (int64_t j = j_done; j < n; ++j) {
    const float* kj = k + j * stride;
    if (prefetch && j + kPrefetchRows < n) prefetch_row(kj + kPrefetchRows * stride, d);
    for (int64_t g = 0; g < group; ++g) scores[g * ld + j] = dot_inline(df, q + g * d, kj, d) * scale;
  }
}

// out[g] += Σ_j scores[g · ld + j] · v_j over keys j in [0, n), value j's row at v + j · stride (fp32).
HWY_INLINE void AccumulateValues(const float* scores, int64_t ld, int64_t group, int64_t d, const float* v,
                                 int64_t stride, int64_t n, float* out, bool prefetch) {
  const DF df;
#if FP4SERVE_PANEL_TARGET
  if (hn::Lanes(micro::DF()) == static_cast<size_t>(micro::kLanes)) {
    // out[g][e0, e0 + kNR) += P[g][block] · V[block][e0, e0 + kNR) on the GEMM micro-kernel: the group's output
    // stays in registers across a block of keys instead of one load and store per key, head and vector (axpy).
    // Each block prefetches the next block's value rows first (rows of one KV head are a page apart: see
    // kPrefetchRows).
    using micro::kMR;
    using micro::kNR;
    const int64_t e_tail = d / kNR * kNR;  // columns from here on go through axpy
    constexpr int64_t kKeyBlock = 64;
    if (prefetch) {
      for (int64_t j = 0; j < std::min(n, kKeyBlock); ++j) prefetch_row(v + j * stride, d);
    }
    for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
      const int64_t keys = std::min(kKeyBlock, n - j0);
      if (prefetch) {
        for (int64_t j = j0 + keys; j < std::min(n, j0 + keys + kKeyBlock); ++j) prefetch_row(v + j * stride, d);
      }
      const float* v0 = v + j0 * stride;
      for (int64_t e0 = 0; e0 < e_tail; e0 += kNR) {
        for (int64_t g0 = 0; g0 < group; g0 += kMR) {
          micro::MicroDispatch(static_cast<int>(std::min(kMR, group - g0)), scores + g0 * ld + j0, ld, v0 + e0, stride,
                               keys, out + g0 * d + e0, d, /*load_c=*/true);
        }
      }
      for (int64_t j = j0; e_tail < d && j < j0 + keys; ++j) {
        for (int64_t g = 0; g < group; ++g) {
          axpy_inline(df, scores[g * ld + j], v + j * stride + e_tail, d - e_tail, out + g * d + e_tail);
        }
      }
    }
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * stride;
    if (prefetch && j + kPrefetchRows < n) prefetch_row(vj + kPrefetchRows * stride, d);
    for (int64_t g = 0; g < group; ++g) axpy_inline(df, scores[g * ld + j], vj, d, out + g * d);
  }
}

// Keys of a 16-bit cache widened to fp32 at a time: 16 KiB of rows (a multiple of the 16-key score blocks), which
// stay in L1 from the widening to their use.
inline int64_t WidenedChunkKeys(int64_t d) { return std::max<int64_t>(16, 4096 / d / 16 * 16); }

// Scores for every (head, key) first so each key row is read once for the whole group (decode is bound by
// reading the KV cache), then one softmax per head, then the value sum, again one pass over the value rows.
// An fp32 cache is read in place; a 16-bit one is widened a chunk of rows at a time into an fp32 scratch. A paged
// cache is read one block's run of rows at a time (kv_paging.h), a contiguous one as a single run.
void AttendGroupImpl(const float* q, int64_t group, int64_t d, const KvRows& cache, int64_t kv_head, int64_t lo,
                     int64_t hi, float scale, const float* sinks, float* scores, float* out, float* partial) {
  const DF df;
  const int64_t len = hi - lo + 1;
  const KvElement element = cache.element;
  const int64_t stride = cache.row_stride;
  const bool in_place = element == KvElement::F32;
  const int64_t chunk = WidenedChunkKeys(d);
  static thread_local hwy::AlignedFreeUniquePtr<float[]> widened_buf;
  static thread_local int64_t widened_cap = 0;
  if (!in_place && widened_cap < chunk * d) {
    widened_buf = hwy::AllocateAligned<float>(static_cast<size_t>(chunk * d));
    widened_cap = chunk * d;
  }
  float* widened = widened_buf.get();
  // A paged cache's next blocks are requested while one is read (in_place or not); a contiguous one's rows are
  // prefetched inside its single run.
  const bool paged = cache.block_table != nullptr;
  const int64_t ahead = kv::WidenAheadRows(d);
  KvRunPrefetcher key_ahead(cache, cache.keys, kv_head, d, hi, ahead);
  KvRunPrefetcher value_ahead(cache, cache.values, kv_head, d, hi, ahead);
  for_each_kv_run(cache, kv_head, lo, hi, [&](int64_t r0, int64_t run, const std::byte* k, const std::byte*) {
    if (paged) key_ahead.through(lo, lo + r0 + run);
    if (in_place) {
      ScoreKeys(q, group, d, reinterpret_cast<const float*>(k), stride, run, scale, scores + r0, len, true);
      return;
    }
    const auto* k16 = reinterpret_cast<const uint16_t*>(k);
    if (!paged) kv::PrefetchFirstRows(k16, stride, run, d);
    for (int64_t j0 = 0; j0 < run; j0 += chunk) {
      const int64_t n = std::min(chunk, run - j0);
      kv::WidenRows(k16 + j0 * stride, element, stride, n, run - j0, d, widened);
      ScoreKeys(q, group, d, widened, d, n, scale, scores + r0 + j0, len, false);
    }
  });
  // The first values, arriving during the softmax.
  if (paged) {
    value_ahead.through(lo, lo);
  } else if (!in_place) {
    kv::PrefetchFirstRows(static_cast<const uint16_t*>(cache.values) + kv_offset(cache, kv_head, lo), stride, len, d);
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * len;
    float m = max_inline(df, s, len);
    if (partial != nullptr) {
      partial[2 * g] = m;
      partial[2 * g + 1] = exp_shifted_sum_inline(df, s, len, m);
      continue;
    }
    // The sink joins the max and the denominator only (GPT-OSS: an extra logit whose probability is dropped).
    if (sinks != nullptr) m = std::max(m, sinks[g]);
    float sum = exp_shifted_sum_inline(df, s, len, m);
    if (sinks != nullptr) sum += std::exp(sinks[g] - m);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < len; ++j) s[j] *= inv;
  }
  std::fill(out, out + group * d, 0.0f);
  for_each_kv_run(cache, kv_head, lo, hi, [&](int64_t r0, int64_t run, const std::byte*, const std::byte* v) {
    if (paged) value_ahead.through(lo, lo + r0 + run);
    if (in_place) {
      AccumulateValues(scores + r0, len, group, d, reinterpret_cast<const float*>(v), stride, run, out, true);
      return;
    }
    const auto* v16 = reinterpret_cast<const uint16_t*>(v);
    for (int64_t j0 = 0; j0 < run; j0 += chunk) {
      const int64_t n = std::min(chunk, run - j0);
      kv::WidenRows(v16 + j0 * stride, element, stride, n, run - j0, d, widened);
      AccumulateValues(scores + r0 + j0, len, group, d, widened, d, n, out, false);
    }
  });
}

// dst = src as `element`s, rounded to nearest even: the KV cache writer. bf16 by integer rounding on every target
// (Highway's DemoteTo truncates); fp16 by the F16C conversion (vcvtps2ph, nearest even, overflow to ±inf) on x86,
// quant::float_to_f16 elsewhere and for the tail.
void StoreKvRowImpl(const float* src, int64_t n, KvElement element, void* dst) {
  if (element == KvElement::F32) {
    std::copy(src, src + n, static_cast<float*>(dst));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (element == KvElement::Bf16) {
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<uint16_t, DF> du16;
    const auto one = hn::Set(di, 1), bias = hn::Set(di, 0x7FFF), quiet = hn::Set(di, 0x40);
    const auto abs_mask = hn::Set(di, 0x7FFFFFFF), inf_bits = hn::Set(di, 0x7F800000);
    for (; i + lanes <= n; i += lanes) {
      const auto u = hn::BitCast(di, hn::LoadU(df, src + i));
      const auto high = hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<DF>(), u));  // logical shift
      const auto high_i = hn::BitCast(di, high);
      // u + 0x7FFF + lowest kept bit, then the upper half (wraps like the scalar uint32 sum for |x| near max).
      const auto sum = hn::BitCast(hn::RebindToUnsigned<DF>(), hn::Add(hn::Add(u, bias), hn::And(high_i, one)));
      const auto rounded = hn::BitCast(di, hn::ShiftRight<16>(sum));
      const auto is_nan = hn::Gt(hn::And(u, abs_mask), inf_bits);
      hn::StoreU(hn::DemoteTo(du16, hn::IfThenElse(is_nan, hn::Or(high_i, quiet), rounded)), du16, out + i);
    }
    for (; i < n; ++i) out[i] = quant::float_to_bf16(src[i]);
    return;
  }
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2)
  const hn::Rebind<hwy::float16_t, DF> dh;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, reinterpret_cast<hwy::float16_t*>(out + i));
  }
#endif
  for (; i < n; ++i) out[i] = quant::float_to_f16(src[i]);
}

}  // namespace fp4serve::kernels::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::kernels::cpu {

HWY_EXPORT(SumSquaresImpl);
HWY_EXPORT(ScaleByWeightImpl);
HWY_EXPORT(ExpShiftedSumImpl);
HWY_EXPORT(MaxValueImpl);
HWY_EXPORT(ExpSumImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(SwigluOaiMulImpl);
HWY_EXPORT(FwhtImpl);
HWY_EXPORT(AttendGroupImpl);
HWY_EXPORT(RotateBlocksImpl);
HWY_EXPORT(StoreKvRowImpl);

float sum_squares(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumSquaresImpl)(x, n); }
void scale_by_weight(const float* x, const float* weight, float r, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(ScaleByWeightImpl)(x, weight, r, n, out);
}
float exp_shifted_sum(float* x, int64_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(ExpShiftedSumImpl)(x, n, shift);
}
float max_value(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxValueImpl)(x, n); }
double exp_sum(const float* x, int64_t n, float shift) { return HWY_DYNAMIC_DISPATCH(ExpSumImpl)(x, n, shift); }
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, n, out);
}
void swiglu_oai_mul(const float* gate, const float* up, int64_t n, float alpha, float limit, float* out) {
  HWY_DYNAMIC_DISPATCH(SwigluOaiMulImpl)(gate, up, n, alpha, limit, out);
}
void fwht(float* x, int64_t n, int64_t block, float scale) { HWY_DYNAMIC_DISPATCH(FwhtImpl)(x, n, block, scale); }
void rotate_blocks(float* x, int64_t n, const float* matrix, int64_t block, float* scratch) {
  HWY_DYNAMIC_DISPATCH(RotateBlocksImpl)(x, n, matrix, block, scratch);
}
void store_kv_row(const float* src, int64_t n, KvElement element, void* dst) {
  HWY_DYNAMIC_DISPATCH(StoreKvRowImpl)(src, n, element, dst);
}
void attend_group(const float* q, int64_t group, int64_t d, const KvRows& cache, int64_t kv_head, int64_t lo,
                  int64_t hi, float scale, const float* sinks, float* scores, float* out, float* partial) {
  HWY_DYNAMIC_DISPATCH(AttendGroupImpl)(q, group, d, cache, kv_head, lo, hi, scale, sinks, scores, out, partial);
}

}  // namespace fp4serve::kernels::cpu
#endif  // HWY_ONCE
