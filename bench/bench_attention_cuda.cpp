// SPDX-License-Identifier: Apache-2.0
// CUDA decode attention speed: attention() (one block per head and row, keys walked serially) against
// attention_decode() (keys split over blocks, backends/cuda/kernels/ops.h) for `rows` decode rows of `len` keys each,
// in the shapes of SmolLM2-135M (9 heads / 3 KV heads of 64) and Llama-3-8B (32 / 8 of 128). attention() serves one
// sequence per call, so the baseline is `rows` launches; both are timed with CUDA events around a batch of
// launches, median of the benchmark's repetitions. Counters: KV_GBps (K and V bytes read per second) and
// vs_serial (attention() time / this time at the same shape). Before timing, attention_decode is checked once
// against attention() on the same inputs (max |Δ| ≤ 1e-5 · max(1, max |out|)); a mismatch makes the exit status 1.
// Without a GPU it prints a message and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/partition.h"

namespace fp4serve::bench {
namespace {

using kernels::cuda::DeviceBuffer;

struct Shape {
  const char* name;
  int64_t heads, kv_heads, head_dim;
};
constexpr Shape kShapes[] = {{"smollm2", 9, 3, 64}, {"llama8b", 32, 8, 128}};

int g_sms = 0;
std::map<std::tuple<int, int64_t, int64_t>, double> g_serial_seconds;  // (shape, rows, len)

// rows sequences of len keys each, stored one after the other in one cache.
struct Problem {
  int64_t rows, len, stride;
  DeviceBuffer<float> q, k, v, out, workspace;
  DeviceBuffer<int64_t> base;
  DeviceBuffer<int32_t> lens;
  int64_t splits = 1;
};

Problem make_problem(const Shape& s, int64_t rows, int64_t len) {
  Problem p{rows, len, s.kv_heads * s.head_dim, {}, {}, {}, {}, {}, {}, {}, 1};
  // xorshift: fast enough for the 10^8 values of the long caches; values in [-1, 1), never all zero.
  uint64_t state = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(rows * 131 + len);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      x = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
    }
    return DeviceBuffer<float>::from_host(v);
  };
  p.q = random(static_cast<size_t>(rows * s.heads * s.head_dim));
  p.k = random(static_cast<size_t>(rows * len * p.stride));
  p.v = random(static_cast<size_t>(rows * len * p.stride));
  p.out = DeviceBuffer<float>(static_cast<size_t>(rows * s.heads * s.head_dim));
  std::vector<int64_t> base(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) base[static_cast<size_t>(r)] = r * len;
  p.base = DeviceBuffer<int64_t>::from_host(base);
  p.lens = DeviceBuffer<int32_t>::from_host(std::vector<int32_t>(static_cast<size_t>(rows), static_cast<int32_t>(len)));
  p.splits = kernels::cuda::plan_kv_splits(rows, s.heads, len, g_sms);
  p.workspace = DeviceBuffer<float>(static_cast<size_t>(
      kernels::cuda::attention_decode_workspace_floats(rows, s.heads, s.head_dim, p.splits)));
  return p;
}

kernels::cuda::AttentionShape shape_of(const Shape& s) {
  return {s.heads, s.kv_heads, s.head_dim, 1.0f / std::sqrt(static_cast<float>(s.head_dim)), 0, nullptr};
}

void run_serial(const Shape& s, Problem& p, cudaStream_t stream) {
  const int64_t qd = s.heads * s.head_dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    kernels::cuda::attention(p.q.data() + r * qd, 1, p.len - 1, p.k.data() + r * p.len * p.stride,
                             p.v.data() + r * p.len * p.stride, p.stride, shape_of(s), p.out.data() + r * qd, stream);
  }
}

void run_split(const Shape& s, Problem& p, cudaStream_t stream) {
  const kernels::cuda::DecodeAttentionBatch batch{p.q.data(), p.k.data(), p.v.data(), p.stride, p.base.data(),
                                                  p.lens.data(), p.rows, p.len};
  kernels::cuda::attention_decode(batch, shape_of(s), p.splits, p.workspace.data(),
                                  static_cast<int64_t>(p.workspace.size()), p.out.data(), stream);
}

// attention_decode against attention() on the same inputs; returns max |Δ| / max(1, max |out|).
double verify(const Shape& s, int64_t rows, int64_t len) {
  Problem p = make_problem(s, rows, len);
  kernels::cuda::Stream stream;
  run_serial(s, p, stream.get());
  stream.sync();
  const std::vector<float> want = p.out.download();
  FP4SERVE_CUDA_CHECK(cudaMemset(p.out.data(), 0xFF, p.out.bytes()));
  run_split(s, p, stream.get());
  stream.sync();
  const std::vector<float> got = p.out.download();
  double scale = 1.0, worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst / scale;
}

void bm_attention(benchmark::State& state, int shape, bool split, int64_t rows, int64_t len) {
  const Shape& s = kShapes[shape];
  Problem p = make_problem(s, rows, len);
  kernels::cuda::Stream stream;
  cudaEvent_t start, stop;
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&start));
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&stop));
  auto batch = [&](int reps) {
    FP4SERVE_CUDA_CHECK(cudaEventRecord(start, stream.get()));
    for (int i = 0; i < reps; ++i) split ? run_split(s, p, stream.get()) : run_serial(s, p, stream.get());
    FP4SERVE_CUDA_CHECK(cudaEventRecord(stop, stream.get()));
    FP4SERVE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FP4SERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1e-3 / reps;
  };
  const double estimate = batch(2);  // warm-up
  const int reps = static_cast<int>(std::clamp(0.01 / std::max(estimate, 1e-7), 3.0, 200.0));
  double seconds = 0;
  for (auto _ : state) {
    seconds = batch(reps);
    state.SetIterationTime(seconds);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  state.counters["KV_GBps"] = 2.0 * static_cast<double>(rows * len * p.stride) * 4 / seconds * 1e-9;
  state.counters["splits"] = static_cast<double>(split ? p.splits : 1);
  if (!split) {
    g_serial_seconds[{shape, rows, len}] = seconds;
  } else if (auto it = g_serial_seconds.find({shape, rows, len}); it != g_serial_seconds.end()) {
    state.counters["vs_serial"] = it->second / seconds;
  }
}

}  // namespace
}  // namespace fp4serve::bench

int main(int argc, char** argv) {
  using namespace fp4serve::bench;
  const auto device = fp4serve::kernels::cuda::cuda_device(0);
  if (!device) {
    std::printf("bench_attention_cuda: no CUDA device (cudaGetDeviceCount failed or returned 0); nothing to measure\n");
    return 0;
  }
  g_sms = device->multiprocessors;
  int status = 0;
  for (int shape = 0; shape < 2; ++shape) {
    for (const auto& [rows, len] : {std::pair<int64_t, int64_t>{1, 4097}, {5, 777}}) {
      const double worst = verify(kShapes[shape], rows, len);
      const bool ok = worst <= 1e-5;
      std::printf("verify %s rows %lld len %lld: max |split - serial| / max|out| = %.3g %s\n", kShapes[shape].name,
                  static_cast<long long>(rows), static_cast<long long>(len), worst, ok ? "ok" : "FAIL");
      if (!ok) status = 1;
    }
  }
  for (int shape = 0; shape < 2; ++shape) {
    for (const int64_t rows : {1, 16}) {
      for (const int64_t len : {int64_t{512}, int64_t{4096}, rows == 1 ? int64_t{32768} : int64_t{0}}) {
        if (len == 0) continue;
        for (const bool split : {false, true}) {
          const std::string name = std::string(split ? "attention_decode/" : "attention_serial/") +
                                   kShapes[shape].name + "/rows" + std::to_string(rows) + "/len" + std::to_string(len);
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) { bm_attention(st, shape, split, rows, len); })
              ->UseManualTime()
              ->Iterations(5)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return status;
}
