// SPDX-License-Identifier: Apache-2.0
// model::CudaDecoder against model::Decoder (the CPU oracle, itself matched to transformers in
// decoder_parity_test.cpp) on the dense reference fixtures: logits of the two golden prompts within a bound set by
// the GPU's bf16 GEMM inputs, and the same 8-token greedy continuation through the KV cache. The GPU cases skip
// without a GPU; the host-side bookkeeping (batch flattening, cache ownership, the refusals) runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"
#include "kernels/cuda/device.h"
#include "model/cuda_decoder.h"
#include "model/loader.h"

namespace fp4serve::model {
namespace {

namespace fs = std::filesystem;
const fs::path kRef = fs::path(FP4SERVE_TEST_DATA) / "ref";

bool have_gpu() { return kernels::cuda::cuda_device(0).has_value(); }

TEST(CudaDecoderHost, FlattenBatchComputesRowsAndRejectsBadChunks) {
  const std::vector<int32_t> a = {5, 6, 7}, b = {9};
  const std::vector<SequenceChunk> batch = {{2, 4, a, false}, {0, 10, b, false}, {1, 0, a, true}};
  const FlatBatch flat = flatten_batch(batch, /*num_layers=*/3, /*max_seq_len=*/16, /*max_slots=*/4, /*vocab=*/10);
  EXPECT_EQ(flat.ids, (std::vector<int32_t>{5, 6, 7, 9, 5, 6, 7}));
  EXPECT_EQ(flat.positions, (std::vector<int64_t>{4, 5, 6, 10, 0, 1, 2}));
  // slot · layers · seq + position
  EXPECT_EQ(flat.cache_rows, (std::vector<int64_t>{2 * 48 + 4, 2 * 48 + 5, 2 * 48 + 6, 10, 48, 49, 50}));
  EXPECT_EQ(flat.logit_rows, (std::vector<int64_t>{2, 3, 4, 5, 6}));

  const std::vector<int32_t> none;
  const std::vector<int32_t> big = {10};
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, none, false}}, 3, 16, 4, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 14, a, false}}, 3, 16, 4, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{4, 0, a, false}}, 3, 16, 4, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{1, 0, a, false}, {1, 3, b, false}}, 3, 16, 4, 10), UsageError);
  EXPECT_THROW(flatten_batch(std::vector<SequenceChunk>{{0, 0, big, false}}, 3, 16, 4, 10), UsageError);
}

struct OpaqueStorage final : KvStorage {};

TEST(CudaDecoderHost, BackendCacheRefusesHostAccessAndTheCpuDecoder) {
  KvCache cache(2, 1, 4, 8, 1, std::make_unique<OpaqueStorage>());
  const int slot = cache.acquire();
  ASSERT_EQ(slot, 0);
  EXPECT_THROW(cache.key(slot, 0, 0), UsageError);
  EXPECT_THROW(cache.value(slot, 0, 0), UsageError);

  LoadOptions options;
  options.progress = false;
  const LoadedModel cpu = load_model(kRef / "llama-nvfp4a16", options);
  KvCache foreign(cpu.config.num_layers, cpu.config.num_kv_heads, cpu.config.head_dim, 8, 1,
                  std::make_unique<OpaqueStorage>());
  const std::vector<int32_t> ids = {1, 2};
  const SequenceChunk chunk{foreign.acquire(), 0, ids, false};
  EXPECT_THROW(cpu.decoder->forward(std::span(&chunk, 1), foreign), UsageError);
}

TEST(CudaDecoderHost, DeviceCudaNeedsAGpuAndAGpuCapableCommand) {
  LoadOptions options;
  options.progress = false;
  options.device = "cuda";
  options.gpu_run = false;  // e.g. perplexity: refused before any GPU is looked for
  EXPECT_THROW(load_model(kRef / "llama-nvfp4a16", options), UnsupportedError);
  if (have_gpu()) GTEST_SKIP() << "a GPU is present: the no-GPU refusal cannot be observed here";
  options.gpu_run = true;
  try {
    load_model(kRef / "llama-nvfp4a16", options);
    FAIL() << "expected an error without a GPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

// A weight source that must not be reached: the refusals below happen before any weight is read.
class NoWeights final : public WeightSource {
 public:
  core::TensorView tensor(const std::string& name) const override { throw FormatError("unexpected read of " + name); }
  bool has_tensor(const std::string&) const override { return false; }
  LinearGroup linear_group(const std::vector<std::string>&) const override { throw FormatError("unexpected linear"); }
  std::vector<checkpoint::ModuleInfo> modules(int64_t, checkpoint::ModuleRole) const override { return {}; }
  LinearGroup fused_expert(const std::string&, int64_t, bool) const override { throw FormatError("unexpected expert"); }
};

TEST(CudaDecoderHost, RefusesWhatTheGpuDecoderDoesNotRunBeforeTouchingTheGpu) {
  ModelConfig moe;
  moe.architecture_name = "MixtralForCausalLM";
  moe.head_dim = 64;
  moe.moe.num_experts = 8;
  const NoWeights none;
  try {
    CudaDecoder decoder(moe, none);
    FAIL() << "MoE accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("MixtralForCausalLM: mixture-of-experts"), std::string::npos) << e.what();
  }
  ModelConfig sinks;
  sinks.architecture_name = "GptOssForCausalLM";
  sinks.head_dim = 64;
  sinks.attention_sinks = true;
  EXPECT_THROW((void)CudaDecoder(sinks, none), UnsupportedError);
  ModelConfig wide;
  wide.architecture_name = "LlamaForCausalLM";
  wide.head_dim = 512;
  EXPECT_THROW((void)CudaDecoder(wide, none), UnsupportedError);
  if (have_gpu()) return;
  ModelConfig dense;
  dense.architecture_name = "LlamaForCausalLM";
  dense.head_dim = 64;
  EXPECT_THROW((void)CudaDecoder(dense, none), UsageError);  // no GPU: refused before any weight is read
}

std::vector<int32_t> ids_of(const checkpoint::SafetensorsFile& golden, const std::string& name) {
  const auto view = golden.view(*golden.find(name));
  std::vector<int32_t> ids(static_cast<size_t>(view.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(view.load<int64_t>(i));
  return ids;
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// Prefill with all logits, then `steps` greedy tokens one at a time through the cache.
struct Trace {
  std::vector<float> prefill;
  std::vector<int32_t> greedy;
};
Trace run_model(const ForwardModel& model, const std::vector<int32_t>& ids, int steps) {
  KvCache cache = model.make_cache(64, 2);
  const int slot = cache.acquire();
  cache.release(slot);
  const int used = cache.acquire();  // the same slot again: stale contents must not matter
  Trace r;
  const SequenceChunk chunk{used, 0, ids, true};
  r.prefill = model.forward(std::span(&chunk, 1), cache);
  const int64_t vocab = model.config().vocab_size;
  int32_t token = argmax(r.prefill.data() + (ids.size() - 1) * static_cast<size_t>(vocab), vocab);
  auto position = static_cast<int64_t>(ids.size());
  for (int s = 0; s < steps; ++s) {
    r.greedy.push_back(token);
    const SequenceChunk next{used, position++, std::span(&r.greedy.back(), 1), false};
    const std::vector<float> logits = model.forward(std::span(&next, 1), cache);
    token = argmax(logits.data(), vocab);
  }
  return r;
}

class CudaDecoderParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDecoderParity, LogitsAndGreedyTokensMatchTheCpuDecoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const fs::path dir = kRef / GetParam();
  if (!fs::exists(dir / "golden.safetensors")) GTEST_SKIP() << dir << " is not in this checkout";
  LoadOptions options;
  options.progress = false;
  const LoadedModel cpu = load_model(dir, options);
  options.device = "cuda";
  options.gpu_run = true;
  const LoadedModel gpu = load_model(dir, options);
  ASSERT_NE(gpu.gpu_decoder, nullptr);
  const checkpoint::SafetensorsFile golden(dir / "golden.safetensors");
  for (const std::string prompt : {"prompt0", "prompt1"}) {
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = ids_of(golden, prompt);
    const Trace want = run_model(cpu.forward_model(), ids, 8);
    const Trace got = run_model(gpu.forward_model(), ids, 8);
    ASSERT_EQ(got.prefill.size(), want.prefill.size());
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < want.prefill.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(want.prefill[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got.prefill[i]) - want.prefill[i]));
    }
    // The GPU GEMMs read bf16 activations (relative rounding 2^-9 per element) where the CPU reads fp32: the
    // bound is the CPU path's own bound against transformers (2e-2 · max|logit|, decoder_parity_test.cpp).
    EXPECT_LE(max_diff, 2e-2 * max_ref) << "max|Δ| = " << max_diff << ", max|logit| = " << max_ref;
    std::ostringstream rel;
    rel << std::scientific << std::setprecision(2) << max_diff / max_ref;
    RecordProperty(prompt + "_max_rel_diff", rel.str());
    std::cout << "[cuda-parity] " << GetParam() << " " << prompt << " max|dlogit|/max|logit| = " << rel.str() << "\n";
    EXPECT_EQ(got.greedy, want.greedy);
  }
}

INSTANTIATE_TEST_SUITE_P(DenseFixtures, CudaDecoderParity,
                         ::testing::Values("llama-bf16", "llama-nvfp4a16", "llama-mxfp4a16", "llama-nvfp4",
                                           "llama-modelopt-w4a16-nvfp4", "qwen2-nvfp4a16", "qwen3-nvfp4a16",
                                           "granite-nvfp4a16"),
                         [](const auto& fixture) {
                           std::string name = fixture.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace fp4serve::model
