// SPDX-License-Identifier: Apache-2.0
// The near-tie rule of greedy_check.h on hand-made logits (host only), and — on a GPU — teacher-forced greedy
// decoding of the GPU decoder against the CPU decoder (the oracle, itself matched to transformers) with that rule:
// on the dense reference fixtures, or on the model folder named by FP4SERVE_GREEDY_MODEL (scripts/device-check.sh
// passes the SmolLM2-shaped random model there) for FP4SERVE_GREEDY_TOKENS steps (default 8). Each mismatch
// prints its margin; only a margin > 1e-3 · max|logit| fails.
#include "backends/cuda/kernels/greedy_check.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "backends/cuda/kernels/device.h"
#include "backends/load_model.h"

namespace fp4serve::testing {
namespace {

TEST(GreedyCheck, AgreementTiesAndRealMismatches) {
  const std::vector<float> ref = {0.5f, 10.0f, 9.9995f, -20.0f};  // max|logit| 20, tolerance 0.02
  const std::vector<float> same = {0.0f, 3.0f, 2.0f, 1.0f};
  const std::vector<float> swapped = {0.0f, 2.0f, 3.0f, 1.0f};  // picks token 2: margin 5e-4 ≤ 0.02
  const std::vector<float> wrong = {9.0f, 2.0f, 3.0f, 1.0f};    // picks token 0: margin 9.5 > 0.02
  const GreedyStep a = compare_greedy_step(ref, same);
  EXPECT_EQ(a.want, 1);
  EXPECT_EQ(a.got, 1);
  EXPECT_FALSE(a.failed);
  EXPECT_EQ(a.margin, 0.0);
  const GreedyStep b = compare_greedy_step(ref, swapped);
  EXPECT_EQ(b.got, 2);
  EXPECT_NEAR(b.margin, 10.0 - 9.9995, 1e-6);
  EXPECT_DOUBLE_EQ(b.max_abs, 20.0);
  EXPECT_FALSE(b.failed) << "a near tie is not a failure";
  const GreedyStep c = compare_greedy_step(ref, wrong);
  EXPECT_TRUE(c.failed);
  EXPECT_NEAR(c.margin, 9.5, 1e-6);
  // The tolerance is relative to max|logit|: the same swap fails under a tighter one.
  EXPECT_TRUE(compare_greedy_step(ref, swapped, 1e-5).failed);
  const std::vector<float> nan_ref = {1.0f, NAN, 0.5f};
  EXPECT_TRUE(compare_greedy_step(nan_ref, std::vector<float>{0.0f, 0.0f, 1.0f}).failed);

  const GreedySummary s = summarize_greedy({a, b, c});
  EXPECT_EQ(s.agreed, 1);
  EXPECT_EQ(s.ties, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_NEAR(s.worst_relative_margin, 9.5 / 20.0, 1e-6);
  EXPECT_NE(s.report.find("step 1: want 1 got 2"), std::string::npos) << s.report;
  EXPECT_NE(s.report.find("FAIL"), std::string::npos) << s.report;
}

namespace fs = std::filesystem;

// Teacher-forced: both models see the CPU's greedy token at every step.
GreedySummary teacher_forced(const model::ForwardModel& cpu, const model::ForwardModel& gpu,
                             std::vector<int32_t> ids, int steps) {
  model::KvCache cpu_cache = cpu.make_cache(static_cast<int64_t>(ids.size()) + steps + 1, 1);
  model::KvCache gpu_cache = gpu.make_cache(static_cast<int64_t>(ids.size()) + steps + 1, 1);
  const int cs = cpu_cache.acquire(), gs = gpu_cache.acquire();
  std::vector<GreedyStep> out;
  int64_t position = 0;
  std::vector<int32_t> feed = ids;
  for (int s = 0; s < steps; ++s) {
    const model::SequenceChunk a{cs, position, feed, false};
    const model::SequenceChunk b{gs, position, feed, false};
    const std::vector<float> ref = cpu.forward(std::span(&a, 1), cpu_cache);
    const std::vector<float> got = gpu.forward(std::span(&b, 1), gpu_cache);
    out.push_back(compare_greedy_step(ref, got));
    position += static_cast<int64_t>(feed.size());
    feed = {out.back().want};
  }
  return summarize_greedy(out);
}

void check_model(const fs::path& dir, std::vector<int32_t> prompt, int steps) {
  model::LoadOptions options;
  options.kv_cache_dtype = model::KvCacheDtype::F32;  // the GPU's cache: the oracle must not differ by a 16-bit cache's rounding
  const model::LoadedModel cpu = model::load_model(dir, options);
  options.device = plan::DeviceChoice::Cuda;
  const model::LoadedModel gpu = model::load_model(dir, options);
  const int64_t vocab = cpu.decoder->config().vocab_size;
  for (auto& id : prompt) id = static_cast<int32_t>(id % vocab);
  const GreedySummary s = teacher_forced(*cpu.decoder, *gpu.decoder, prompt, steps);
  std::cout << "[cuda-greedy] " << dir.filename().string() << ": " << steps << " steps, " << s.agreed
            << " agree, " << s.ties << " near ties, " << s.failed << " fail; worst margin "
            << s.worst_relative_margin << " of max|logit|\n"
            << s.report;
  EXPECT_EQ(s.failed, 0) << s.report;
}

TEST(CudaGreedyParity, TeacherForcedGreedyMatchesTheCpuUpToNearTies) {
  if (!kernels::cuda::cuda_device(0)) GTEST_SKIP() << "no CUDA GPU on this machine";
  const std::vector<int32_t> prompt = {1, 504, 3458, 282, 4649, 314, 260, 7791};
  const char* dir = std::getenv("FP4SERVE_GREEDY_MODEL");
  const char* tokens = std::getenv("FP4SERVE_GREEDY_TOKENS");
  const int steps = tokens != nullptr ? std::max(1, std::atoi(tokens)) : 8;
  if (dir != nullptr && *dir != '\0') {
    check_model(dir, prompt, steps);
    return;
  }
  for (const char* fixture : {"llama-nvfp4a16", "llama-mxfp4a16", "qwen3-nvfp4a16"}) {
    SCOPED_TRACE(fixture);
    check_model(fs::path(FP4SERVE_TEST_DATA) / "ref" / fixture, prompt, steps);
  }
}

}  // namespace
}  // namespace fp4serve::testing
