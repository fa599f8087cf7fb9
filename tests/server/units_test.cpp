// SPDX-License-Identifier: Apache-2.0
// The server's pure units: request parsing and mapping, response shapes, SSE framing and parsing, Prometheus
// rendering, and the bench report statistics (against numpy.percentile values worked out by hand).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fp4serve/error.h"
#include "server/bench_client.h"
#include "server/decoder_step_model.h"
#include "server/fakes.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/sse.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;

// A block holds keys and values of every layer and KV head for 16 positions: 2 · 30 · 3 · 64 · 16 elements here
// (the default model), 720 KiB in fp32 and 360 KiB in bf16 / fp16; one sequence of 2048 positions needs 128.
TEST(KvBudget, BlocksFollowTheCacheElement) {
  model::ModelConfig config;
  config.num_layers = 30;
  config.num_kv_heads = 3;
  config.head_dim = 64;
  const int64_t budget = int64_t{200} << 20;
  EXPECT_EQ(kv_blocks_for_budget(config, 2048, budget, model::KvCacheDtype::F32), (int64_t{200} << 20) / 737280);
  EXPECT_EQ(kv_blocks_for_budget(config, 2048, budget, model::KvCacheDtype::Bf16), (int64_t{200} << 20) / 368640);
  EXPECT_EQ(kv_blocks_for_budget(config, 2048, budget, model::KvCacheDtype::F16), (int64_t{200} << 20) / 368640);
  EXPECT_EQ(kv_blocks_for_budget(config, 2048, budget, model::KvCacheDtype::F32, 32), (int64_t{200} << 20) / 1474560);
  // 50 MiB: 71 fp32 blocks cannot hold one 2048-position sequence (128 blocks), 142 bf16 ones can.
  EXPECT_THROW(kv_blocks_for_budget(config, 2048, int64_t{50} << 20, model::KvCacheDtype::F32), UsageError);
  EXPECT_EQ(kv_blocks_for_budget(config, 2048, int64_t{50} << 20, model::KvCacheDtype::Bf16), 142);
}

// --gpu-memory-utilization F: ⌊F · total⌋ − used, worked out by hand; F outside (0, 1], an unknown total and a
// fraction the process already fills are refused naming the flag.
std::string budget_error(double fraction, int64_t total, int64_t used) {
  try {
    (void)kv_budget_for_utilization(fraction, total, used);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(KvBudget, FractionOfTheDeviceLessWhatTheModelHolds) {
  const int64_t gib = int64_t{1} << 30;
  EXPECT_EQ(kv_budget_for_utilization(0.5, 24 * gib, 3 * gib), 9 * gib);
  EXPECT_EQ(kv_budget_for_utilization(1.0, 80 * gib, 0), 80 * gib);
  EXPECT_EQ(kv_budget_for_utilization(0.9, 1000, 100), 800);
  for (const double bad : {0.0, -0.1, 1.01, 2.0, std::nan("")}) {
    EXPECT_NE(budget_error(bad, 24 * gib, gib).find("expected a fraction of the device's memory in (0, 1]"),
              std::string::npos) << bad;
  }
  EXPECT_NE(budget_error(0.5, 0, 0).find("does not report the device's total memory"), std::string::npos);
  // 0.1 of 24 GiB is 2.4 GiB, less than the 3 GiB already held: 4 GiB of 24 (0.17) would leave 1 GiB.
  EXPECT_NE(budget_error(0.1, 24 * gib, 3 * gib)
                .find("--gpu-memory-utilization 0.1: 2.40 GiB of the device's 24.00 GiB, but the process already "
                      "holds 3.00 GiB after loading, which leaves nothing for the KV cache (about 0.17 leaves 1 GiB"),
            std::string::npos)
      << budget_error(0.1, 24 * gib, 3 * gib);
  EXPECT_THROW(kv_budget_for_utilization(0.125, 24 * gib, 3 * gib), UsageError);  // exactly 3 GiB: nothing left
}

TEST(OpenAiApi, ParsesCompletionFields) {
  const auto r = parse_request(Endpoint::kCompletions, R"({"model": "m", "prompt": "hi", "max_tokens": 7,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -1, "stop": "##", "stream": true,
      "stream_options": {"include_usage": true}, "ignore_eos": true, "n": 1, "logprobs": null, "user": "x"})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, ~uint64_t{0});
  EXPECT_EQ(r.stop, std::vector<std::string>{"##"});
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
}

TEST(OpenAiApi, TokenIdPromptsAndChatParts) {
  EXPECT_EQ(parse_request(Endpoint::kCompletions, R"({"prompt": [5, 6, 7]})").prompt_ids, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(parse_request(Endpoint::kCompletions, R"({"prompt": [[8, 9]]})").prompt_ids, (std::vector<int64_t>{8, 9}));
  const auto chat = parse_request(Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null}], "max_completion_tokens": 3})");
  ASSERT_EQ(chat.messages.size(), 2u);
  EXPECT_EQ(chat.messages[0].content, "ab");
  EXPECT_EQ(chat.messages[1].content, "");
  EXPECT_EQ(chat.max_tokens, 3);
}

TEST(OpenAiApi, ErrorsNameTheField) {
  try {
    parse_request(Endpoint::kCompletions, R"({"prompt": "a", "top_p": 2})");
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "top_p");
    const json b = e.body();
    EXPECT_EQ(b["error"]["param"], "top_p");
    EXPECT_EQ(b["error"]["type"], "invalid_request_error");
    EXPECT_NE(b["error"]["message"].get<std::string>().find("top_p"), std::string::npos);
  }
}

TEST(OpenAiApi, MapsToSequenceRequestWithinContext) {
  testing::ByteCodec codec;
  runtime::SamplingParams defaults;
  defaults.temperature = 0.7f;
  defaults.top_k = 20;
  const ServeLimits limits{"m", 16, defaults, std::nullopt, nullptr};
  const auto now = Clock::now();
  auto seq = to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcd", "temperature": 0})"),
                                 codec, limits, now);
  EXPECT_EQ(seq.prompt, (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
  EXPECT_EQ(seq.max_new_tokens, 12);  // the rest of the context
  EXPECT_EQ(seq.sampling.temperature, 0.0f);
  EXPECT_EQ(seq.sampling.top_k, 20);  // default kept
  EXPECT_EQ(seq.eos_token_ids, std::vector<int32_t>{testing::kEos});
  EXPECT_THROW(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcd", "max_tokens": 13})"),
                                   codec, limits, now), ApiError);
  EXPECT_EQ(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcd", "max_tokens": 12})"),
                                codec, limits, now).max_new_tokens, 12);
  EXPECT_THROW(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "a", "model": "z"})"),
                                   codec, limits, now), ApiError);
}

// A generation config's max_new_tokens is the default max_tokens (vLLM's default_max_tokens), capped by the context
// left; a request's max_tokens overrides it either way.
TEST(OpenAiApi, DefaultMaxTokensFromTheGenerationConfig) {
  testing::ByteCodec codec;
  ServeLimits limits{"m", 16, {}, 5, nullptr};
  const auto now = Clock::now();
  EXPECT_EQ(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcd"})"), codec, limits, now)
                .max_new_tokens,
            5);
  EXPECT_EQ(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcdefghijklm"})"), codec, limits,
                                now).max_new_tokens,
            3);  // 16 − 13 left
  EXPECT_EQ(to_sequence_request(parse_request(Endpoint::kCompletions, R"({"prompt": "abcd", "max_tokens": 9})"), codec,
                                limits, now).max_new_tokens,
            9);
}

TEST(OpenAiApi, ResponseShapes) {
  const std::vector<int32_t> ids{1, 2};
  const json c = response_json(Endpoint::kChatCompletions, "id1", "m", 5, "hey", "stop", {3, 2}, &ids);
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_EQ(c["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(c["choices"][0]["token_ids"], json(ids));
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  const json k = chunk_json(Endpoint::kCompletions, "id2", "m", 5, "x", std::nullopt, true, nullptr);
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(k["choices"][0]["text"], "x");
  EXPECT_FALSE(k["choices"][0].contains("token_ids"));
}

TEST(Sse, FramingAndParsingInPieces) {
  const std::string stream = sse_event(json{{"a", "line\nbreak"}}) + ": comment\n\n" + "data: x\r\ndata: y\r\n\r\n" +
                             std::string(kSseDone);
  EXPECT_EQ(stream.find("\n"), stream.find("\n\n"));  // the JSON newline is escaped, not raw
  // Feed byte by byte: events must come out whole and in order.
  SseParser parser;
  std::vector<std::string> events;
  for (const char ch : stream) {
    for (auto& e : parser.push(std::string_view(&ch, 1))) events.push_back(e);
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(json::parse(events[0])["a"], "line\nbreak");
  EXPECT_EQ(events[1], "x\ny");
  EXPECT_EQ(events[2], "[DONE]");
  EXPECT_EQ(parser.pending(), 0u);
}

TEST(Metrics, HistogramIsCumulativeWithLeBounds) {
  Histogram h({0.1, 1.0});
  for (const double v : {0.05, 0.1, 0.5, 1.0, 3.0}) h.observe(v);
  std::string out;
  h.render(out, "x", "m=\"a\"");
  // le="0.1" counts 0.05 and 0.1 (≤), le="1" adds 0.5 and 1.0, +Inf everything; sum 4.65.
  EXPECT_EQ(out, "x_bucket{m=\"a\",le=\"0.1\"} 2\nx_bucket{m=\"a\",le=\"1\"} 4\nx_bucket{m=\"a\",le=\"+Inf\"} 5\n"
                 "x_sum{m=\"a\"} 4.65\nx_count{m=\"a\"} 5\n");
}

TEST(Metrics, RenderHasEveryFamilyOnce) {
  Metrics m;
  m.set_model_name("my \"model\"");
  m.count_request(200);
  m.count_request(400);
  m.count_request(400);
  m.add_prompt_tokens(11);
  m.add_generation_tokens(7);
  m.observe_ttft(0.3);
  m.set_scheduler_state(3, 2, 3, 4, 99);
  m.observe_queue_time(0.2);
  m.observe_iteration_tokens(40);
  m.observe_request(RequestTimes{.prefill = 0.4, .decode = 1.2, .inference = 1.6, .prompt_tokens = 11, .generation_tokens = 7});
  const std::string text = m.render();
  const std::string l = "model_name=\"my \\\"model\\\"\"";  // the quotes escaped
  EXPECT_NE(text.find("fp4serve_requests_total{" + l + ",status=\"400\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fp4serve_prompt_tokens_total{" + l + "} 11\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_generation_tokens_total{" + l + "} 7\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_num_requests_running{" + l + "} 3\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_num_requests_waiting{" + l + "} 2\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_kv_cache_usage_perc{" + l + "} 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_time_to_first_token_seconds_count{" + l + "} 1\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_num_preemptions_total{" + l + "} 0\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_queue_time_seconds_sum{" + l + "} 0.2\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_prefill_time_seconds_sum{" + l + "} 0.4\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_decode_time_seconds_sum{" + l + "} 1.2\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_inference_time_seconds_sum{" + l + "} 1.6\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_prompt_tokens_bucket{" + l + ",le=\"20\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_prompt_tokens_bucket{" + l + ",le=\"10\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_request_generation_tokens_sum{" + l + "} 7\n"), std::string::npos);
  EXPECT_NE(text.find("fp4serve_iteration_tokens_total_bucket{" + l + ",le=\"64\"} 1\n"), std::string::npos);
  // The process's memory (read at render time): resident, peak (≥ resident) and anonymous, all above zero here.
  for (const char* gauge : {"fp4serve_process_resident_memory_bytes", "fp4serve_process_peak_resident_memory_bytes",
                            "fp4serve_process_anonymous_memory_bytes"}) {
    const auto at = text.find(std::string(gauge) + "{" + l + "} ");
    ASSERT_NE(at, std::string::npos) << gauge;
    EXPECT_GT(std::stoll(text.substr(text.find("} ", at) + 2)), 0) << gauge;
  }
  for (const char* family : {"fp4serve_requests_total", "fp4serve_time_to_first_token_seconds",
                             "fp4serve_inter_token_latency_seconds", "fp4serve_kv_cache_usage_perc",
                             "fp4serve_request_queue_time_seconds", "fp4serve_iteration_tokens_total"}) {
    const std::string type = std::string("# TYPE ") + family + " ";
    const auto first = text.find(type);
    ASSERT_NE(first, std::string::npos) << family;
    EXPECT_EQ(text.find(type, first + 1), std::string::npos) << family;
  }
}

TEST(BenchReport, PercentilesAsNumpy) {
  // numpy.percentile([3, 1, 4, 1, 5, 9, 2, 6], q): sorted 1 1 2 3 4 5 6 9, position q/100 · 7.
  const std::vector<double> v{3, 1, 4, 1, 5, 9, 2, 6};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.5);          // between 3 and 4
  EXPECT_NEAR(percentile(v, 99), 6 + 3 * 0.93, 1e-12);  // position 6.93
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 9.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
}

TEST(BenchReport, SummaryAsVllm) {
  RequestRecord a{.success = true, .error = {}, .prompt_len = 10, .output_tokens = 5, .ttft = 0.1, .latency = 0.5,
                  .itl = {0.1, 0.1, 0.1, 0.1}};
  RequestRecord b{.success = true, .error = {}, .prompt_len = 10, .output_tokens = 3, .ttft = 0.3, .latency = 0.7,
                  .itl = {0.2, 0.2}};
  RequestRecord c{.success = false, .error = "HTTP 500", .prompt_len = 10, .output_tokens = 0, .ttft = 0, .latency = 1,
                  .itl = {}};
  const auto r = summarize({a, b, c}, 2.0, 4);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.total_input, 20);
  EXPECT_EQ(r.total_output, 8);
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(r.output_throughput, 4.0);
  EXPECT_DOUBLE_EQ(r.total_token_throughput, 14.0);
  EXPECT_NEAR(r.mean_ttft_ms, 200.0, 1e-9);
  // TPOT: a (0.5 − 0.1) / 4 = 100 ms, b (0.7 − 0.3) / 2 = 200 ms.
  EXPECT_NEAR(r.mean_tpot_ms, 150.0, 1e-9);
  EXPECT_NEAR(r.mean_itl_ms, (4 * 100.0 + 2 * 200.0) / 6, 1e-9);
  EXPECT_NEAR(r.median_itl_ms, 100.0, 1e-9);
  EXPECT_EQ(r.errors, std::vector<std::string>{"HTTP 500"});
}

}  // namespace
}  // namespace fp4serve::server
