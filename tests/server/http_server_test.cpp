// SPDX-License-Identifier: Apache-2.0
// The HTTP server end to end on 127.0.0.1 over FakeModel + ByteCodec: response shapes, SSE framing, stop strings,
// a malformed-request corpus, API keys, queue-full 429, client disconnects, and 16 concurrent streaming clients
// that must receive exactly the sequential reference tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "server/bench_client.h"
#include "server/fakes.h"
#include "server/server_harness.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using namespace testing;
using namespace std::chrono_literals;

// The value of an unlabelled-but-for-model_name series.
std::string metric_line(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + "{model_name=\"test-model\"} ";
  const auto at = text.find(key);
  if (at == std::string::npos) return {};
  const auto end = text.find('\n', at + 1);
  return text.substr(at + key.size(), end - at - key.size());
}

TEST(HttpServer, HealthModelsMetrics) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  auto health = cli->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = cli->Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "test-model");
  EXPECT_EQ(m["data"][0]["max_model_len"], 256);
  auto metrics = cli->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("# TYPE fp4serve_time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_EQ(metric_line(metrics->body, "fp4serve_num_requests_running"), "0");
}

// Issue 43 item 4: the openai client's models.retrieve(id): the object /v1/models lists, or 404 model_not_found.
TEST(HttpServer, RetrieveModelById) {
  FakeModel model(2, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {}, "org/model-x");  // Hugging Face ids hold a slash
  auto cli = server.client();
  auto list = cli->Get("/v1/models");
  ASSERT_TRUE(list);
  const json listed = json::parse(list->body)["data"][0];
  for (const char* path : {"/v1/models/org/model-x", "/v1/models/org%2Fmodel-x"}) {
    auto r = cli->Get(path);
    ASSERT_TRUE(r) << path;
    ASSERT_EQ(r->status, 200) << path << ": " << r->body;
    const json m = json::parse(r->body);
    EXPECT_EQ(m["id"], "org/model-x");
    EXPECT_EQ(m["object"], "model");
    EXPECT_EQ(m["owned_by"], listed["owned_by"]);
    EXPECT_TRUE(m["created"].is_number_integer());
    EXPECT_EQ(m["created"], listed["created"]);  // one model, one creation time
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  }
  for (const char* path : {"/v1/models/other", "/v1/models/org", "/v1/models/"}) {
    auto r = cli->Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    const json e = json::parse(r->body, nullptr, false);
    EXPECT_EQ(e["error"]["code"], "model_not_found") << path << ": " << r->body;
    EXPECT_EQ(e["error"]["type"], "not_found_error") << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("does not exist"), std::string::npos) << r->body;
  }
}

TEST(HttpServer, CompletionMatchesReferenceWithUsage) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  const std::string prompt = "The quick brown fox";
  auto res = cli->Post("/v1/completions", json{{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", 12},
                                               {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}}.dump(),
                       "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json r = json::parse(res->body);
  const auto expect = reference_greedy(codec.encode(prompt, true), 12, true);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], bytes_text(expect));
  EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expect);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt.size() + 12);
}

// n = 3: three choices (index 0, 1, 2); greedy ones are identical; usage counts the prompt once.
// Streamed, each choice's chunks carry its index and concatenate to the same text.
TEST(HttpServer, SeveralChoicesWholeAndStreamed) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  const std::string prompt = "Three of them";
  const auto expect = bytes_text(reference_greedy(codec.encode(prompt, true), 10, true));
  int status = 0;
  json body = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}, {"n", 3}};
  const json r = post_json(*cli, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], expect);
    EXPECT_EQ(r["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 30);

  json chat = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 8},
               {"temperature", 0}, {"n", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  const StreamResult s = post_stream(*cli, "/v1/chat/completions", chat);
  ASSERT_TRUE(s.done) << s.raw;
  std::string text[2];
  int finishes = 0;
  for (const auto& c : s.chunks) {
    if (c["choices"].empty()) {
      EXPECT_EQ(c["usage"]["completion_tokens"].get<int>() % 2, 0) << c.dump();  // both choices counted
      continue;
    }
    const int index = c["choices"][0]["index"];
    ASSERT_TRUE(index == 0 || index == 1) << c.dump();
    text[index] += c["choices"][0]["delta"].value("content", "");
    if (!c["choices"][0]["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(finishes, 2);
  EXPECT_FALSE(text[0].empty());
  EXPECT_EQ(text[0], text[1]);
}

TEST(HttpServer, ChatUsesTemplateAndStreamsSse) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  const json body = {{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                               {{"role", "user"}, {"content", "Hello there"}}})},
                     {"max_tokens", 9}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
                     {"ignore_eos", true}};
  const auto s = post_stream(*cli, "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done);
  // Framing: every event is "data: <one line>\n\n" and the stream ends with the [DONE] event.
  ASSERT_GE(s.raw.size(), kSseDone.size());
  EXPECT_EQ(s.raw.substr(s.raw.size() - kSseDone.size()), kSseDone);
  size_t pos = 0;
  while (pos < s.raw.size()) {
    ASSERT_EQ(s.raw.compare(pos, 6, "data: "), 0) << "at byte " << pos;
    const auto end = s.raw.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(s.raw.substr(pos, end - pos).find('\n'), std::string::npos);
    pos = end + 2;
  }
  const std::string rendered = codec.render_chat({{"system", "Be brief."}, {"user", "Hello there"}});
  const auto expect = reference_greedy(codec.encode(rendered, false), 9, true);
  std::string text;
  ASSERT_GE(s.chunks.size(), 2u);
  EXPECT_EQ(s.chunks[0]["choices"][0]["delta"]["role"], "assistant");
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) {
    EXPECT_EQ(s.chunks[i]["object"], "chat.completion.chunk");
    text += s.chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, bytes_text(expect));
  EXPECT_EQ(s.chunks[s.chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  const json& usage = s.chunks.back()["usage"];
  EXPECT_TRUE(s.chunks.back()["choices"].empty());
  EXPECT_EQ(usage["prompt_tokens"], rendered.size());
  EXPECT_EQ(usage["completion_tokens"], 9);
}

TEST(HttpServer, StopStringEndsOutputBeforeIt) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  const std::string prompt = "Stop test prompt";
  const std::string full = bytes_text(reference_greedy(codec.encode(prompt, true), 40, true));
  const std::string stop = full.substr(10, 3);
  const std::string expect = full.substr(0, full.find(stop));
  for (const bool stream : {false, true}) {
    const json body = {{"prompt", prompt}, {"max_tokens", 40}, {"ignore_eos", true}, {"stop", json::array({"@@never@@", stop})},
                       {"stream", stream}};
    std::string text, reason;
    if (stream) {
      const auto s = post_stream(*cli, "/v1/completions", body);
      ASSERT_TRUE(s.done);
      for (const auto& c : s.chunks) {
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) reason = c["choices"][0]["finish_reason"];
      }
    } else {
      auto res = cli->Post("/v1/completions", body.dump(), "application/json");
      ASSERT_TRUE(res);
      const json r = json::parse(res->body);
      text = r["choices"][0]["text"];
      reason = r["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, expect) << "stream=" << stream;
    EXPECT_EQ(reason, "stop");
  }
  // The stopped sequences are dropped, not left running.
  EXPECT_TRUE(eventually([&] { return server.metrics().running() == 0 && server.metrics().slots_used() == 0; }));
}

struct BadCase {
  const char* name;
  const char* path;
  std::string body;
  int status;
};

std::vector<BadCase> malformed_corpus() {
  const std::string long_prompt(300, 'x');  // context is 256
  std::string nested(5000, '[');
  std::string oversized = R"({"prompt": ")" + std::string(70 * 1024, 'a') + R"("})";
  const char* c = "/v1/completions";
  const char* ch = "/v1/chat/completions";
  return {
      {"not json", c, "{", 400},
      {"empty body", c, "", 400},
      {"array body", c, "[]", 400},
      {"null body", c, "null", 400},
      {"string body", c, R"("prompt")", 400},
      {"number body", c, "42", 400},
      {"trailing garbage", c, R"({"prompt": "a"} x)", 400},
      {"invalid utf-8", c, "{\"prompt\": \"\xff\xfe\"}", 400},
      {"deep nesting", c, nested, 400},
      {"oversized body", c, oversized, 400},
      {"prompt missing", c, R"({"max_tokens": 4})", 400},
      {"prompt number", c, R"({"prompt": 5})", 400},
      {"prompt empty", c, R"({"prompt": ""})", 400},
      {"prompt empty list", c, R"({"prompt": []})", 400},
      {"several prompts", c, R"({"prompt": ["a", "b"]})", 400},
      {"fractional id", c, R"({"prompt": [1.5]})", 400},
      {"negative id", c, R"({"prompt": [-1]})", 400},
      {"id outside vocab", c, R"({"prompt": [65, 99999]})", 400},
      {"prompt of objects", c, R"({"prompt": [{"a": 1}]})", 400},
      {"model not string", c, R"({"prompt": "a", "model": 5})", 400},
      {"unknown model", c, R"({"prompt": "a", "model": "gpt-9"})", 404},
      {"max_tokens zero", c, R"({"prompt": "a", "max_tokens": 0})", 400},
      {"max_tokens negative", c, R"({"prompt": "a", "max_tokens": -3})", 400},
      {"max_tokens string", c, R"({"prompt": "a", "max_tokens": "10"})", 400},
      {"max_tokens fraction", c, R"({"prompt": "a", "max_tokens": 1.5})", 400},
      {"max_tokens huge float", c, R"({"prompt": "a", "max_tokens": 1e30})", 400},
      {"max_tokens u64 max", c, R"({"prompt": "a", "max_tokens": 18446744073709551615})", 400},
      {"max_tokens beyond context", c, R"({"prompt": "abcde", "max_tokens": 252})", 400},
      {"prompt beyond context", c, R"({"prompt": ")" + long_prompt + R"("})", 400},
      {"prompt fills context", c, R"({"prompt": ")" + std::string(256, 'y') + R"(", "max_tokens": 1})", 400},
      {"temperature negative", c, R"({"prompt": "a", "temperature": -1})", 400},
      {"temperature string", c, R"({"prompt": "a", "temperature": "hot"})", 400},
      {"temperature too high", c, R"({"prompt": "a", "temperature": 3})", 400},
      {"top_p zero", c, R"({"prompt": "a", "top_p": 0})", 400},
      {"top_p above one", c, R"({"prompt": "a", "top_p": 1.5})", 400},
      {"top_k string", c, R"({"prompt": "a", "top_k": "a"})", 400},
      {"presence_penalty range", c, R"({"prompt": "a", "presence_penalty": 3})", 400},
      {"n zero", c, R"({"prompt": "a", "n": 0})", 400},
      {"n beyond 128", c, R"({"prompt": "a", "n": 129})", 400},
      {"n beyond the batch", c, R"({"prompt": "a", "n": 17})", 400},
      {"best_of", c, R"({"prompt": "a", "best_of": 3})", 400},
      {"stream string", c, R"({"prompt": "a", "stream": "yes"})", 400},
      {"stream_options number", c, R"({"prompt": "a", "stream": true, "stream_options": 5})", 400},
      {"stop number", c, R"({"prompt": "a", "stop": 5})", 400},
      {"stop numbers", c, R"({"prompt": "a", "stop": [1, 2]})", 400},
      {"stop empty string", c, R"({"prompt": "a", "stop": [""]})", 400},
      {"seed string", c, R"({"prompt": "a", "seed": "x"})", 400},
      {"logprobs beyond 20", c, R"({"prompt": "a", "logprobs": 21})", 400},
      {"logit_bias not object", c, R"({"prompt": "a", "logit_bias": [1]})", 400},
      {"logit_bias out of range", c, R"({"prompt": "a", "logit_bias": {"65": 200}})", 400},
      {"logit_bias id outside vocab", c, R"({"prompt": "a", "logit_bias": {"99999": 1}})", 400},
      {"stop_token_ids outside vocab", c, R"({"prompt": "a", "stop_token_ids": [99999]})", 400},
      {"min_tokens above max_tokens", c, R"({"prompt": "a", "max_tokens": 2, "min_tokens": 3})", 400},
      {"unknown field", c, R"({"prompt": "a", "temprature": 0.5})", 400},
      {"echo", c, R"({"prompt": "a", "echo": true})", 400},
      {"chat messages missing", ch, R"({"max_tokens": 4})", 400},
      {"chat messages empty", ch, R"({"messages": []})", 400},
      {"chat messages string", ch, R"({"messages": "hi"})", 400},
      {"chat message not object", ch, R"({"messages": ["hi"]})", 400},
      {"chat role missing", ch, R"({"messages": [{"content": "hi"}]})", 400},
      {"chat role unknown", ch, R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400},
      {"chat content number", ch, R"({"messages": [{"role": "user", "content": 5}]})", 400},
      {"chat image part", ch, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", 400},
      {"chat top_logprobs without logprobs", ch, R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400},
      {"chat tools", ch, R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})", 400},
      {"chat max_completion_tokens zero", ch, R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", 400},
      {"unknown route", "/v1/embeddings", R"({"input": "a"})", 404},
  };
}

TEST(HttpServer, MalformedCorpusGetsOpenAiErrors) {
  FakeModel model(4, 256);
  ByteCodec codec;
  RunningServer server(model, codec, {});
  auto cli = server.client();
  const auto corpus = malformed_corpus();
  ASSERT_GE(corpus.size(), 30u);
  int n400 = 0;
  for (const auto& bc : corpus) {
    auto res = cli->Post(bc.path, bc.body, "application/json");
    ASSERT_TRUE(res) << bc.name << ": no response (" << httplib::to_string(res.error()) << ")";
    EXPECT_EQ(res->status, bc.status) << bc.name << ": " << res->body;
    const json err = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(err.is_object() && err.contains("error")) << bc.name << ": " << res->body;
    EXPECT_TRUE(err["error"]["message"].is_string()) << bc.name;
    EXPECT_EQ(err["error"]["type"], bc.status == 400 ? "invalid_request_error" : "not_found_error") << bc.name;
    EXPECT_TRUE(err["error"]["code"].is_null() || err["error"]["code"].is_string()) << bc.name;
    n400 += bc.status == 400;
  }
  // Nothing ran, nothing is stuck, and the server still answers a good request.
  EXPECT_EQ(model.steps.load(), 0);
  auto ok = cli->Post("/v1/completions", R"({"prompt": "fine", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  // Counted once the response is written (a connection the server closed may still be finishing).
  std::string text;
  EXPECT_TRUE(eventually([&] {
    auto m = cli->Get("/metrics");
    text = m ? m->body : std::string();
    const std::string l = "fp4serve_requests_total{model_name=\"test-model\",status=";
    return text.find(l + "\"400\"} " + std::to_string(n400) + "\n") != std::string::npos &&
           text.find(l + "\"404\"} 2\n") != std::string::npos &&
           text.find(l + "\"200\"} 1\n") != std::string::npos;
  })) << text.substr(0, 600);
}

TEST(HttpServer, ApiKeyGuardsV1Only) {
  FakeModel model(2, 128);
  ByteCodec codec;
  ServerSetup setup;
  setup.http.api_key = "s3cret";
  RunningServer server(model, codec, setup);
  auto cli = server.client();
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  auto none = cli->Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["type"], "authentication_error");
  auto wrong = cli->Post("/v1/completions", {{"Authorization", "Bearer nope"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto models = cli->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto right = cli->Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, body, "application/json");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
  auto health = cli->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(HttpServer, QueueFullIs429AndOthersUnaffected) {
  FakeModel model(1, 256);
  std::atomic<bool> hold{true}, entered{false};
  model.before_forward = [&] {
    entered = true;
    const auto until = std::chrono::steady_clock::now() + 10s;  // bounded even if the test fails
    while (hold && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  };
  ByteCodec codec;
  ServerSetup setup;
  setup.scheduler = {.max_num_seqs = 1, .max_num_batched_tokens = 64, .max_queue = 1};
  RunningServer server(model, codec, setup);
  const std::string body = R"({"prompt": "queued", "max_tokens": 4, "ignore_eos": true})";
  std::vector<int> statuses(2, 0);
  std::vector<std::thread> clients;
  auto launch = [&](int i) {
    clients.emplace_back([&, i] {
      auto cli = server.client();
      auto r = cli->Post("/v1/completions", body, "application/json");
      statuses[static_cast<size_t>(i)] = r ? r->status : -1;
    });
  };
  launch(0);  // admitted, then held inside the step
  EXPECT_TRUE(eventually([&] { return entered.load(); }));
  launch(1);  // fills the queue
  EXPECT_TRUE(eventually([&] { return server.metrics().waiting() == 1; }));
  auto cli = server.client();
  auto third = cli->Post("/v1/completions", body, "application/json");
  hold = false;
  for (auto& t : clients) t.join();
  ASSERT_TRUE(third) << httplib::to_string(third.error());
  EXPECT_EQ(third->status, 429);
  EXPECT_EQ(json::parse(third->body)["error"]["type"], "rate_limit_error");
  EXPECT_EQ(statuses[0], 200);
  EXPECT_EQ(statuses[1], 200);
}

TEST(HttpServer, DisconnectMidStreamFreesSlot) {
  FakeModel model(2, 4096);
  model.before_forward = [] { std::this_thread::sleep_for(2ms); };
  ByteCodec codec;
  ServerSetup setup;
  setup.context_length = 4096;
  RunningServer server(model, codec, setup);
  auto cli = server.client();
  const json body = {{"prompt", "a long story"}, {"max_tokens", 3000}, {"ignore_eos", true}, {"stream", true}};
  const auto s = post_stream(*cli, "/v1/completions", body, [](size_t n) { return n < 3; });
  EXPECT_FALSE(s.done);
  auto m = server.client();
  ASSERT_TRUE(eventually([&] {
    auto r = m->Get("/metrics");
    return r && metric_line(r->body, "fp4serve_num_requests_running") == "0" &&
           metric_line(r->body, "fp4serve_kv_cache_slots_used") == "0" &&
           r->body.find("fp4serve_request_success_total{model_name=\"test-model\",finished_reason=\"abort\"} 1") !=
               std::string::npos;
  })) << m->Get("/metrics")->body;
  const auto text = m->Get("/metrics")->body;
  EXPECT_LT(std::stoll(metric_line(text, "fp4serve_generation_tokens_total")), 3000);
}

TEST(HttpServer, SixteenConcurrentStreamsMatchSequential) {
  FakeModel model(16, 512);
  model.before_forward = [] { std::this_thread::sleep_for(1ms); };  // steps long enough for requests to overlap
  ByteCodec codec;
  ServerSetup setup;
  setup.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 24, .max_queue = 32};
  setup.context_length = 512;
  RunningServer server(model, codec, setup);
  std::mt19937 rng(2024);
  std::vector<std::string> prompts;
  for (int i = 0; i < 16; ++i) {
    std::string p = "prompt " + std::to_string(i) + ":";
    for (int k = 0; k < 5 + 3 * i; ++k) p += static_cast<char>(std::uniform_int_distribution<int>(97, 122)(rng));
    prompts.push_back(p);
  }
  std::vector<StreamResult> results(16);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      auto cli = server.client();
      results[static_cast<size_t>(i)] =
          post_stream(*cli, "/v1/completions",
                      {{"prompt", prompts[static_cast<size_t>(i)]}, {"max_tokens", 32}, {"temperature", 0},
                       {"stream", true}, {"return_token_ids", true}});
    });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < 16; ++i) {
    const auto expect = reference_greedy(codec.encode(prompts[i], true), 32, false);
    std::vector<int32_t> ids;
    std::string text;
    ASSERT_EQ(results[i].status, 200) << "client " << i << ": " << results[i].error << " raw: " << results[i].raw;
    ASSERT_TRUE(results[i].done) << i;
    for (const auto& c : results[i].chunks) {
      const auto& ch = c["choices"][0];
      text += ch["text"].get<std::string>();
      for (const auto& id : ch["token_ids"]) ids.push_back(id.get<int32_t>());
    }
    EXPECT_EQ(ids, expect) << "client " << i;
    EXPECT_EQ(text, bytes_text(expect)) << "client " << i;
  }
  EXPECT_GT(model.max_chunks.load(), 1);
}

}  // namespace
}  // namespace fp4serve::server

namespace fp4serve::server {
namespace {

TEST(BenchServe, CountsExactTokensAgainstFakeServer) {
  testing::FakeModel model(4, 256);
  model.before_forward = [] { std::this_thread::sleep_for(std::chrono::microseconds(300)); };
  testing::ByteCodec codec;
  testing::RunningServer server(model, codec, {});
  BenchConfig cfg;
  cfg.base_url = "http://127.0.0.1:" + std::to_string(server.port());
  cfg.num_prompts = 8;
  cfg.max_concurrency = 4;
  cfg.input_len = 10;
  cfg.output_len = 6;
  cfg.seed = 3;
  cfg.timeout_seconds = 20;
  const BenchReport r = run_bench_serve(cfg);
  EXPECT_EQ(r.completed, 8) << (r.errors.empty() ? "" : r.errors[0]);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.total_input, 80);
  EXPECT_EQ(r.total_output, 48);
  EXPECT_GT(r.mean_ttft_ms, 0.0);
  EXPECT_GT(r.duration_s, 0.0);
  EXPECT_GT(model.max_chunks.load(), 1);  // concurrency 4 reached the batch
  const std::string text = format_report(r);
  EXPECT_NE(text.find("Successful requests:" + std::string(20, ' ') + "8 "), std::string::npos) << text;  // vllm: {:<40}{:<10}
  EXPECT_NE(text.find("P99 ITL (ms):"), std::string::npos);
  EXPECT_EQ(report_json(r)["total_output_tokens"], 48);
}

}  // namespace
}  // namespace fp4serve::server
