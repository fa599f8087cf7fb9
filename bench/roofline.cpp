// SPDX-License-Identifier: Apache-2.0
// Compiled per Highway target like the GEMM, so the roofs use the same vector width the kernels get.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "roofline.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>

#include "backends/cpu/prepare/prepared_linear.h"
#include "roofline.h"

HWY_BEFORE_NAMESPACE();
namespace fp4serve::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A streaming read: four independent XOR accumulators, the result returned so the loads stay. Integer XOR, not a
// float sum: weight bytes read as floats include subnormals and NaNs, which some CPUs add slowly.
uint32_t XorStream(const uint32_t* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<uint32_t> d;
  const size_t step = 4 * hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (size_t i = 0; i + step <= n; i += step) {
    a0 = hn::Xor(a0, hn::Load(d, p + i));
    a1 = hn::Xor(a1, hn::Load(d, p + i + hn::Lanes(d)));
    a2 = hn::Xor(a2, hn::Load(d, p + i + 2 * hn::Lanes(d)));
    a3 = hn::Xor(a3, hn::Load(d, p + i + 3 * hn::Lanes(d)));
  }
  return hn::GetLane(hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3)));
}

// 12 independent FMA chains (2 FMA ports × 4-cycle latency needs ≥ 8). Returns flops done.
double FmaChains(size_t iters, float seed) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 12;
  hn::Vec<decltype(d)> acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, seed + static_cast<float>(i));
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], a, b);
  }
  auto s = acc[0];
  for (int i = 1; i < kChains; ++i) s = hn::Add(s, acc[i]);
  volatile float sink = hn::GetLane(s);
  (void)sink;
  return 2.0 * kChains * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

#if (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && HWY_COMPILER_GCC_ACTUAL
// The dot-product instructions of the GEMMs (gemm_int8.cpp: vpdpbusd; gemm_simd.cpp / gemm_gemv.cpp: vdpbf16ps),
// added to this section the way those files add them (Highway 1.0 has no target that enables both; a Zen 4 VM
// dispatches to AVX3, whose target lacks AVX512-VNNI, though the CPU has it). Callers check the CPU first.
#pragma GCC push_options
#pragma GCC target("avx512vnni,avx512bf16")

// 12 independent vpdpbusd chains: each instruction does 64 u8·s8 multiply-adds (16 lanes × 4), 128 ops.
double VnniChains(size_t iters, float seed) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(static_cast<int>(seed) + i);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], u, s);
  }
  __m512i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return 128.0 * kChains * static_cast<double>(iters);
}

// 12 independent vdpbf16ps chains: each instruction does 32 bf16 multiply-adds into 16 fp32 lanes, 64 flops.
double Bf16DotChains(size_t iters, float seed) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.998f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(2e-7f));
  for (size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return 64.0 * kChains * static_cast<double>(iters);
}
#pragma GCC pop_options
#else
// No loop for this target: the roof falls back to the FMA peak.
double VnniChains(size_t, float) { return 0; }
double Bf16DotChains(size_t, float) { return 0; }
#endif

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::bench {
HWY_EXPORT(XorStream);
HWY_EXPORT(FmaChains);
HWY_EXPORT(VnniChains);
HWY_EXPORT(Bf16DotChains);

size_t stream_read(const std::byte* p, size_t bytes) {
  const auto* words = reinterpret_cast<const uint32_t*>(p);
  const int threads = omp_get_max_threads();
  // Each thread reads a whole number of 256-word blocks (a multiple of every XorStream step); the tail is left out.
  const size_t share = (bytes / sizeof(uint32_t) / static_cast<size_t>(threads)) & ~size_t{255};
  uint32_t total = 0;
#pragma omp parallel num_threads(threads) reduction(^ : total)
  total ^= HWY_DYNAMIC_DISPATCH(XorStream)(words + static_cast<size_t>(omp_get_thread_num()) * share, share);
  volatile uint32_t sink = total;
  (void)sink;
  return share * static_cast<size_t>(threads) * sizeof(uint32_t);
}

double measure_read_bandwidth(size_t bytes, int repeats) {
  // On transparent huge pages where the kernel allows them, as the weights the GEMV benchmarks read (their copies
  // sit in a prepare::HugePageArena, as the model's do): a probe on 4 KiB pages reads slower than the weights.
  prepare::HugePageArena arena(bytes);
  std::shared_ptr<void> chunk;  // keeps the bytes
  auto* buf = reinterpret_cast<float*>(arena.allocate(bytes, chunk));
  const size_t n = bytes / sizeof(float);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = 1.f;  // first touch by the threads that read it
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t read = stream_read(reinterpret_cast<const std::byte*>(buf), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(read) / s);
  }
  return best;
}

namespace {

using ChainLoop = double (*)(size_t, float);

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Ops/s of `loop` on all engine threads, best of `repeats`; 0 where the loop does nothing on this target. Each
// thread's rate is its ops over its own CPU time, and the threads' rates add up: the rate of the threads while they
// run, which a shared machine's other work does not lower (wall time would count the time slices others take).
double measure_peak(ChainLoop loop, int repeats) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    double rate = 0;
#pragma omp parallel reduction(+ : rate)
    {
      const double t0 = thread_cpu_seconds();
      const double ops = loop(20'000'000, static_cast<float>(omp_get_thread_num()));
      const double s = thread_cpu_seconds() - t0;
      rate += s > 0 ? ops / s : 0;
    }
    if (rate == 0) return 0;
    best = std::max(best, rate);
  }
  return best;
}

}  // namespace

double measure_fma_peak(int repeats) {
  return measure_peak([](size_t iters, float seed) { return HWY_DYNAMIC_DISPATCH(FmaChains)(iters, seed); }, repeats);
}

#if HWY_ARCH_X86 && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
// 4 independent TDPBF16PS chains (tiles 0–3 += tile 4 or 5 · tile 6 or 7, each 16 × 16 × 32 bf16 multiply-adds:
// 16384 ops), as the AMX kernel (gemm_amx.cpp) pairs its tiles. iters / 16 rounds: one instruction takes about as
// long as 16 vector FMAs.
__attribute__((target("amx-tile,amx-bf16"))) static double AmxBf16Chains(size_t iters, float seed) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) uint16_t operand[16][32];
  for (auto& row : operand) std::fill(std::begin(row), std::end(row), static_cast<uint16_t>(0x3F80));  // 1.0
  alignas(64) float out[16][16];
  asm volatile("" ::: "memory");
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  const size_t rounds = iters / 16;
  for (size_t it = 0; it < rounds; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  asm volatile("" ::: "memory");
  volatile float sink = out[0][0] + seed;
  (void)sink;
  return 4.0 * 16384.0 * static_cast<double>(rounds);
}
#endif

ComputeRoofs measure_compute_roofs(int repeats, bool amx) {
  ComputeRoofs roofs;
  roofs.fma = measure_fma_peak(repeats);
#if HWY_ARCH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni")) {
    roofs.int8_dot = measure_peak([](size_t iters, float seed) { return HWY_DYNAMIC_DISPATCH(VnniChains)(iters, seed); }, repeats);
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    roofs.bf16_dot =
        measure_peak([](size_t iters, float seed) { return HWY_DYNAMIC_DISPATCH(Bf16DotChains)(iters, seed); }, repeats);
  }
#endif
#if HWY_ARCH_X86 && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
  if (amx) roofs.amx_bf16 = measure_peak(AmxBf16Chains, repeats);
#else
  (void)amx;
#endif
  return roofs;
}

}  // namespace fp4serve::bench
#endif
