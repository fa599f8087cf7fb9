// SPDX-License-Identifier: Apache-2.0
// The register-blocked fp32 micro-kernel shared by the panel GEMM (gemm_simd.cpp) and the blocked prefill
// attention (attention_prefill.cpp): C[kM × kNR] (+)= X[kM × kc] · P[kc × kNR] with X rows broadcast one element
// at a time and P rows loaded as two vectors (the GotoBLAS / BLIS outer-product order); on AVX-512 with GCC also
// its bf16-pair twin (MicroBf16) for both. Defined on the SIMD
// targets only (FP4SERVE_PANEL_TARGET); EMU128 runs scalar code instead. Re-included once per Highway target
// by foreach_target.h through the including file, hence the toggle guard instead of #pragma once.
#if defined(FP4SERVE_KERNELS_CPU_GEMM_MICRO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP4SERVE_KERNELS_CPU_GEMM_MICRO_INL_H_
#undef FP4SERVE_KERNELS_CPU_GEMM_MICRO_INL_H_
#else
#define FP4SERVE_KERNELS_CPU_GEMM_MICRO_INL_H_
#endif

#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

// True on the targets that have the panel micro-kernel (and so the panel GEMM and the blocked attention).
#ifndef FP4SERVE_PANEL_TARGET
#define FP4SERVE_PANEL_TARGET \
  (HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SSSE3 && HWY_TARGET != HWY_SSE4)
#endif

// True on the targets that also have the bf16-pair micro-kernel (MicroBf16: AVX-512 with GCC, which accepts the
// AVX512-BF16 intrinsics inside a function-level target pragma).
#ifndef FP4SERVE_BF16_MICRO_TARGET
#define FP4SERVE_BF16_MICRO_TARGET \
  ((HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && HWY_COMPILER_GCC_ACTUAL)
#endif

HWY_BEFORE_NAMESPACE();
namespace fp4serve::kernels {
namespace HWY_NAMESPACE {
#if FP4SERVE_PANEL_TARGET
namespace micro {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_HAVE_SCALABLE
// SVE: the vector length is known only at run time, but the panel width must be a compile-time constant, so
// the panel uses 128-bit vectors (every SVE length holds them), full 256-bit ones on SVE_256. Callers check
// hn::Lanes(DF()) == kLanes before using the kernel.
constexpr int64_t kLanes = HWY_TARGET == HWY_SVE_256 ? 8 : 4;
using DF = hn::CappedTag<float, kLanes>;
#else
using DF = hn::CappedTag<float, 16>;             // NEON: 4 lanes, AVX2: 8, AVX-512: 16
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));
#endif
constexpr int64_t kNR = 2 * kLanes;              // panel width (columns of C): two vectors per row of P
constexpr int64_t kMR = kLanes == 16 ? 12 : 6;   // rows of X per call: 2·kMR accumulators fill the register file

// c[i · ldc + 0..kNR) = (load_c ? c[i · ldc + 0..kNR) : 0) + Σ_kk x[i · ldx + kk] · p[kk · ldp + 0..kNR), i < kM.
// No alignment is assumed (c may be the GEMM output itself, p a column offset into transposed keys).
#if HWY_HAVE_SCALABLE
// SVE vectors are sizeless and cannot form arrays: one named accumulator pair per x row (kMR = 6 here); the
// pairs of rows ≥ kM are dead code the compiler drops.
static_assert(kMR == 6, "the SVE micro-kernel names six rows");
#define FP4SERVE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
template <int kM>
HWY_NOINLINE void Micro(const float* HWY_RESTRICT x, int64_t ldx, const float* HWY_RESTRICT p, int64_t ldp, int64_t kc,
                        float* HWY_RESTRICT c, int64_t ldc, bool load_c) {
  const DF d;
#define FP4SERVE_LOAD(i)                                           \
  auto a0_##i = hn::Zero(d), a1_##i = hn::Zero(d);                 \
  if constexpr ((i) < kM) {                                        \
    if (load_c) {                                                  \
      a0_##i = hn::LoadU(d, c + (i) * ldc);                        \
      a1_##i = hn::LoadU(d, c + (i) * ldc + kLanes);               \
    }                                                              \
  }
#define FP4SERVE_FMA(i)                                            \
  if constexpr ((i) < kM) {                                        \
    const auto xi = hn::Set(d, x[(i) * ldx + k]);                  \
    a0_##i = hn::MulAdd(xi, b0, a0_##i);                           \
    a1_##i = hn::MulAdd(xi, b1, a1_##i);                           \
  }
#define FP4SERVE_STORE(i)                                          \
  if constexpr ((i) < kM) {                                        \
    hn::StoreU(a0_##i, d, c + (i) * ldc);                          \
    hn::StoreU(a1_##i, d, c + (i) * ldc + kLanes);                 \
  }
  FP4SERVE_ROWS(FP4SERVE_LOAD)
  for (int64_t k = 0; k < kc; ++k) {
    const auto b0 = hn::LoadU(d, p + k * ldp);
    const auto b1 = hn::LoadU(d, p + k * ldp + kLanes);
    FP4SERVE_ROWS(FP4SERVE_FMA)
  }
  FP4SERVE_ROWS(FP4SERVE_STORE)
#undef FP4SERVE_LOAD
#undef FP4SERVE_FMA
#undef FP4SERVE_STORE
}
#undef FP4SERVE_ROWS
#else
template <int kM>
HWY_NOINLINE void Micro(const float* HWY_RESTRICT x, int64_t ldx, const float* HWY_RESTRICT p, int64_t ldp, int64_t kc,
                        float* HWY_RESTRICT c, int64_t ldc, bool load_c) {
  const DF d;
  hn::Vec<DF> a0[kM], a1[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) {
    a0[i] = load_c ? hn::LoadU(d, c + i * ldc) : hn::Zero(d);
    a1[i] = load_c ? hn::LoadU(d, c + i * ldc + kLanes) : hn::Zero(d);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const auto b0 = hn::LoadU(d, p + k * ldp);
    const auto b1 = hn::LoadU(d, p + k * ldp + kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < kM; ++i) {
      const auto xi = hn::Set(d, x[i * ldx + k]);
      a0[i] = hn::MulAdd(xi, b0, a0[i]);
      a1[i] = hn::MulAdd(xi, b1, a1[i]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) {
    hn::StoreU(a0[i], d, c + i * ldc);
    hn::StoreU(a1[i], d, c + i * ldc + kLanes);
  }
}
#endif

#if FP4SERVE_BF16_MICRO_TARGET
// Highway 1.0 has no AVX512-BF16 target, so these add the instructions; callers run them only where
// bf16_dot_usable() (gemm_shared.h) says the CPU has them.
#pragma GCC push_options
#pragma GCC target("avx512bf16")
// The micro-kernel on bf16 pairs: c[i · ldc + 0..kNR) (+)= Σ_q x[i · ldx + q] · p[q · ldp + 0..kNR) over kc2 pairs q,
// where a 32-bit word holds two bf16 (the even index in its low half) and one vdpbf16ps adds both products of a
// pair into an fp32 lane: the work of two FMAs in Micro.
template <int kM>
HWY_NOINLINE void MicroBf16(const uint32_t* HWY_RESTRICT x, int64_t ldx, const uint32_t* HWY_RESTRICT p, int64_t ldp,
                            int64_t kc2, float* HWY_RESTRICT c, int64_t ldc, bool load_c) {
  __m512 a0[kM], a1[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) {
    a0[i] = load_c ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
    a1[i] = load_c ? _mm512_loadu_ps(c + i * ldc + kLanes) : _mm512_setzero_ps();
  }
  for (int64_t q = 0; q < kc2; ++q) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(p + q * ldp));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(p + q * ldp + kLanes));
#pragma GCC unroll 16
    for (int i = 0; i < kM; ++i) {
      const __m512bh xi = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(x[i * ldx + q])));
      a0[i] = _mm512_dpbf16_ps(a0[i], b0, xi);
      a1[i] = _mm512_dpbf16_ps(a1[i], b1, xi);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) {
    _mm512_storeu_ps(c + i * ldc, a0[i]);
    _mm512_storeu_ps(c + i * ldc + kLanes, a1[i]);
  }
}

// MicroBf16<m> for a run-time m in [1, kMR].
template <int kM = kMR>
HWY_INLINE void MicroBf16Dispatch(int m, const uint32_t* x, int64_t ldx, const uint32_t* p, int64_t ldp, int64_t kc2,
                                  float* c, int64_t ldc, bool load_c) {
  if constexpr (kM > 0) {
    if (m == kM) return MicroBf16<kM>(x, ldx, p, ldp, kc2, c, ldc, load_c);
    return MicroBf16Dispatch<kM - 1>(m, x, ldx, p, ldp, kc2, c, ldc, load_c);
  }
}
#pragma GCC pop_options
#endif  // FP4SERVE_BF16_MICRO_TARGET

// Grows buf to at least `need` elements and returns it: per-thread scratch that persists between calls (OpenMP
// threads persist), for the panels, tiles and converted activations of the GEMM and GEMV kernels.
template <class T>
HWY_INLINE T* Scratch(hwy::AlignedFreeUniquePtr<T[]>& buf, size_t& cap, size_t need) {
  if (cap < need) {
    buf = hwy::AllocateAligned<T>(need);
    cap = need;
  }
  return buf.get();
}

// Micro<m> for a run-time m in [1, kMR].
template <int kM = kMR>
HWY_INLINE void MicroDispatch(int m, const float* x, int64_t ldx, const float* p, int64_t ldp, int64_t kc, float* c,
                              int64_t ldc, bool load_c) {
  if constexpr (kM > 0) {
    if (m == kM) return Micro<kM>(x, ldx, p, ldp, kc, c, ldc, load_c);
    return MicroDispatch<kM - 1>(m, x, ldx, p, ldp, kc, c, ldc, load_c);
  }
}

}  // namespace micro
#endif  // FP4SERVE_PANEL_TARGET
}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::kernels
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
