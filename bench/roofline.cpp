// SPDX-License-Identifier: Apache-2.0
// Compiled per Highway target like the GEMM, so the roofs use the same vector width the kernels get.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "roofline.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
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

}  // namespace HWY_NAMESPACE
}  // namespace fp4serve::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp4serve::bench {
HWY_EXPORT(XorStream);
HWY_EXPORT(FmaChains);

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

double measure_fma_peak(int repeats) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    double flops = 0;
#pragma omp parallel reduction(+ : flops)
    flops += HWY_DYNAMIC_DISPATCH(FmaChains)(20'000'000, static_cast<float>(omp_get_thread_num()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s);
  }
  return best;
}

}  // namespace fp4serve::bench
#endif
