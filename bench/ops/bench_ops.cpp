// SPDX-License-Identifier: Apache-2.0
// Throughput of the CPU model ops at Llama-3-8B / GPT-OSS shapes. Run single-threaded for per-op cost
// (OMP_NUM_THREADS=1) or with the cores to be used. The FWHT-16 row on a 4096-vector is the number that
// the online Hadamard budget is judged by (≤ 3% of an M = 1 4096×4096 NVFP4 GEMV).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/hadamard.h"
#include "backends/cpu/kernels/norm.h"
#include "backends/cpu/kernels/rope.h"
#include "bench_target.h"
#include "model/rope_table.h"

namespace fp4serve::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// args: block size; one 4096-wide row (a decode activation).
void BM_FwhtRow4096(benchmark::State& state) {
  const int64_t block = state.range(0);
  std::vector<float> x = random_vec(4096, 1);
  for (auto _ : state) {
    fwht_blocks(x.data(), 1, 4096, block);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetBytesProcessed(state.iterations() * 4096 * 4);
}
BENCHMARK(BM_FwhtRow4096)->Arg(16)->Arg(32)->Arg(128)->Arg(4096);

void BM_RotateBlocksRow4096(benchmark::State& state) {
  const int64_t block = state.range(0);
  std::vector<float> x = random_vec(4096, 1), m = random_vec(block * block, 2);
  for (auto _ : state) {
    rotate_blocks(x.data(), 1, 4096, m.data(), block);
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_RotateBlocksRow4096)->Arg(16)->Arg(128);

// An online `output` transform on the k slice (1024 columns) of a fused Llama-3-8B q|k|v output (6144 columns),
// head_dim blocks of 128, over a 512-token prefill: one kernel call per row (arg 0) against gathering the slice
// into a contiguous block, one call, and scattering it back (arg 1). backends::cpu::apply_transform_strided uses
// the per-row form, which measured faster.
void BM_FwhtStridedSlice(benchmark::State& state) {
  const bool gather = state.range(0) != 0;
  constexpr int64_t kRows = 512, kStride = 6144, kOffset = 4096, kWidth = 1024, kBlock = 128;
  std::vector<float> y = random_vec(kRows * kStride, 1), slice(kRows * kWidth);
  for (auto _ : state) {
    if (gather) {
      for (int64_t r = 0; r < kRows; ++r) std::copy_n(y.data() + r * kStride + kOffset, kWidth, slice.data() + r * kWidth);
      fwht_blocks(slice.data(), kRows, kWidth, kBlock);
      for (int64_t r = 0; r < kRows; ++r) std::copy_n(slice.data() + r * kWidth, kWidth, y.data() + r * kStride + kOffset);
    } else {
      for (int64_t r = 0; r < kRows; ++r) fwht_blocks(y.data() + r * kStride + kOffset, 1, kWidth, kBlock);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * kRows * kWidth * 4);
}
BENCHMARK(BM_FwhtStridedSlice)->Arg(0)->Arg(1)->UseRealTime();

// A full-width random-Hadamard rotation as compressed-tensors builds it (llm-compressor QuIP defaults on a
// SmolLM2-135M-shaped model): n = 576 = H_144 ⊗ H_4 and n = 1536 = H_192 ⊗ H_8 with ±1 signs, over `rows` rows
// (1 = decode, 512 = a prefill window). args: n, kernel (0 = rotate_blocks with the dense n×n matrix, 1 =
// kronecker_hadamard_blocks on the factors), rows. Same matrix both ways.
void BM_RandomHadamardRotation(benchmark::State& state) {
  const int64_t n = state.range(0), rows = state.range(2);
  const int64_t p = n == 576 ? 4 : 8, k = n / p;
  std::mt19937 rng(3);
  quant::KroneckerHadamardFactors f;
  f.p = p;
  f.k = k;
  for (int64_t i = 0; i < k * k; ++i) f.a.push_back((rng() & 1) ? 1.0 : -1.0);
  for (int64_t i = 0; i < n; ++i) {
    f.left.push_back((rng() & 1) ? 1 : -1);
    f.right.push_back(1);
  }
  const double scale = 1.0 / std::sqrt(double(n));
  std::vector<float> dense(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double h = (__builtin_popcountll(uint64_t((i % p) & (j % p))) & 1) ? -1.0 : 1.0;
      dense[static_cast<size_t>(i * n + j)] =
          static_cast<float>(f.left[i] * f.a[static_cast<size_t>((i / p) * k + j / p)] * h * scale);
    }
  }
  const quant::KroneckerHadamardSteps t = quant::kronecker_hadamard_steps(f, {}, false, scale);
  const KroneckerHadamardKernel kernel = prepare_kronecker_hadamard(t);
  std::vector<float> x = random_vec(static_cast<size_t>(rows * n), 1);
  const bool structured = state.range(1) != 0;
  for (auto _ : state) {
    if (structured) {
      kronecker_hadamard_blocks(kernel, x.data(), rows, n);
    } else {
      rotate_blocks(x.data(), rows, n, dense.data(), n);
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_RandomHadamardRotation)
    ->ArgNames({"n", "structured", "rows"})
    ->ArgsProduct({{576, 1536}, {0, 1}, {1, 512}})
    ->Unit(benchmark::kMicrosecond);

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = 4096;
  std::vector<float> x = random_vec(rows * dim, 1), w = random_vec(dim, 2), out(rows * dim);
  for (auto _ : state) {
    rms_norm(x.data(), w.data(), rows, dim, 1e-5f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * dim * 8);
}
BENCHMARK(BM_RmsNorm)->Arg(1)->Arg(512);

void BM_SiluAndMul(benchmark::State& state) {
  const int64_t m = state.range(0), inter = 14336;
  std::vector<float> x = random_vec(m * 2 * inter, 1), out(m * inter);
  for (auto _ : state) {
    silu_and_mul(x.data(), m, inter, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * m * inter);
}
BENCHMARK(BM_SiluAndMul)->Arg(1)->Arg(64);

void BM_SwigluOai(benchmark::State& state) {
  const int64_t m = 1, inter = 2880;
  std::vector<float> x = random_vec(m * 2 * inter, 1), out(m * inter);
  for (auto _ : state) {
    swiglu_oai_and_mul(x.data(), m, inter, 1.702f, 7.0f, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * m * inter);
}
BENCHMARK(BM_SwigluOai);

void BM_Rope(benchmark::State& state) {
  const int64_t tokens = state.range(0), heads = 32, head_dim = 128;
  model::RopeScaling s;
  const model::RopeCache cache(head_dim, 500000.0, s, 4096);
  const RopeTable table{cache.cos(0), cache.sin(0), cache.rotary_dim(), cache.max_positions()};
  std::vector<float> x = random_vec(tokens * heads * head_dim, 1);
  std::vector<int64_t> pos(tokens);
  for (int64_t i = 0; i < tokens; ++i) pos[i] = 100 + i;
  for (auto _ : state) {
    apply_rope(x.data(), tokens, heads, head_dim, pos.data(), table, RopeLayout::NeoX);
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_Rope)->Arg(1)->Arg(512);

// n random values stored as KV cache elements of type `element` (bench arg: 0 fp32, 1 bf16, 2 fp16).
std::vector<uint16_t> random_kv(int64_t n, KvElement element, uint64_t seed) {
  const std::vector<float> x = random_vec(n, seed);
  std::vector<uint16_t> out(static_cast<size_t>(n * kv_element_bytes(element) / 2));
  write_kv_row(x.data(), n, element, out.data());
  return out;
}

// Attention over a KV cache laid out as model::KvCache ([KVH][positions][D]). args: t, context length before the call, query heads, KV heads, head_dim, element
// (0 fp32, 1 bf16, 2 fp16) (Llama-3-8B: 32, 8, 128; the default model SmolLM2-135M: 9, 3, 64).
void AttentionBench(benchmark::State& state, bool bf16_products) {
  const int64_t t = state.range(0), start = state.range(1), H = state.range(2), KVH = state.range(3), D = state.range(4);
  const auto element = static_cast<KvElement>(state.range(5));
  const int64_t rows = start + t;
  std::vector<float> q = random_vec(t * H * D, 1);
  std::vector<uint16_t> k = random_kv(rows * KVH * D, element, 2), v = random_kv(rows * KVH * D, element, 3);
  std::vector<float> out(t * H * D);
  AttentionParams p{H, KVH, D, 1.0f / std::sqrt(float(D))};
  p.bf16_dot_products = bf16_products;
  for (auto _ : state) {
    attention(q.data(), t, start, KvRows{k.data(), v.data(), D, rows * D, element}, p, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  // KV bytes read once per call (decode is bound by this).
  state.SetBytesProcessed(state.iterations() * rows * KVH * D * kv_element_bytes(element) * 2);
  // q·k and p·v: 4·D flops per (query row, head, visible key) pair; row i sees start + i + 1 keys.
  const double pairs = static_cast<double>(t) * static_cast<double>(start) + static_cast<double>(t) * (t + 1) / 2.0;
  state.counters["GFLOP/s"] = benchmark::Counter(pairs * static_cast<double>(H * D * 4) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
void BM_Attention(benchmark::State& state) { AttentionBench(state, false); }
// BM_Attention with AttentionParams::bf16_dot_products, what a prefill runs under the bf16 activation precisions:
// the blocked prefill of a bf16 cache on bf16 dot products where the CPU has them (the label says which ran).
void BM_AttentionBf16Products(benchmark::State& state) {
  AttentionParams p{state.range(2), state.range(3), state.range(4), 1.0f};
  p.bf16_dot_products = true;
  state.SetLabel(prefill_attention_uses_bf16(static_cast<KvElement>(state.range(5)), p) ? "bf16 products" : "fp32 products");
  AttentionBench(state, true);
}
BENCHMARK(BM_AttentionBf16Products)
    ->Args({128, 0, 9, 3, 64, 1})
    ->Args({512, 0, 9, 3, 64, 1})
    ->Args({2048, 0, 9, 3, 64, 1})
    ->Args({8192, 0, 9, 3, 64, 1})
    ->Args({256, 7936, 9, 3, 64, 1})
    ->Args({512, 0, 32, 8, 128, 1})
    ->Args({512, 0, 24, 8, 128, 1})
    ->Unit(benchmark::kMicrosecond);

// BM_Attention in batch-invariant mode (backends/cpu/kernels/batch_invariant.h: no key split, one row blocked too),
// against BM_Attention's same arguments in the same run.
void BM_AttentionInvariant(benchmark::State& state) {
  set_batch_invariant(true);
  BM_Attention(state);
  set_batch_invariant(false);
}
BENCHMARK(BM_AttentionInvariant)
    ->Args({1, 191, 9, 3, 64, 1})
    ->Args({1, 1023, 9, 3, 64, 1})
    ->Args({1, 4095, 32, 8, 128, 1})
    ->Args({128, 0, 9, 3, 64, 1})
    ->Unit(benchmark::kMicrosecond);

// Decode attention with the cache cold: `copies` caches (≥ 64 MiB together) used in turn, as a decode step meets
// each layer's cache after the weights have streamed through L3. args: context, query heads, KV heads, head_dim,
// element (as BM_Attention).
void BM_AttentionCold(benchmark::State& state) {
  const int64_t start = state.range(0), H = state.range(1), KVH = state.range(2), D = state.range(3);
  const auto element = static_cast<KvElement>(state.range(4));
  const int64_t rows = start + 1;
  const int64_t per = rows * KVH * D, per_bytes = per * kv_element_bytes(element);
  const int64_t copies = std::max<int64_t>(2, (int64_t{64} << 20) / (per_bytes * 2) + 1);
  std::vector<float> q = random_vec(H * D, 1);
  std::vector<uint16_t> k = random_kv(per * copies, element, 2), v = random_kv(per * copies, element, 3);
  std::vector<float> out(H * D);
  const AttentionParams p{H, KVH, D, 1.0f / std::sqrt(float(D))};
  int64_t c = 0;
  for (auto _ : state) {
    const size_t offset = static_cast<size_t>(c * per_bytes / 2);
    attention(q.data(), 1, start, KvRows{k.data() + offset, v.data() + offset, D, rows * D, element}, p, out.data());
    benchmark::DoNotOptimize(out.data());
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(state.iterations() * per_bytes * 2);
}
BENCHMARK(BM_AttentionCold)
    ->ArgsProduct({{512}, {9}, {3}, {64}, {0, 1, 2}})
    ->ArgsProduct({{1536}, {3}, {1}, {64}, {0, 1}})
    ->ArgsProduct({{4095}, {32}, {8}, {128}, {0, 1, 2}})
    ->Args({32767, 4, 1, 128, 0});

// A server's decode step: decode_attention over `rows` sequences of a paged cache (the CPU KvCache's layout,
// [block][KVH][block_size][D] per layer, 16 positions a block), each at `context` ± 25% positions, its blocks
// scattered at random over a pool of ≥ 64 MiB used a part at a time, so the cache is cold as after a layer's
// weights. args: rows, context, query heads, KV heads, head_dim, element (as BM_Attention).
void BM_DecodeAttentionPaged(benchmark::State& state) {
  const int64_t n = state.range(0), context = state.range(1), H = state.range(2), KVH = state.range(3),
                D = state.range(4);
  const auto element = static_cast<KvElement>(state.range(5));
  constexpr int64_t kBlock = 16;
  std::mt19937 rng(7);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  int64_t step_blocks = 0;
  for (int64_t& p : pos) {
    p = context * 3 / 4 + static_cast<int64_t>(rng() % static_cast<uint32_t>(context / 2 + 1));
    step_blocks += p / kBlock + 1;
  }
  const int64_t block_elems = KVH * kBlock * D, block_bytes = block_elems * kv_element_bytes(element);
  const int64_t parts = std::max<int64_t>(2, (int64_t{64} << 20) / (2 * block_bytes * step_blocks) + 1);
  const int64_t pool = parts * step_blocks;
  // Cache-line aligned as CpuKvStorage's pool (a 16-byte offset, as std::vector's, splits rows across lines).
  const auto aligned_kv = [&](uint64_t seed) {
    const std::vector<uint16_t> src = random_kv(pool * block_elems, element, seed);
    const size_t bytes = (src.size() * sizeof(uint16_t) + 63) / 64 * 64;
    const auto release = [](uint16_t* p) { std::free(p); };
    std::unique_ptr<uint16_t[], decltype(release)> out(static_cast<uint16_t*>(std::aligned_alloc(64, bytes)), release);
    std::memcpy(out.get(), src.data(), src.size() * sizeof(uint16_t));
    return out;
  };
  const auto k = aligned_kv(2), v = aligned_kv(3);
  std::vector<int32_t> order(static_cast<size_t>(pool));
  for (int64_t b = 0; b < pool; ++b) order[static_cast<size_t>(b)] = static_cast<int32_t>(b);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> q = random_vec(n * H * D, 1), out(static_cast<size_t>(n * H * D));
  std::vector<std::vector<DecodeQuery>> steps(static_cast<size_t>(parts));
  int64_t next = 0;
  for (auto& rows : steps) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t blocks = pos[static_cast<size_t>(i)] / kBlock + 1;
      KvRows c{k.get(), v.get(), D, kBlock * D, element};
      c.block_table = order.data() + next;
      c.block_table_size = blocks;
      c.block_size = kBlock;
      c.block_stride = block_elems;
      rows.push_back(DecodeQuery{q.data() + i * H * D, pos[static_cast<size_t>(i)], c, out.data() + i * H * D});
      next += blocks;
    }
  }
  const AttentionParams p{H, KVH, D, 1.0f / std::sqrt(float(D))};
  int64_t part = 0;
  for (auto _ : state) {
    decode_attention(steps[static_cast<size_t>(part)], p);
    benchmark::DoNotOptimize(out.data());
    part = (part + 1) % parts;
  }
  int64_t keys = 0;
  for (int64_t p0 : pos) keys += p0 + 1;
  state.SetBytesProcessed(state.iterations() * keys * KVH * D * kv_element_bytes(element) * 2);
}
BENCHMARK(BM_DecodeAttentionPaged)
    ->Args({16, 192, 9, 3, 64, 1})
    ->Args({16, 1024, 9, 3, 64, 1})
    ->Args({4, 192, 9, 3, 64, 1})
    ->Args({16, 1024, 32, 8, 128, 1})
    ->Args({16, 192, 9, 3, 64, 0})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_Attention)
    ->Args({1, 191, 9, 3, 64, 1})
    ->Args({128, 0, 9, 3, 64, 1})
    ->Args({1, 4095, 32, 8, 128, 0})
    ->Args({1, 4095, 32, 8, 128, 1})
    ->Args({1, 32767, 32, 8, 128, 0})
    ->Args({512, 0, 32, 8, 128, 0})
    ->Args({512, 0, 32, 8, 128, 1})
    ->Args({1, 1023, 9, 3, 64, 0})
    ->Args({1, 1023, 9, 3, 64, 1})
    ->Args({1, 1023, 9, 3, 64, 2})
    ->Args({512, 0, 9, 3, 64, 0})
    ->Args({512, 0, 9, 3, 64, 1})
    ->Args({2, 2000, 9, 3, 64, 0})
    ->Args({4, 2000, 9, 3, 64, 0})
    ->Args({8, 2000, 9, 3, 64, 0})
    ->Args({15, 497, 9, 3, 64, 0})
    ->Args({16, 496, 9, 3, 64, 0})
    // Long prompts in one call (the flash-style tiles of attention_prefill.cpp), the default model's heads.
    ->Args({2048, 0, 9, 3, 64, 1})
    ->Args({8192, 0, 9, 3, 64, 1})
    // A 256-row chunk of a long prompt (serve's --max-num-batched-tokens) after 7936 cached positions.
    ->Args({256, 7936, 9, 3, 64, 1})
    ->Args({512, 0, 24, 8, 128, 1})  // Llama-3.2-3B's heads
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace fp4serve::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!fp4serve::bench::pin_target_from_env()) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
