// SPDX-License-Identifier: Apache-2.0
// Chat requests as transformers renders them: chat_template_kwargs, tools (on /tokenize) and full OpenAI messages
// reach the template, content parts take the shape the template expects, and /tokenize shows the exact ids. The expected prompts are transformers' renders of the published
// Qwen3 template (tests/data/tokenizers/published/golden.json), encoded by the qwen2-family tokenizer (itself
// checked against HF tokenizers in tests/text).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/text_setup.h"
#include "server/fakes.h"
#include "server/openai_api.h"
#include "server/server_harness.h"
#include "server/tokenizer_codec.h"
#include "text/chat_template.h"
#include "text/tokenizer_fixtures.h"
#include "checkpoint/checkpoint.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace testing;

const std::string kData = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/";

using text::test_support::read_ordered;

// transformers' render of the Qwen3 template (or `tmpl`) for `conversation` (kwargs as in the golden case).
const ojson& golden_case(const std::string& conversation, bool add_generation_prompt,
                         const std::string& tmpl = "Qwen-Qwen3-0.6B.jinja") {
  static const ojson golden = read_ordered(kData + "published/golden.json");
  for (const auto& c : golden["cases"]) {
    if (c["template"] == tmpl && c["conversation"] == conversation &&
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
  TokenizerCodec codec(const ojson& server_kwargs = ojson::object(),
                       const std::string& tmpl = "Qwen-Qwen3-0.6B.jinja") const {
    auto templates = text::ChatTemplates::load(kData + "qwen2", config, kData + "published/" + tmpl);
    ojson vars = golden_case("single_user", false, tmpl)["special_tokens"];
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

TEST(ChatPrompt, KwargsReachTheTemplateAsTransformersRendersThem) {
  const Fixture fx;
  const TokenizerCodec codec = fx.codec();
  const ServeLimits limits{"test-model", 4096, {}, std::nullopt, nullptr};
  for (const char* name : {"reasoning+kwargs0", "system_multi_turn+kwargs1", "system_multi_turn"}) {
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
           {"/tokenize", R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})"}}) {
    r = cli->Post(path, bad, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path << " " << bad << " → " << r->body;
  }
}

ApiError chat_error(const std::string& body) {
  try {
    parse_request(Endpoint::kChatCompletions, body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(200, "accepted");
}

// Issue 43 item 1: text parts worked with every template before the full messages reached it; a template that
// concatenates content (Qwen3: `str + list` in transformers too) gets them joined, one that iterates them
// (Granite 4.0) gets the list, as vLLM's detected content format does.
TEST(ChatPrompt, TextPartsWorkWithStringAndListTemplates) {
  const Fixture fx;
  const ServeLimits limits{"test-model", 4096, {}, std::nullopt, nullptr};
  auto prompt_of = [&](const TokenizerCodec& codec, const ojson& messages) {
    const ApiRequest req = parse_request(Endpoint::kChatCompletions, ojson{{"messages", messages}}.dump());
    return to_sequence_request(req, codec, limits, Clock::now()).prompt;
  };
  const ojson parts = golden_case("content_parts", true)["messages"];
  ojson joined = parts;
  joined[0]["content"] = "Be brief.";
  joined[1]["content"] = "Say hi\ntwice";
  const TokenizerCodec qwen = fx.codec();
  std::vector<int32_t> got;
  try {
    got = prompt_of(qwen, parts);
  } catch (const ApiError& e) {
    FAIL() << "text parts with a string template: " << e.status() << " " << e.what();
  }
  EXPECT_EQ(got, prompt_of(qwen, joined));

  const std::string granite = "ibm-granite-granite-4.0.jinja";
  const TokenizerCodec list = fx.codec(ojson::object(), granite);
  EXPECT_EQ(prompt_of(list, parts),
            fx.tokenizer.encode(golden_case("content_parts", true, granite)["text"].get<std::string>(), false));

  // Through HTTP: chat completions and /tokenize answer 200, with the joined prompt's ids.
  FakeModel model(2, 4096);
  ServerSetup setup;
  setup.context_length = 4096;
  RunningServer server(model, qwen, setup);
  auto cli = server.client();
  auto r = cli->Post("/v1/chat/completions", ojson{{"messages", parts}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = cli->Post("/tokenize", ojson{{"messages", parts}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["tokens"].get<std::vector<int32_t>>(), prompt_of(qwen, joined));
}

// --chat-template-content-format overrides the detection: "string" joins the parts even for a template that
// iterates them, "openai" hands the list even to one that uses content as a string (which then fails, as in
// transformers).
TEST(ChatPrompt, ContentFormatFlagOverridesTheDetection) {
  const Fixture fx;
  const ServeLimits limits{"test-model", 4096, {}, std::nullopt, nullptr};
  const auto path = std::filesystem::temp_directory_path() / ("fp4serve_parts_" + std::to_string(::getpid()) + ".jinja");
  {
    std::ofstream out(path);
    out << "{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}"
           "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}";
  }
  const ojson parts = ojson::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  const std::string body = ojson{{"messages", parts}}.dump();
  auto render = [&](std::optional<text::ContentFormat> format) {
    TokenizerCodec codec(fx.tokenizer, text::ChatTemplates::load(kData + "qwen2", fx.config, path.string()),
                         ojson::object(), {1}, format);
    return to_sequence_request(parse_request(Endpoint::kChatCompletions, body), codec, limits, Clock::now()).prompt;
  };
  const auto auto_prompt = render(std::nullopt);
  EXPECT_EQ(auto_prompt, fx.tokenizer.encode("<user>[a][b]", false));
  EXPECT_EQ(render(text::ContentFormat::kOpenAI), auto_prompt);
  EXPECT_EQ(render(text::ContentFormat::kString), fx.tokenizer.encode("<user>a\nb", false));
  std::filesystem::remove(path);

  TokenizerCodec forced(fx.tokenizer,
                        text::ChatTemplates::load(kData + "qwen2", fx.config, kData + "published/Qwen-Qwen3-0.6B.jinja"),
                        golden_case("single_user", false)["special_tokens"], {1}, text::ContentFormat::kOpenAI);
  EXPECT_EQ(forced.describe_content_format(), "openai (--chat-template-content-format)");
  EXPECT_EQ(Fixture().codec().describe_content_format(), "string (detected from the template)");
  try {
    to_sequence_request(parse_request(Endpoint::kChatCompletions, body), forced, limits, Clock::now());
    ADD_FAILURE() << "a list in a string template rendered";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("'list'"), std::string::npos) << e.what();  // the template's own failure
  }
}

TEST(ChatPrompt, NonTextPartsAreRefusedNamingTheirType) {
  for (const char* type : {"image_url", "input_audio", "file"}) {
    const ApiError e = chat_error(std::string(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                              {"type": ")") + type + R"("}]}]})");
    EXPECT_EQ(e.status(), 400) << type;
    EXPECT_EQ(e.param(), "messages") << type;
    EXPECT_NE(std::string(e.what()).find(std::string("'") + type + "'"), std::string::npos) << e.what();
  }
}

// Issue 43 item 3 made tools a 400 until tool calls were parsed (issue 41 parses them): a server that knows no
// tool-call format for its model refuses tool_choice auto with the field named, rather than answering 200 with
// calls it could never return; the deprecated functions field stays refused.
TEST(ChatPrompt, ToolsNeedAKnownCallFormatForAutoChoice) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "What is the weather in Paris?"}])";
  const std::string tool = R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})";
  const ApiError functions = chat_error("{" + msgs + R"(, "functions": [{"name": "get_weather", "parameters": {}}]})");
  EXPECT_EQ(functions.status(), 400);
  EXPECT_EQ(functions.param(), "functions");
  EXPECT_EQ(chat_error("{" + msgs + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [)" +
                       tool + "]}").param(), "tool_choice");
  // An empty list means none, as clients send it; tool_choice "none" / "auto" alone asks for nothing.
  EXPECT_EQ(chat_error("{" + msgs + R"(, "tools": [], "tool_choice": "none"})").status(), 200);
  // Through HTTP with the real codec (whose template takes the tools): 400 naming tool_choice without a parser,
  // 200 with tool_choice none (the template sees the tools, the reply is text).
  const Fixture fx;
  const TokenizerCodec codec = fx.codec();
  FakeModel model(2, 4096);
  ServerSetup setup;
  setup.context_length = 4096;
  RunningServer server(model, codec, setup);
  auto cli = server.client();
  auto r = cli->Post("/v1/chat/completions", "{" + msgs + R"(, "max_tokens": 2, "tools": [)" + tool + "]}",
                     "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "tool_choice") << r->body;
  r = cli->Post("/v1/chat/completions", "{" + msgs + R"(, "max_tokens": 2, "tool_choice": "none", "tools": [)" + tool + "]}",
                "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace fp4serve::server
