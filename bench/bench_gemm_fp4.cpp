// SPDX-License-Identifier: Apache-2.0
// Weight-only GEMM speed: y[M, N] = x[M, K]·W[N, K]ᵀ for NVFP4, MXFP4, int4 (group 128), FP8 (per row, 128 × 128
// blocks) and bf16 on the SmolLM2 (576×1536), Llama-7B (4096, 11008) and gpt-oss-20b (MXFP4 experts 5760×2880 and
// 2880², the bf16 qkv 5120×2880) shapes. Weights rotate through copies totalling > LLC so M = 1 reads them from
// DRAM. Counters: weight GB/s, GFLOP/s; on M ≤ 8 rows bw_ratio, against a streaming read of the same bytes
// interleaved with the calls (BM_Linear), and bw_ratio_1g, against the 1 GiB read probe of start-up; on
// M = 256 rows fma_ratio, against the fp32 FMA peak measured at start-up; on M ≥ 16 rows roof_ratio, against the
// compute roof measured at start-up: the best of the fp32 FMA, AVX512-BF16 and AVX512-VNNI loops this CPU has
// (roofline.h ComputeRoofs; a multiply-add counts 2 ops whatever its type). Both sides of these ratios are rated by
// CPU time (the kernel: 2·M·N·K · threads / the process's CPU seconds per call; the roofs: per thread), so that it
// holds on a shared machine; run with OMP_WAIT_POLICY=passive there, or the time idle workers spin counts as the
// kernel's (roof_ratio then reads low). linear_auto rows run what a bfloat16
// model runs under `--activation-precision auto` (kernels::probe_activation_precision at that shape, its choice in
// the label). Baselines at M = 256:
// dequantize-to-fp32 + OpenBLAS sgemm, and sgemm alone on pre-dequantized weights (only when CMake found
// OpenBLAS: FP4SERVE_HAVE_OPENBLAS). For NVFP4/MXFP4, M ≤ 4
// (AVX2) / 8 (AVX-512) run the fused decode GEMV (gemm_gemv.cpp), larger M the panel GEMM. linear_invariant /
// linear_bf16_invariant: the same calls in batch-invariant mode (backends/cpu/kernels/batch_invariant.h).
#include <benchmark/benchmark.h>
#ifdef FP4SERVE_HAVE_OPENBLAS
#include <cblas.h>
#endif
#include <hwy/targets.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/linear.h"
#include "bench_target.h"
#include "core/tensor_view.h"
#include "core/threading.h"
#include "backends/cpu/prepare/repack.h"
#include "roofline.h"

namespace fp4serve::bench {
namespace {

using prepare::PreparedLinear;

enum class Format { Nvfp4, Mxfp4, Int4, Bf16, Fp8Row, Fp8Block };
constexpr const char* kFormatNames[] = {"nvfp4", "mxfp4", "int4g128", "bf16", "fp8row", "fp8b128"};
// Weights rotate through copies totalling this much: > the 480 MiB LLC this VM reports. Profiling runs
// (callgrind) may shrink it with FP4SERVE_BENCH_COLD_MB and skip the roofs with FP4SERVE_BENCH_NO_ROOFS=1.
size_t cold_bytes() {
  const char* mb = std::getenv("FP4SERVE_BENCH_COLD_MB");
  return mb != nullptr ? static_cast<size_t>(std::atol(mb)) << 20 : size_t{1} << 30;
}

double g_read_bw = 0;   // bytes/s
double g_fma_peak = 0;  // FLOP/s
double g_compute_roof = 0;  // ops/s: ComputeRoofs::best()
bool g_roofs = true;    // false: FP4SERVE_BENCH_NO_ROOFS (no probes at all)

core::TensorView view(core::DType dtype, std::vector<int64_t> shape, const std::vector<uint8_t>& bytes) {
  return core::TensorView{dtype, std::move(shape), std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size())};
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n, uint8_t lo, uint8_t hi) {
  std::vector<uint8_t> v(n);
  std::uniform_int_distribution<int> d(lo, hi);
  for (auto& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

PreparedLinear make_weights(Format f, int64_t n, int64_t k) {
  std::mt19937 rng(static_cast<unsigned>(n * 31 + k));
  switch (f) {
    case Format::Nvfp4: {
      const auto codes = random_bytes(rng, static_cast<size_t>(n * k / 2), 0, 255);
      const auto scales = random_bytes(rng, static_cast<size_t>(n * k / 16), 0x20, 0x5F);
      return prepare::prepare_nvfp4(view(core::DType::U8, {n, k / 2}, codes), view(core::DType::F8_E4M3, {n, k / 16}, scales),
                                    1000.f, prepare::GlobalScaleConvention::Divisor, "bench");
    }
    case Format::Mxfp4: {
      const auto codes = random_bytes(rng, static_cast<size_t>(n * k / 2), 0, 255);
      const auto scales = random_bytes(rng, static_cast<size_t>(n * k / 32), 118, 126);
      return prepare::prepare_mxfp4(view(core::DType::U8, {n, k / 2}, codes), view(core::DType::U8, {n, k / 32}, scales), "bench");
    }
    case Format::Int4: {
      const int64_t groups = (k + 127) / 128;
      const auto words = random_bytes(rng, static_cast<size_t>(n * k / 2), 0, 255);
      std::vector<uint8_t> scales(static_cast<size_t>(n * groups * 2));
      for (size_t i = 0; i < scales.size(); i += 2) {
        scales[i] = 0;
        scales[i + 1] = 0x3C;  // bf16 0.0078125
      }
      return prepare::prepare_int4(view(core::DType::I32, {n, k / 8}, words), view(core::DType::BF16, {n, groups}, scales),
                                   nullptr, nullptr, k, 128, "bench");
    }
    case Format::Bf16: {
      std::vector<uint8_t> bits(static_cast<size_t>(n * k * 2));
      for (size_t i = 0; i < bits.size(); i += 2) {
        bits[i] = static_cast<uint8_t>(rng());
        bits[i + 1] = static_cast<uint8_t>(0x3C + rng() % 2) | static_cast<uint8_t>(rng() & 0x80);
      }
      return prepare::prepare_dense(view(core::DType::BF16, {n, k}, bits), "bench");
    }
    case Format::Fp8Row: {  // E4M3 with one fp32 scale per row: the --lm-head-dtype fp8 copy
      const auto codes = random_bytes(rng, static_cast<size_t>(n * k), 0, 0x7E);
      std::vector<uint8_t> scales(static_cast<size_t>(n * 4));
      const float one = 0.01f;
      for (int64_t r = 0; r < n; ++r) std::memcpy(scales.data() + 4 * r, &one, 4);
      return prepare::prepare_fp8(view(core::DType::F8_E4M3, {n, k}, codes), view(core::DType::F32, {n, 1}, scales), {0, 0},
                                  "bench");
    }
    case Format::Fp8Block: {  // E4M3 with a scale per 128 × 128 block: an FP8_BLOCK (DeepSeek-style) checkpoint
      const auto codes = random_bytes(rng, static_cast<size_t>(n * k), 0, 0x7E);
      const int64_t br = (n + 127) / 128, bc = (k + 127) / 128;
      std::vector<uint8_t> scales(static_cast<size_t>(br * bc * 4));
      std::uniform_real_distribution<float> sd(0.005f, 0.02f);
      for (int64_t i = 0; i < br * bc; ++i) {
        const float v = sd(rng);
        std::memcpy(scales.data() + 4 * i, &v, 4);
      }
      return prepare::prepare_fp8(view(core::DType::F8_E4M3, {n, k}, codes), view(core::DType::F32, {br, bc}, scales),
                                  {128, 128}, "bench");
    }
  }
  return {};
}

// Copies of one layer, cached for consecutive benchmarks of the same (format, shape).
struct ColdSet {
  Format format{};
  int64_t n = 0, k = 0;
  std::vector<PreparedLinear> copies;
};
ColdSet g_cold;

std::vector<PreparedLinear>& cold_copies(Format f, int64_t n, int64_t k) {
  if (g_cold.copies.empty() || g_cold.format != f || g_cold.n != n || g_cold.k != k) {
    g_cold.copies.clear();
    g_cold.format = f;
    g_cold.n = n;
    g_cold.k = k;
    g_cold.copies.push_back(make_weights(f, n, k));
    const size_t per = prepare::weight_bytes(g_cold.copies[0]);
    const size_t count = std::max<size_t>(2, (cold_bytes() + per - 1) / per);
    for (size_t i = 1; i < count; ++i) g_cold.copies.push_back(g_cold.copies[0].clone());
    // On transparent huge pages, as the model's weights are (CpuBackend::upload_linear): with 4 KiB pages every
    // page of a cold read is also a TLB miss. The arena goes; its chunks stay as long as the copies.
    prepare::HugePageArena arena;
    for (PreparedLinear& c : g_cold.copies) prepare::move_weights_into(c, arena);
  }
  return g_cold.copies;
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::vector<float> random_x(int64_t m, int64_t k) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = d(rng);
  return x;
}

// A streaming read of w's weight buffers (codes, scales, offsets: what the kernels stream); returns the bytes read.
size_t stream_weights(const PreparedLinear& w) {
  size_t bytes = 0;
  for (const prepare::AlignedBuffer* b : {&w.codes, &w.scales, &w.offsets}) {
    if (b->size() > 0) bytes += stream_read(b->data(), b->size());
  }
  return bytes;
}

void set_counters(benchmark::State& state, double weight_bytes, int64_t m, int64_t n, int64_t k) {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  state.counters["weight_GB/s"] = benchmark::Counter(weight_bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (m <= 8) state.counters["bw_ratio_1g"] = benchmark::Counter(weight_bytes / g_read_bw, benchmark::Counter::kIsIterationInvariantRate);
}

// bf16_pairs false: the fused FP4 GEMV's FMA kernel on a CPU whose default is the AVX512-BF16 one
// (kernels::set_bf16_dot_allowed). invariant: batch-invariant mode (kernels::set_batch_invariant), whose cost the
// linear_invariant / linear_bf16_invariant rows give against linear / linear_bf16 of the same run.
void BM_Linear(benchmark::State& state, Format f, int64_t n, int64_t k, prepare::ActivationPrecision precision,
               bool bf16_pairs, bool invariant) {
  const int64_t m = state.range(0);
  kernels::set_bf16_dot_allowed(bf16_pairs);
  kernels::set_batch_invariant(invariant);
  auto& copies = cold_copies(f, n, k);
  for (PreparedLinear& c : copies) c.activation_precision = precision;
  const auto x = random_x(m, k);
  std::vector<float> y(static_cast<size_t>(m * n));
  // M ≤ 8 (the GEMVs, bound by DRAM reads): after each call stream_read reads the weight buffers of the copy half a
  // rotation away (as cold as the kernel's), so bw_ratio compares the kernel with the read roof of the same bytes,
  // measured in alternation with it. On a shared VM the start-up probe drifted by ±10% over one run
  // (36.0–39.9 GB/s at one thread in three runs of one session), more than the effects measured here.
  const bool probe = g_roofs && m <= 8;
  using Clock = std::chrono::steady_clock;
  double kernel_seconds = 0, probe_seconds = 0, probe_bytes = 0, kernel_cpu_seconds = 0;
  size_t i = 0;
  for (auto _ : state) {
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    kernels::linear(copies[i], x.data(), m, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    const auto t1 = Clock::now();
    kernel_cpu_seconds += process_cpu_seconds() - cpu0;
    const double seconds = std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(seconds);
    kernel_seconds += seconds;
    if (probe) {
      probe_bytes += static_cast<double>(stream_weights(copies[(i + copies.size() / 2) % copies.size()]));
      probe_seconds += std::chrono::duration<double>(Clock::now() - t1).count();
    }
    i = (i + 1) % copies.size();
  }
  const double weight_bytes = static_cast<double>(prepare::weight_bytes(copies[0]));
  set_counters(state, weight_bytes, m, n, k);
  if (m >= 16 && g_roofs && kernel_cpu_seconds > 0) {
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const double cpu_rate = flops * static_cast<double>(state.iterations()) * core::num_threads() / kernel_cpu_seconds;
    state.counters["cpu_GFLOP/s"] = cpu_rate / 1e9;
    state.counters["roof_ratio"] = cpu_rate / g_compute_roof;
    if (m == 256) state.counters["fma_ratio"] = cpu_rate / g_fma_peak;
  }
  if (probe && probe_seconds > 0 && kernel_seconds > 0) {
    const double stream_bw = probe_bytes / probe_seconds;
    state.counters["stream_GB/s"] = stream_bw / 1e9;
    state.counters["bw_ratio"] = weight_bytes * static_cast<double>(state.iterations()) / kernel_seconds / stream_bw;
  }
  const prepare::ActivationPrecision runs = kernels::precision_for_rows(precision, m);
  // The bf16 rows above the FP4 GEMV's 8 run on AMX tiles where kernels::amx_active().
  const bool amx = runs == prepare::ActivationPrecision::Bf16 && bf16_pairs && !invariant && m > 8 &&
                   kernels::amx_active();
  state.SetLabel(std::string(kernels::gemm_target_name()) + " " + std::string(prepare::activation_precision_name(runs)) +
                 (amx ? " AMX" : ""));
  kernels::set_bf16_dot_allowed(true);
  kernels::set_batch_invariant(false);
}

#ifdef FP4SERVE_HAVE_OPENBLAS
// dequantize (scalar, one thread) + sgemm, then sgemm alone on weights dequantized once.
void BM_DequantSgemm(benchmark::State& state, Format f, int64_t n, int64_t k, bool include_dequant) {
  const int64_t m = state.range(0);
  const PreparedLinear w = make_weights(f, n, k);
  const auto x = random_x(m, k);
  std::vector<float> wf(static_cast<size_t>(n * k)), y(static_cast<size_t>(m * n));
  kernels::dequantize(w, wf.data());
  for (auto _ : state) {
    if (include_dequant) kernels::dequantize(w, wf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.f,
                x.data(), static_cast<int>(k), wf.data(), static_cast<int>(k), 0.f, y.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, static_cast<double>(prepare::weight_bytes(w)), m, n, k);
}
#endif

void register_all() {
  const std::pair<int64_t, int64_t> shapes[] = {{576, 1536}, {1536, 576}, {4096, 4096}, {11008, 4096}, {4096, 11008}};
  const std::pair<int64_t, int64_t> lm_head{49152, 576};  // the default model's tied embedding as lm_head
  // gpt-oss-20b's decode reads: one expert's w13 and down (MXFP4) and the fused qkv (bf16; its 1.16 GB lm_head
  // reads as 4096×11008 does).
  const std::pair<int64_t, int64_t> gpt_oss_experts[] = {{5760, 2880}, {2880, 2880}};
  const std::pair<int64_t, int64_t> gpt_oss_bf16[] = {{5120, 2880}};
  using prepare::ActivationPrecision;
  for (Format f : {Format::Nvfp4, Format::Mxfp4, Format::Int4, Format::Bf16, Format::Fp8Row, Format::Fp8Block}) {
    std::vector<std::pair<int64_t, int64_t>> list(std::begin(shapes), std::end(shapes));
    if (f == Format::Bf16 || f == Format::Fp8Row) list.push_back(lm_head);
    if (f == Format::Mxfp4) list.insert(list.end(), std::begin(gpt_oss_experts), std::end(gpt_oss_experts));
    if (f == Format::Bf16) list.insert(list.end(), std::begin(gpt_oss_bf16), std::end(gpt_oss_bf16));
    for (auto [n, k] : list) {
      const std::string shape = std::string(kFormatNames[static_cast<int>(f)]) + "/" + std::to_string(n) + "x" + std::to_string(k);
      benchmark::RegisterBenchmark(("linear/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Fp32, true, false)
          ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("linear_invariant/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Fp32, true, true)
          ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMicrosecond);
      if (f == Format::Bf16 || f == Format::Fp8Row || f == Format::Fp8Block || f == Format::Int4) {
        // A bf16 lm_head, an FP8 layer or lm_head copy, an int4 layer under ActivationPrecision::Bf16: bf16 dot
        // products on x rounded to bf16 where the CPU has them (linear.h; M > 4, int4 at every M); linear/ above
        // (fp32 x, the widened fp32 panel) is the same run's baseline.
        benchmark::RegisterBenchmark(("linear_bf16/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Bf16, true, false)
            ->ArgName("M")->Arg(1)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMicrosecond);
      }
      if (f == Format::Nvfp4 || f == Format::Mxfp4) {
        // The FMA kernel where the default fused GEMV takes AVX512-BF16 pairs: the same run's baseline.
        if (kernels::bf16_dot_active()) {
          benchmark::RegisterBenchmark(("linear_fma/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Fp32, false, false)
              ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond);
        }
        // What `auto` runs for a bfloat16 checkpoint at this shape (load_model's resolve_activation_precision):
        // the probe's choice where the CPU has bf16 dot products, else fp32.
        const ActivationPrecision chosen =
            kernels::bf16_dot_active() ? kernels::probe_activation_precision(n, k).choice : ActivationPrecision::Fp32;
        benchmark::RegisterBenchmark(("linear_auto/" + shape).c_str(), BM_Linear, f, n, k, chosen, true, false)
            ->ArgName("M")->Arg(1)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
        // ActivationPrecision::Bf16: x rounded to bf16, bf16 dot products where the CPU has them.
        benchmark::RegisterBenchmark(("linear_bf16/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Bf16, true, false)
            ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("linear_bf16_invariant/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Bf16, true, true)
            ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMicrosecond);
      }
      if (f == Format::Nvfp4 || f == Format::Mxfp4 || f == Format::Int4) {
        // ActivationPrecision::Int8: int8 activations and integer dot products.
        benchmark::RegisterBenchmark(("linear_a8/" + shape).c_str(), BM_Linear, f, n, k, ActivationPrecision::Int8, true, false)
            ->ArgName("M")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
#ifdef FP4SERVE_HAVE_OPENBLAS
  for (auto [n, k] : shapes) {
    const std::string suffix = std::string("nvfp4/") + std::to_string(n) + "x" + std::to_string(k);
    benchmark::RegisterBenchmark(("dequant+sgemm/" + suffix).c_str(), BM_DequantSgemm, Format::Nvfp4, n, k, true)
        ->ArgName("M")->Arg(256)->UseRealTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("sgemm_only/" + suffix).c_str(), BM_DequantSgemm, Format::Nvfp4, n, k, false)
        ->ArgName("M")->Arg(256)->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
#endif
}

}  // namespace
}  // namespace fp4serve::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  using namespace fp4serve;
  // FP4SERVE_BENCH_TARGET also pins the roofs' target (bench_target.h).
  if (!bench::pin_target_from_env()) return 2;
  const int threads = core::num_threads();
#ifdef FP4SERVE_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  const bool roofs = std::getenv("FP4SERVE_BENCH_NO_ROOFS") == nullptr;
  bench::g_roofs = roofs;
  bench::g_read_bw = roofs ? bench::measure_read_bandwidth(size_t{1} << 30, 5) : 1.0;
  const bench::ComputeRoofs compute = roofs ? bench::measure_compute_roofs(5, kernels::amx_active())
                                              : bench::ComputeRoofs{1.0, 0, 0, 0};
  bench::g_fma_peak = compute.fma;
  bench::g_compute_roof = compute.best();
  std::printf("target %s, %d threads: measured read bandwidth %.2f GB/s (1 GiB streaming read); compute roofs "
              "(Gop/s, multiply-add = 2): fp32 FMA %.1f, bf16 dot %.1f, int8 dot %.1f, AMX bf16 %.1f (0: not on this "
              "CPU/target; AMX: %s)\n",
              kernels::gemm_target_name(), threads, bench::g_read_bw / 1e9, compute.fma / 1e9, compute.bf16_dot / 1e9,
              compute.int8_dot / 1e9, compute.amx_bf16 / 1e9, kernels::amx_status().reason.c_str());
  benchmark::AddCustomContext("read_GB/s", std::to_string(bench::g_read_bw / 1e9));
  benchmark::AddCustomContext("fma_peak_GFLOP/s", std::to_string(compute.fma / 1e9));
  benchmark::AddCustomContext("bf16_dot_peak_GFLOP/s", std::to_string(compute.bf16_dot / 1e9));
  benchmark::AddCustomContext("int8_dot_peak_Gop/s", std::to_string(compute.int8_dot / 1e9));
  benchmark::AddCustomContext("amx_bf16_peak_GFLOP/s", std::to_string(compute.amx_bf16 / 1e9));
  benchmark::AddCustomContext("compute_roof_Gop/s", std::to_string(compute.best() / 1e9));
  bench::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
