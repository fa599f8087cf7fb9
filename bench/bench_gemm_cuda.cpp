// SPDX-License-Identifier: Apache-2.0
// CUDA GEMM speed: y[M, N] = x[M, K]·W[N, K]ᵀ for the weight-only NVFP4 and MXFP4 kernels (backends/cuda/kernels/
// gemm_fp4.cu) and cuBLAS bf16, M ∈ {1, 4, 16, 64, 256, 4096} × (N, K) ∈ {4096×4096, 8192×8192, 28672×8192}.
// Timed with CUDA events around a batch of launches on one stream, replayed as a CUDA graph (counter graph = 1;
// plain launches when capture fails), manual time = seconds per launch. Weights
// rotate through copies totalling ≥ 2× L2 so that small M reads them from HBM. Counters:
//   weight_GBps   weight bytes (codes + scales + global scales, or bf16) per second;
//   copy_ratio    weight_GBps / the device-to-device copy bandwidth measured at start-up in this process
//                 (cudaMemcpyAsync of 1 GiB, bytes read + written per second);
//   vs_cublas     cuBLAS bf16 time / this kernel's time at the same shape and M (cuBLAS runs first).
// Weight bytes are constant patterns (valid E4M3 / E8M0 scales): the kernels' speed does not depend on values.
// Before timing, each FP4 kernel path (M = 1, 16: decode; 64: tiled split over K; 256: tiled) is verified once
// at 4096×4096 on random checkpoint tensors (tests/quant/checkpoint_tensors.h, uploaded through the real
// upload_linear) against a float64 reference on the host, with the bound of tests/backends/cuda/kernels/
// linear_cuda_test.cpp; a failure makes the exit status 1. After the runs a table gives, per shape and M, the
// time of each kind, its copy_ratio and vs_cublas (all measured in this process).
// Without a GPU it prints a message and exits 0. A full run takes well under 90 s on an H200.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/gpu_layout.h"
#include "backends/cuda/kernels/linear_cuda.h"
#include "quant/checkpoint_tensors.h"
#include "quant/linear_weights.h"
#include "quant/block_format.h"
#include "quant/formats.h"

namespace fp4serve::bench {
namespace {

using kernels::cuda::bf16;
using kernels::cuda::DeviceBuffer;
using kernels::cuda::DeviceLinear;
using kernels::cuda::Stream;
using quant::WeightEncoding;

enum class Kind { Cublas, Nvfp4, Mxfp4 };
constexpr const char* kKindNames[] = {"cublas_bf16", "nvfp4", "mxfp4"};

double g_copy_bytes_per_s = 0;
int64_t g_l2_bytes = 0;
std::map<std::tuple<int64_t, int64_t, int64_t>, double> g_cublas_seconds;  // (N, K, M) → seconds per launch
struct Result {
  double seconds = 0, copy_ratio = 0, vs_cublas = 0;
};
std::map<std::tuple<int64_t, int64_t, int64_t, int>, Result> g_results;  // (N, K, M, kind)

// One FP4 layer of random checkpoint tensors through the real repack and upload, y = x·Wᵀ on the GPU (bf16
// output, as timed) for m tokens, compared on tokens 0, m/2, m − 1 with a float64 reference. Returns the worst
// |GPU − ref| / bound (≤ 1 passes).
double verify(Kind kind, int64_t n, int64_t k, int64_t m, Stream& stream) {
  std::mt19937 rng(static_cast<unsigned>(7 * n + 3 * m + static_cast<int>(kind)));
  const fp4serve::testing::Layer l =
      kind == Kind::Nvfp4 ? fp4serve::testing::make_nvfp4(rng, n, k, true) : fp4serve::testing::make_mxfp4(rng, n, k);
  const quant::LinearWeights p = quant::fp4_view_weights(
      kind == Kind::Nvfp4 ? quant::BlockFormat::Nvfp4 : quant::BlockFormat::Mxfp4, l.weight.view(), l.scale.view(),
      l.global_scale, quant::GlobalScaleConvention::Divisor, "bench");
  const DeviceLinear w = kernels::cuda::upload_linear(p, stream);
  std::vector<float> x(static_cast<size_t>(m * k));
  std::vector<bf16> xb(x.size());
  std::normal_distribution<float> dist(0.f, 1.f);
  for (size_t i = 0; i < x.size(); ++i) {
    __nv_bfloat16_raw raw;
    raw.x = quant::float_to_bf16(dist(rng));
    x[i] = quant::bf16_to_float(raw.x);
    xb[i] = raw;
  }
  auto dx = DeviceBuffer<bf16>::from_host(xb);
  DeviceBuffer<bf16> dy(static_cast<size_t>(m * n));
  FP4SERVE_CUDA_CHECK(cudaMemset(dy.data(), 0xFF, dy.bytes()));  // NaN: an unwritten output fails
  kernels::cuda::linear(w, dx.data(), m, dy.data(), stream);
  stream.sync();
  const std::vector<bf16> y = dy.download();
  double worst = 0;
  for (const int64_t tok : {int64_t{0}, m / 2, m - 1}) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double prod = static_cast<double>(x[static_cast<size_t>(tok * k + q)]) * l.w[static_cast<size_t>(j * k + q)];
        want += prod;
        mag += std::fabs(prod);
      }
      const double got = quant::bf16_to_float(static_cast<__nv_bfloat16_raw>(y[static_cast<size_t>(tok * n + j)]).x);
      const double bound = 8.0 * static_cast<double>(k + 16) * 0x1p-24 * mag + 0x1p-8 * std::fabs(want) + 1e-30;
      const double ratio = std::isnan(got) ? INFINITY : std::fabs(got - want) / bound;
      worst = std::max(worst, ratio);
    }
  }
  return worst;
}

// Device-to-device copy of 1 GiB: the achievable streaming bandwidth (read + write) on this GPU.
double measure_copy_bandwidth(Stream& stream) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<uint8_t> src(bytes), dst(bytes);
  FP4SERVE_CUDA_CHECK(cudaMemsetAsync(src.data(), 1, bytes, stream.get()));
  cudaEvent_t start, stop;
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&start));
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&stop));
  FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));  // warm-up
  constexpr int kReps = 5;
  FP4SERVE_CUDA_CHECK(cudaEventRecord(start, stream.get()));
  for (int i = 0; i < kReps; ++i) {
    FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  }
  FP4SERVE_CUDA_CHECK(cudaEventRecord(stop, stream.get()));
  FP4SERVE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  FP4SERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
}

// One layer of the given kind with constant-pattern weights, directly in the GPU layout.
DeviceLinear make_layer(Kind kind, int64_t n, int64_t k) {
  DeviceLinear w;
  w.out_features = n;
  w.in_features = k;
  if (kind == Kind::Cublas) {
    w.layout = WeightEncoding::Dense;
    w.padded_rows = n;
    w.padded_cols = k;
    w.dense = DeviceBuffer<bf16>(static_cast<size_t>(n * k));
    FP4SERVE_CUDA_CHECK(cudaMemset(w.dense.data(), 0x3C, w.dense.bytes()));  // bf16 0x3C3C ≈ 0.0115
    return w;
  }
  using kernels::cuda::kGpuColChunk;
  using kernels::cuda::kGpuRowTile;
  w.layout = WeightEncoding::Fp4;
  w.block_format = kind == Kind::Nvfp4 ? quant::BlockFormat::Nvfp4 : quant::BlockFormat::Mxfp4;
  const quant::BlockFormatTraits& row = quant::block_format_traits(w.block_format);
  w.group_size = row.group_size;
  w.padded_rows = (n + kGpuRowTile - 1) / kGpuRowTile * kGpuRowTile;
  w.padded_cols = (k + kGpuColChunk - 1) / kGpuColChunk * kGpuColChunk;
  const int64_t tiles = w.padded_rows / kGpuRowTile, chunks = w.padded_cols / kGpuColChunk;
  w.codes = DeviceBuffer<uint32_t>(static_cast<size_t>(tiles * chunks * 128));
  FP4SERVE_CUDA_CHECK(cudaMemset(w.codes.data(), 0x5A, w.codes.bytes()));
  w.scales = DeviceBuffer<uint8_t>(static_cast<size_t>(tiles * chunks * kernels::cuda::gpu_scale_slots(w.group_size) * 2));
  // 1.0 as the row's scale element: E4M3 0x38, E8M0 2^(127 − 127).
  const int one = row.scale == quant::ElementFormat::E4M3 ? quant::float_to_e4m3(1.f) : 127;
  FP4SERVE_CUDA_CHECK(cudaMemset(w.scales.data(), one, w.scales.bytes()));
  if (row.global_scale) {
    const std::vector<float> ones(static_cast<size_t>(w.padded_rows), 1.f);
    w.global_scale = DeviceBuffer<float>::from_host(ones);
  }
  return w;
}

void bm_gemm(benchmark::State& state, Kind kind, int64_t n, int64_t k, int64_t m) {
  Stream stream;
  std::vector<DeviceLinear> copies;
  copies.push_back(make_layer(kind, n, k));
  const int64_t bytes = copies[0].weight_bytes();
  while (static_cast<int64_t>(copies.size()) * bytes < 2 * g_l2_bytes) copies.push_back(make_layer(kind, n, k));
  DeviceBuffer<bf16> x(static_cast<size_t>(m * k));
  FP4SERVE_CUDA_CHECK(cudaMemset(x.data(), 0x3C, x.bytes()));
  DeviceBuffer<bf16> y(static_cast<size_t>(m * n));
  cudaEvent_t start, stop;
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&start));
  FP4SERVE_CUDA_CHECK(cudaEventCreate(&stop));
  size_t next = 0;
  auto launch = [&] {
    kernels::cuda::linear(copies[next], x.data(), m, y.data(), stream);
    next = (next + 1) % copies.size();
  };
  auto time_batch = [&](int launches) {
    FP4SERVE_CUDA_CHECK(cudaEventRecord(start, stream.get()));
    for (int i = 0; i < launches; ++i) launch();
    FP4SERVE_CUDA_CHECK(cudaEventRecord(stop, stream.get()));
    FP4SERVE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FP4SERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1e-3 / launches;
  };
  // Warm-up (module load, cuBLAS heuristics) and a batch size of about 20 ms, 3 to 200 launches.
  const double estimate = time_batch(3);
  const int batch = static_cast<int>(std::max(3.0, std::min(200.0, 0.02 / std::max(estimate, 1e-7))));
  // The batch is replayed as a CUDA graph so that host launch overhead (a few µs) does not cap the small
  // layers; if capture fails (a library call that cannot be captured), plain launches are timed instead.
  cudaGraphExec_t graph_exec = nullptr;
  {
    cudaGraph_t graph = nullptr;
    bool captured = false;
    if (cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
      try {
        for (int i = 0; i < batch; ++i) launch();
        captured = true;
      } catch (const fp4serve::Error&) {
      }
      const bool ended = cudaStreamEndCapture(stream.get(), &graph) == cudaSuccess;
      if (!(captured && ended && cudaGraphInstantiate(&graph_exec, graph, 0) == cudaSuccess)) graph_exec = nullptr;
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    cudaGetLastError();  // a failed capture leaves a sticky error; the plain path must not see it
  }
  auto time_graph = [&] {
    FP4SERVE_CUDA_CHECK(cudaEventRecord(start, stream.get()));
    FP4SERVE_CUDA_CHECK(cudaGraphLaunch(graph_exec, stream.get()));
    FP4SERVE_CUDA_CHECK(cudaEventRecord(stop, stream.get()));
    FP4SERVE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FP4SERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1e-3 / batch;
  };
  const bool use_graph = graph_exec != nullptr;
  if (use_graph) time_graph();  // upload the graph once before timing
  double seconds = 0;
  for (auto _ : state) {
    seconds = use_graph ? time_graph() : time_batch(batch);
    state.SetIterationTime(seconds);
  }
  if (use_graph) cudaGraphExecDestroy(graph_exec);
  state.counters["graph"] = use_graph ? 1 : 0;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double gbps = static_cast<double>(bytes) / seconds * 1e-9;
  state.counters["weight_GBps"] = gbps;
  state.counters["copy_ratio"] = gbps * 1e9 / g_copy_bytes_per_s;
  state.counters["TFLOPs"] = 2.0 * static_cast<double>(m * n * k) / seconds * 1e-12;
  Result& r = g_results[{n, k, m, static_cast<int>(kind)}];
  r.seconds = seconds;
  r.copy_ratio = gbps * 1e9 / g_copy_bytes_per_s;
  if (kind == Kind::Cublas) {
    g_cublas_seconds[{n, k, m}] = seconds;
  } else if (auto it = g_cublas_seconds.find({n, k, m}); it != g_cublas_seconds.end()) {
    state.counters["vs_cublas"] = it->second / seconds;
    r.vs_cublas = it->second / seconds;
  }
}

}  // namespace
}  // namespace fp4serve::bench

int main(int argc, char** argv) {
  using namespace fp4serve::bench;
  const auto device = fp4serve::kernels::cuda::cuda_device(0);
  if (!device) {
    std::printf("bench_gemm_cuda: no CUDA device (cudaGetDeviceCount failed or returned 0); nothing to measure\n");
    return 0;
  }
  g_l2_bytes = device->l2_bytes;
  {
    Stream stream;
    g_copy_bytes_per_s = measure_copy_bandwidth(stream);
  }
  std::printf("device: %s (sm_%d, %d SMs, L2 %lld MiB); D2D copy bandwidth %.0f GB/s (read + write)\n",
              device->name.c_str(), device->sm, device->multiprocessors,
              static_cast<long long>(device->l2_bytes >> 20), g_copy_bytes_per_s * 1e-9);
  int status = 0;
  {
    Stream stream;
    for (const Kind kind : {Kind::Nvfp4, Kind::Mxfp4}) {
      for (const int64_t m : {1, 16, 64, 256}) {
        const double worst = verify(kind, 4096, 4096, m, stream);
        const bool ok = worst <= 1.0;
        std::printf("verify %s N4096 K4096 M%lld: worst |GPU - float64| / bound = %.3g %s\n",
                    kKindNames[static_cast<int>(kind)], static_cast<long long>(m), worst, ok ? "ok" : "FAIL");
        if (!ok) status = 1;
      }
    }
  }
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 4096}, {8192, 8192}, {28672, 8192}};
  for (const auto& [n, k] : shapes) {
    for (const int64_t m : {1, 4, 16, 64, 256, 4096}) {
      for (const Kind kind : {Kind::Cublas, Kind::Nvfp4, Kind::Mxfp4}) {
        const std::string name = std::string(kKindNames[static_cast<int>(kind)]) + "/N" + std::to_string(n) + "/K" +
                                 std::to_string(k) + "/M" + std::to_string(m);
        // Large products run fewer timed batches (each batch is ~20 ms of GPU time).
        const int iterations = m * n * k > (int64_t{1} << 36) ? 2 : 5;
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { bm_gemm(s, kind, n, k, m); })
            ->UseManualTime()
            ->Iterations(iterations)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // One table of what ran: time per launch, share of the copy bandwidth, speed-up over cuBLAS bf16.
  std::printf("| gemm N x K, M | cublas_bf16 us | nvfp4 us | nvfp4 copy_ratio | nvfp4 vs_cublas | mxfp4 us | "
              "mxfp4 copy_ratio | mxfp4 vs_cublas |\n");
  for (const auto& [n, k] : shapes) {
    for (const int64_t m : {1, 4, 16, 64, 256, 4096}) {
      auto get = [&](Kind kind) {
        auto it = g_results.find({n, k, m, static_cast<int>(kind)});
        return it == g_results.end() ? Result{} : it->second;
      };
      const Result c = get(Kind::Cublas), nv = get(Kind::Nvfp4), mx = get(Kind::Mxfp4);
      if (c.seconds == 0 && nv.seconds == 0 && mx.seconds == 0) continue;
      std::printf("| gemm %lldx%lld, M%lld | %.1f | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f |\n",
                  static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), c.seconds * 1e6,
                  nv.seconds * 1e6, nv.copy_ratio, nv.vs_cublas, mx.seconds * 1e6, mx.copy_ratio, mx.vs_cublas);
    }
  }
  return status;
}
