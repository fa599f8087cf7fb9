// SPDX-License-Identifier: Apache-2.0
// `--activation-precision auto` by measurement (linear.h probe_activation_precision).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/prepare/repack.h"

namespace fp4serve::kernels {
namespace {

// Decode rows (one pass over the weights), a server's decode step of 9–32 streams, and prefill-sized blocks.
constexpr int64_t kDecodeRows = 4, kStepRows = 16, kBatchedRows = 64;
constexpr int kRounds = 3;
constexpr double kInt8Margin = 0.8;

prepare::PreparedLinear probe_layer(int64_t n, int64_t k) {
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k / 2));
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  // E4M3 block scales 0x30…0x3F (0.5 … 1.875): finite, never NaN.
  std::vector<uint8_t> scales(static_cast<size_t>(n * k / 16));
  for (auto& b : scales) b = static_cast<uint8_t>(0x30 + rng() % 16);
  const core::TensorView packed{core::DType::U8, {n, k / 2},
                                std::as_bytes(std::span<const uint8_t>(codes))};
  const core::TensorView scale{core::DType::F8_E4M3, {n, k / 16},
                               std::as_bytes(std::span<const uint8_t>(scales))};
  return prepare::prepare_nvfp4(packed, scale, 448.f * 6.f, quant::GlobalScaleConvention::Divisor, "probe");
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU seconds of all threads per call, not wall time: on a shared machine a descheduled OpenMP thread makes a
// call's wall time a scheduler time slice (≈ 10 ms against 50 µs of work, seen on a loaded 2-core VM), which CPU
// time does not count. A sample runs calls until kMinSampleSeconds of CPU time have passed: Linux adds another
// thread's run time to the process clock when that thread sleeps or at a scheduler tick, so a single short call
// can be counted without part of its workers' time.
constexpr double kMinSampleSeconds = 0.02;
double seconds_per_call(const prepare::PreparedLinear& w, const std::vector<float>& x, int64_t m,
                        std::vector<float>& y) {
  const double t0 = process_cpu_seconds();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    linear(w, x.data(), m, y.data());
    ++calls;
    elapsed = process_cpu_seconds() - t0;
  } while (elapsed < kMinSampleSeconds);
  return elapsed / static_cast<double>(calls);
}

}  // namespace

double PrecisionProbe::int8_ratio() const {
  return std::sqrt(int8_step_s / bf16_step_s * (int8_batched_s / bf16_batched_s));
}

PrecisionProbe probe_activation_precision(int64_t out_features, int64_t in_features) {
  PrecisionProbe probe;
  if (int8_one_pass_rows() == 0 || !bf16_dot_active()) return probe;  // one of the two has no fast kernel here
  // NVFP4 needs K a multiple of 16; a tiny model's layer is measured at least 256 × 256 (timer resolution).
  const int64_t n = std::max<int64_t>(out_features, 256);
  const int64_t k = std::max<int64_t>((in_features + 15) / 16 * 16, 256);
  prepare::PreparedLinear bf16 = probe_layer(n, k);
  prepare::PreparedLinear int8 = bf16.clone();
  bf16.activation_precision = prepare::ActivationPrecision::Bf16;
  int8.activation_precision = prepare::ActivationPrecision::Int8;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(kBatchedRows * k));
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(kBatchedRows * n));
  // One untimed call each first (page faults, the int8 kernel's scratch).
  seconds_per_call(bf16, x, kBatchedRows, y);
  seconds_per_call(int8, x, kBatchedRows, y);
  double best[6];
  std::fill(std::begin(best), std::end(best), std::numeric_limits<double>::infinity());
  for (int round = 0; round < kRounds; ++round) {
    best[0] = std::min(best[0], seconds_per_call(bf16, x, kDecodeRows, y));
    best[1] = std::min(best[1], seconds_per_call(int8, x, kDecodeRows, y));
    best[2] = std::min(best[2], seconds_per_call(bf16, x, kStepRows, y));
    best[3] = std::min(best[3], seconds_per_call(int8, x, kStepRows, y));
    best[4] = std::min(best[4], seconds_per_call(bf16, x, kBatchedRows, y));
    best[5] = std::min(best[5], seconds_per_call(int8, x, kBatchedRows, y));
  }
  probe.bf16_decode_s = best[0];
  probe.int8_decode_s = best[1];
  probe.bf16_step_s = best[2];
  probe.int8_step_s = best[3];
  probe.bf16_batched_s = best[4];
  probe.int8_batched_s = best[5];
  probe.measured = true;
  probe.out_features = n;
  probe.in_features = k;
  probe.choice = probe.int8_ratio() <= kInt8Margin ? prepare::ActivationPrecision::Bf16DecodeInt8
                                                   : prepare::ActivationPrecision::Bf16;
  return probe;
}

}  // namespace fp4serve::kernels
