// SPDX-License-Identifier: Apache-2.0
// The real server on 127.0.0.1 with the tiny llama-nvfp4a16 fixture (tokenizer + ChatML template): 16 concurrent
// streaming chat clients must receive exactly the greedy tokens that runtime::generate, the sequential
// single-request loop, produces for the same prompts — batching must not change results; in batch-invariant mode
// 32 concurrent completions also carry the logprobs of the same requests sent one at a time, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <atomic>
#include <thread>

#include "backends/cpu/kernels/batch_invariant.h"
#include "backends/cpu/kernels/gemm_shared.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/load_model.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"
#include "server/decoder_step_model.h"
#include "server/server_harness.h"
#include "server/tokenizer_codec.h"
#include "text/chat_template.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;

// Records the widest step so the test proves requests really shared forwards.
class CountingStepModel final : public StepModel {
 public:
  explicit CountingStepModel(StepModel& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  model::KvCache& cache() override { return inner_.cache(); }
  const model::KvCache& cache() const override { return inner_.cache(); }
  std::vector<float> forward(std::span<const StepChunk> chunks) override {
    max_chunks = std::max(max_chunks.load(), chunks.size());
    return inner_.forward(chunks);
  }
  std::atomic<size_t> max_chunks{0};

 private:
  StepModel& inner_;
};

TEST(ServerEndToEnd, SixteenConcurrentStreamsEqualSequentialGreedy) {
  const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/ref/llama-nvfp4a16";
  model::LoadOptions load;
  const model::LoadedModel loaded = model::load_model(dir, load);
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto chat_template = text::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
  const json context = runtime::template_context(tokenizer, loaded.checkpoint);
  const auto eos = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
  const TokenizerCodec codec(tokenizer, chat_template, context, eos);
  constexpr int64_t kContext = 256;
  constexpr int64_t kMaxTokens = 20;

  std::vector<std::string> questions;
  for (int i = 0; i < 16; ++i) {
    std::string q = fmt::format("Question {}: what comes after", i);
    for (int k = 0; k <= i; ++k) q += fmt::format(" {}", i * 7 + k * 3);
    questions.push_back(q + "?");
  }

  // Sequential reference: one request at a time through the plain generation loop.
  std::vector<std::vector<int32_t>> expected;
  {
    model::KvCache cache = loaded.decoder->make_cache(kContext, 1);
    for (const auto& q : questions) {
      runtime::GenerationRequest req;
      req.prompt = codec.encode(codec.render_chat({{"user", q}}), false);
      req.sampling.temperature = 0.0f;
      req.max_new_tokens = kMaxTokens;
      req.eos_token_ids = eos;
      expected.push_back(runtime::generate(*loaded.decoder, cache, tokenizer, req, [](std::string_view) { return true; }).tokens);
      ASSERT_FALSE(expected.back().empty()) << q;  // an empty reference would make the comparison vacuous
    }
  }

  DecoderStepModel decoder_model(*loaded.decoder, kContext, 16);
  CountingStepModel step_model(decoder_model);
  testing::ServerSetup setup;
  setup.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 64, .max_queue = 32};
  setup.context_length = kContext;
  testing::RunningServer server(step_model, codec, setup);
  std::vector<testing::StreamResult> results(16);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      auto cli = server.client();
      results[i] = testing::post_stream(*cli, "/v1/chat/completions",
                                        {{"messages", json::array({{{"role", "user"}, {"content", questions[i]}}})},
                                         {"max_tokens", kMaxTokens}, {"temperature", 0}, {"stream", true},
                                         {"return_token_ids", true}});
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < 16; ++i) {
    ASSERT_EQ(results[i].status, 200) << results[i].error;
    ASSERT_TRUE(results[i].done);
    std::vector<int32_t> ids;
    for (const auto& c : results[i].chunks) {
      for (const auto& id : c["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
    }
    EXPECT_EQ(ids, expected[i]) << "client " << i;
  }
  EXPECT_GT(step_model.max_chunks.load(), 1u) << "no forward step batched several sequences";
}


// Issue 19, finding 7: a seeded sampled request gives the same tokens alone and beside 11 other requests. Batched
// forwards run other kernel shapes, so the logits differ in the last bits; the draw must not hinge on that.
TEST(ServerEndToEnd, SeededSampledRequestIsBatchInvariant) {
  const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/ref/llama-nvfp4a16";
  model::LoadOptions load;
  const model::LoadedModel loaded = model::load_model(dir, load);
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto chat_template = text::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
  const json context = runtime::template_context(tokenizer, loaded.checkpoint);
  const auto eos = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
  const TokenizerCodec codec(tokenizer, chat_template, context, eos);
  DecoderStepModel decoder_model(*loaded.decoder, 128, 12);
  CountingStepModel step_model(decoder_model);
  testing::ServerSetup setup;
  setup.scheduler = {.max_num_seqs = 12, .max_num_batched_tokens = 256, .max_queue = 32};
  setup.context_length = 128;
  testing::RunningServer server(step_model, codec, setup);
  auto ids = [](const httplib::Result& r) {
    std::vector<int32_t> out;
    if (!r || r->status != 200) {
      ADD_FAILURE() << (r ? r->body : httplib::to_string(r.error()));
      return out;
    }
    const json doc = json::parse(r->body);
    for (const auto& id : doc["choices"][0]["token_ids"]) out.push_back(id.get<int32_t>());
    return out;
  };
  int differ = 0;
  for (uint64_t seed = 102; seed < 103; ++seed) {
    const std::string body = json{{"prompt", "A poem about quantum computers:"}, {"max_tokens", 16},
                                  {"temperature", 1.0}, {"seed", seed}, {"ignore_eos", true},
                                  {"return_token_ids", true}}.dump();
    auto cli = server.client();
    const auto alone = ids(cli->Post("/v1/completions", body, "application/json"));
    ASSERT_EQ(alone.size(), 16u) << body;
    std::vector<std::thread> others;
    std::atomic<int> started{0};
    for (int i = 0; i < 11; ++i) {
      others.emplace_back([&, i] {
        auto c = server.client();
        ++started;
        c->Post("/v1/completions", json{{"prompt", fmt::format("Other request number {}", i)}, {"max_tokens", 20},
                                        {"temperature", 1.0}, {"ignore_eos", true}}.dump(), "application/json");
      });
    }
    while (started < 11) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto batched = ids(cli->Post("/v1/completions", body, "application/json"));
    for (auto& t : others) t.join();
    differ += alone != batched;
    EXPECT_EQ(alone, batched) << "seed " << seed;
  }
  EXPECT_EQ(differ, 0);
  EXPECT_GT(step_model.max_chunks.load(), 1u) << "no forward step batched several sequences";
}

// Issue 43, item 5: with --batch-invariant (LoadOptions::batch_invariant), 32 greedy completions sent at once give
// the tokens and logprobs (top 2 included) that the same requests give one at a time, bit for bit, on every SIMD
// target, with the
// fixture's defaults (bfloat16: bf16 activations where the CPU has AVX512-BF16, a bf16 KV cache). The concurrent
// run batches up to 32 decode rows per step and cuts prompts into chunks of a 64-token budget beside them, so the
// GEMMs see every m from 1 to 64 and the attention every chunking. The default mode (the code before the mode existed)
// fails this comparison: run with batch_invariant = false, all 32 requests' logprobs differed in their last bits
// (the tokens agreed: this fixture has no near-tie).
TEST(ServerEndToEnd, BatchInvariantModeConcurrentEqualsSequentialTokensAndLogprobs) {
  const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/ref/llama-nvfp4a16";
  model::LoadOptions load;
  load.batch_invariant = true;
  const model::LoadedModel loaded = model::load_model(dir, load);
  struct ModeOff {  // the switch is process-wide: later tests load their own models, but leave it off regardless
    ~ModeOff() { kernels::set_batch_invariant(false); }
  } mode_off;
  ASSERT_TRUE(kernels::batch_invariant());
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  const auto chat_template = text::ChatTemplate::from_tokenizer_config(loaded.checkpoint.tokenizer_config());
  const json context = runtime::template_context(tokenizer, loaded.checkpoint);
  const auto eos = runtime::eos_token_ids(loaded.config, loaded.checkpoint, tokenizer);
  const TokenizerCodec codec(tokenizer, chat_template, context, eos);
  constexpr int kRequests = 32;
  DecoderStepModel decoder_model(*loaded.decoder, 256, kRequests);
  CountingStepModel step_model(decoder_model);
  testing::ServerSetup setup;
  setup.scheduler = {.max_num_seqs = kRequests, .max_num_batched_tokens = 64, .max_queue = 64};
  setup.context_length = 256;
  testing::RunningServer server(step_model, codec, setup);

  std::vector<std::string> bodies;
  for (int i = 0; i < kRequests; ++i) {
    std::string prompt = fmt::format("Request {} counts:", i);
    for (int k = 0; k < 1 + (i * 5) % 17; ++k) prompt += fmt::format(" {}", (i * 13 + k * 7) % 100);
    bodies.push_back(json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 2},
                          {"ignore_eos", true}, {"return_token_ids", true}}.dump());
  }
  // What a request's answer must match: its token ids and its whole logprobs object.
  const auto answer = [](const httplib::Result& r) {
    if (!r || r->status != 200) {
      ADD_FAILURE() << (r ? r->body : httplib::to_string(r.error()));
      return json();
    }
    const json doc = json::parse(r->body);
    return json{{"token_ids", doc["choices"][0]["token_ids"]}, {"logprobs", doc["choices"][0]["logprobs"]}};
  };
  // Sequential, then concurrent, on the SIMD target (and bf16 pair switch) the kernels dispatch to now.
  const auto compare = [&] {
    std::vector<json> alone;
    step_model.max_chunks = 0;
    for (const std::string& body : bodies) {
      auto cli = server.client();
      alone.push_back(answer(cli->Post("/v1/completions", body, "application/json")));
      ASSERT_EQ(alone.back()["token_ids"].size(), 12u) << body;
    }
    EXPECT_EQ(step_model.max_chunks.load(), 1u) << "the sequential requests shared a step";
    std::vector<json> together(kRequests);
    std::vector<std::thread> clients;
    for (int i = 0; i < kRequests; ++i) {
      clients.emplace_back([&, i] {
        auto cli = server.client();
        together[static_cast<size_t>(i)] =
            answer(cli->Post("/v1/completions", bodies[static_cast<size_t>(i)], "application/json"));
      });
    }
    for (auto& t : clients) t.join();
    int differ = 0;
    for (int i = 0; i < kRequests; ++i) {
      const auto at = static_cast<size_t>(i);
      differ += alone[at] != together[at];
      EXPECT_EQ(alone[at]["token_ids"], together[at]["token_ids"]) << "request " << i;
      EXPECT_EQ(alone[at]["logprobs"], together[at]["logprobs"]) << "request " << i;
    }
    EXPECT_EQ(differ, 0) << "of " << kRequests << " requests";
    EXPECT_GT(step_model.max_chunks.load(), 8u) << "the concurrent requests did not share steps";
  };
  // Every SIMD target the kernels were compiled for and this CPU runs (as the kernel tests iterate them), and where
  // the GEMV takes AVX512-BF16 pairs, once more with them off. The portable fallback (EMU128 / SCALAR: the scalar
  // reference GEMM and row-by-row attention: this test passed there too, in 80 s on a 2-core machine, too slow for
  // every run) is left to the kernel tests (LinearBatchInvariant, AttentionBatchInvariant), which cover it row for row.
  int simd_targets = 0;
  for (const int64_t target : kernels::gemm_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    if (kernels::gemv_max_rows() == 0) continue;
    ++simd_targets;
    compare();
    if (kernels::bf16_dot_active()) {
      kernels::set_bf16_dot_allowed(false);
      SCOPED_TRACE("bf16 pairs off");
      compare();
      kernels::set_bf16_dot_allowed(true);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GT(simd_targets, 0);
}

}  // namespace
}  // namespace fp4serve::server
