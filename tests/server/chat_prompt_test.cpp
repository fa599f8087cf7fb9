// SPDX-License-Identifier: Apache-2.0
// Chat requests as transformers renders them: chat_template_kwargs, tools and full OpenAI messages reach the
// template, and /tokenize shows the exact ids. The expected prompts are transformers' renders of the published
// Qwen3 template (tests/data/tokenizers/published/golden.json), encoded by the qwen2-family tokenizer (itself
// checked against HF tokenizers in tests/text).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "runtime/text_setup.h"
#include "server/fakes.h"
#include "server/openai_api.h"
#include "server/server_harness.h"
#include "server/tokenizer_codec.h"
#include "text/chat_template.h"
#include "checkpoint/checkpoint.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace testing;

const std::string kData = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/";

ojson read_ordered(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ojson::parse(buffer.str());
}

// transformers' render of the Qwen3 template for `conversation` (kwargs as in the golden case).
const ojson& golden_case(const std::string& conversation, bool add_generation_prompt) {
  static const ojson golden = read_ordered(kData + "published/golden.json");
  for (const auto& c : golden["cases"]) {
    if (c["template"] == "Qwen-Qwen3-0.6B.jinja" && c["conversation"] == conversation &&
        c["add_generation_prompt"] == add_generation_prompt) {
      return c;
    }
  }
  throw std::runtime_error("no golden case " + conversation);
}

struct Fixture {
  text::Tokenizer tokenizer;
  json config;
  Fixture()
      : tokenizer(text::Tokenizer::from_files(kData + "qwen2/tokenizer.json",
                                                 checkpoint::read_json_object_file(kData + "qwen2/tokenizer_config.json"))),
        config(checkpoint::read_json_object_file(kData + "qwen2/tokenizer_config.json")) {}

  // The server's codec with --chat-template <published Qwen3 template>; the golden's special tokens stand in
  // for template_context so both sides see the same variables.
  TokenizerCodec codec(const ojson& server_kwargs = ojson::object()) const {
    auto templates = text::ChatTemplates::load(kData + "qwen2", config, kData + "published/Qwen-Qwen3-0.6B.jinja");
    ojson vars = golden_case("single_user", false)["special_tokens"];
    for (const auto& [k, v] : server_kwargs.items()) vars[k] = v;
    return TokenizerCodec(tokenizer, std::move(templates), vars, {1});
  }
};

std::string body_of(const ojson& c, bool with_kwargs) {
  ojson body = {{"model", "test-model"}, {"messages", c["messages"]}};
  if (c.contains("tools")) body["tools"] = c["tools"];
  if (with_kwargs) body["chat_template_kwargs"] = c["chat_template_kwargs"];
  return body.dump();
}

TEST(ChatPrompt, KwargsAndToolsReachTheTemplateAsTransformersRendersThem) {
  const Fixture fx;
  const TokenizerCodec codec = fx.codec();
  const ServeLimits limits{"test-model", 4096, {}};
  for (const char* name : {"tool_calls+kwargs0", "reasoning+kwargs0", "system_multi_turn+kwargs1", "tool_calls"}) {
    const ojson& c = golden_case(name, true);
    ASSERT_TRUE(c.contains("text")) << name;
    const ApiRequest req = parse_request(Endpoint::kChatCompletions, body_of(c, true));
    const SequenceRequest seq = to_sequence_request(req, codec, limits, Clock::now());
    EXPECT_EQ(seq.prompt, fx.tokenizer.encode(c["text"].get<std::string>(), false)) << name;
  }
  // Without the request's kwargs the template's default (thinking on) differs from enable_thinking=false.
  const ojson& off = golden_case("reasoning+kwargs0", true);
  const ApiRequest plain = parse_request(Endpoint::kChatCompletions, body_of(off, false));
  EXPECT_NE(to_sequence_request(plain, codec, limits, Clock::now()).prompt,
            fx.tokenizer.encode(off["text"].get<std::string>(), false));
  // --chat-template-kwargs on the server is the default a request may override.
  const TokenizerCodec defaulted = fx.codec(off["chat_template_kwargs"]);
  EXPECT_EQ(to_sequence_request(plain, defaulted, limits, Clock::now()).prompt,
            fx.tokenizer.encode(off["text"].get<std::string>(), false));
}

TEST(ChatPrompt, ChatFieldsAreTypeChecked) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  for (const std::string& bad : {"{" + msgs + R"(, "chat_template_kwargs": [1]})", "{" + msgs + R"(, "tools": {"a": 1}})",
                                 "{" + msgs + R"(, "tools": [1]})", "{" + msgs + R"(, "add_generation_prompt": "yes"})",
                                 "{" + msgs + R"(, "tool_choice": "required"})", "{" + msgs + R"(, "functions": [{}]})"}) {
    try {
      parse_request(Endpoint::kChatCompletions, bad);
      ADD_FAILURE() << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << bad;
    }
  }
  // Completions have no template: tools there stay refused.
  EXPECT_THROW(parse_request(Endpoint::kCompletions, R"({"prompt": "x", "tools": [{"type": "function"}]})"), ApiError);
}

TEST(ChatPrompt, TokenizeAndDetokenizeEndpoints) {
  const Fixture fx;
  const TokenizerCodec codec = fx.codec();
  FakeModel model(2, 256);
  RunningServer server(model, codec, ServerSetup{});
  auto cli = server.client();
  const ojson& c = golden_case("tool_calls+kwargs0", false);
  ojson body = ojson::parse(body_of(c, true));  // ordered: tojson shows the key order the client sent
  body["add_generation_prompt"] = false;
  auto r = cli->Post("/tokenize", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json got = json::parse(r->body);
  const auto expect = fx.tokenizer.encode(c["text"].get<std::string>(), false);
  EXPECT_EQ(got["tokens"].get<std::vector<int32_t>>(), expect);
  EXPECT_EQ(got["count"], expect.size());
  EXPECT_EQ(got["max_model_len"], 256);

  const std::string text = "Tokyo 東京 2024 — naïve";
  r = cli->Post("/tokenize", json{{"prompt", text}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto ids = json::parse(r->body)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, fx.tokenizer.encode(text, true));

  r = cli->Post("/detokenize", json{{"tokens", expect}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["prompt"], fx.tokenizer.decode(expect, false));

  for (const auto& [path, bad] : std::vector<std::pair<std::string, std::string>>{
           {"/tokenize", "[1]"}, {"/tokenize", R"({"prompt": 5})"}, {"/tokenize", R"({"prompt": "a", "messages": []})"},
           {"/tokenize", R"({"prompt": "a", "model": "other"})"}, {"/detokenize", R"({"tokens": [-1]})"},
           {"/detokenize", R"({"tokens": [100000000]})"}, {"/detokenize", R"({"tokens": "1 2"})"},
           {"/tokenize", R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}]})"}}) {
    r = cli->Post(path, bad, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path << " " << bad << " → " << r->body;
  }
}

}  // namespace
}  // namespace fp4serve::server
