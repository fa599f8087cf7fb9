// SPDX-License-Identifier: Apache-2.0
// Tool calls through the HTTP server over the fake model: tool_choice required and named are decoded under the
// tools' schemas, so even the fake model's noise becomes calls whose arguments validate; auto parses the model's
// own format (here forced into Hermes form by a regex so the fake model writes it), whole and streamed as
// OpenAI's tool_call deltas; reasoning_content with --reasoning-parser.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include "server/fakes.h"
#include "server/server_harness.h"

namespace fp4serve::server::testing {
namespace {

using nlohmann::json;

// The byte codec with a template that shows the tools (as a real one would).
class ToolByteCodec final : public TextCodec {
 public:
  // "<think>" and "</think>" are single tokens, as in Qwen3's vocabulary (here ids 96 and 126, bytes the fake model
  // gives ordinary logits, rendered "`" and "~"); other text one token per byte.
  std::vector<int32_t> encode(std::string_view text, bool special) const override {
    std::vector<int32_t> ids;
    while (!text.empty()) {
      if (text.substr(0, 8) == "</think>") {
        ids.push_back(kThinkEnd);
        text.remove_prefix(8);
      } else if (text.substr(0, 7) == "<think>") {
        ids.push_back(kThinkStart);
        text.remove_prefix(7);
      } else {
        const auto one = bytes_.encode(text.substr(0, 1), special);
        ids.insert(ids.end(), one.begin(), one.end());
        text.remove_prefix(1);
      }
    }
    return ids;
  }
  std::optional<int32_t> token_id(std::string_view token) const override {
    if (token == "</think>") return kThinkEnd;
    if (token == "<think>") return kThinkStart;
    return std::nullopt;
  }
  static constexpr int32_t kThinkEnd = '~', kThinkStart = '`';
  std::string render_chat(const std::vector<ChatTurn>& messages) const override { return bytes_.render_chat(messages); }
  std::string render_chat_prompt(const ChatPrompt& prompt) const override {
    std::string s = prompt.tools.is_null() ? "" : "<tools>" + prompt.tools.dump() + "</tools>\n";
    for (const auto& m : prompt.messages) s += "<" + m.value("role", "") + ">" + m.value("content", "") + "\n";
    return s + "<assistant>";
  }
  std::unique_ptr<Detokenizer> detokenizer() const override { return bytes_.detokenizer(); }
  int64_t vocab_size() const override { return kVocab; }
  std::vector<int32_t> eos_token_ids() const override { return {kEos}; }

 private:
  ByteCodec bytes_;
};

std::shared_ptr<const runtime::GrammarCompiler> byte_vocab_grammars() {
  runtime::VocabularyInfo v;
  for (int b = 0; b < 256; ++b) v.tokens.emplace_back(1, static_cast<char>(b));
  v.tokens.resize(kVocab);
  v.vocab_size = kVocab;
  v.stop_token_ids = {kEos};
  return std::make_shared<const runtime::GrammarCompiler>(v, 1);
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
   "required": ["a", "b"]}}}])");

// Checks `args` against the named tool's parameters (the properties the schemas above use).
void expect_valid_arguments(const std::string& name, const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << arguments;
  if (name == "get_weather") {
    ASSERT_TRUE(a["city"].is_string()) << arguments;
    EXPECT_LE(a["city"].get<std::string>().size(), 8u);
    EXPECT_TRUE(a["unit"] == "celsius" || a["unit"] == "fahrenheit") << arguments;
    EXPECT_EQ(a.size(), 2u) << arguments;
  } else {
    ASSERT_EQ(name, "add");
    ASSERT_TRUE(a["a"].is_number_integer() && a["b"].is_number_integer()) << arguments;
    EXPECT_LE(a["a"].get<int>(), 99);
    EXPECT_GE(a["b"].get<int>(), 0);
  }
}

// The calls of a stream's tool_calls deltas, as an OpenAI client assembles them: per index, the first entry
// carries id, type and name, the following ones more of the arguments. `pieces`: the entries seen.
json assemble_streamed_calls(const std::vector<json>& chunks, size_t* pieces = nullptr) {
  json calls = json::array();
  size_t n = 0;
  for (const auto& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    if (!d.contains("tool_calls")) continue;
    for (const auto& t : d["tool_calls"]) {
      ++n;
      const size_t index = t["index"].get<size_t>();
      if (index == calls.size()) {
        EXPECT_TRUE(t.contains("id") && t["type"] == "function" && t["function"].contains("name")) << t.dump();
        calls.push_back({{"id", t.value("id", "")}, {"name", t["function"].value("name", "")}, {"arguments", ""}});
      } else {
        EXPECT_LT(index, calls.size()) << t.dump();
        EXPECT_FALSE(t.contains("id") || t["function"].contains("name")) << "a later piece repeats the call: " << t.dump();
      }
      if (index < calls.size()) {
        calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() + t["function"].value("arguments", "");
      }
    }
  }
  if (pieces != nullptr) *pieces = n;
  return calls;
}

class ToolServer : public ::testing::Test {
 protected:
  void start(std::optional<ToolParser> parser, std::optional<ReasoningParser> reasoning = std::nullopt) {
    if (!runtime::grammar_engine_available()) GTEST_SKIP() << runtime::grammar_engine_description();
    setup_.grammars = byte_vocab_grammars();
    setup_.tool_parser = parser;
    setup_.reasoning_parser = reasoning;
    server_ = std::make_unique<RunningServer>(model_, codec_, setup_);
  }
  json chat(json body, int* status) {
    body["messages"] = json::array({{{"role", "user"}, {"content", "Weather in Oslo, and 2 + 3?"}}});
    body["tools"] = kTools;
    if (!body.contains("max_tokens")) body["max_tokens"] = 400;
    body["temperature"] = 0;
    return post_json(*server_->client(), "/v1/chat/completions", body, status);
  }
  FakeModel model_{4, 1024};
  ToolByteCodec codec_;
  ServerSetup setup_{.context_length = 1024};
  std::unique_ptr<RunningServer> server_;
};

TEST_F(ToolServer, RequiredAndNamedChoicesGiveValidArguments) {
  start(std::nullopt);  // no parser needed: forced choices are decoded under the schema
  int status = 0;
  json r = chat({{"tool_choice", "required"}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("tool_calls")) << r.dump();
  ASSERT_GE(msg["tool_calls"].size(), 1u);
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  for (const auto& call : msg["tool_calls"]) {
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["id"].get<std::string>().rfind("chatcmpl-tool-", 0), 0u);
    expect_valid_arguments(call["function"]["name"], call["function"]["arguments"]);
  }
  r = chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
  const json& call = r["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "add");
  expect_valid_arguments("add", call["function"]["arguments"]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");  // OpenAI: a forced function ends with stop

  // parallel_tool_calls false: one call at most.
  r = chat({{"tool_choice", "required"}, {"parallel_tool_calls", false}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u);

  // Streamed: the calls arrive as tool_calls deltas: index, id, type and name first, then the arguments in
  // fragments (steps slowed so that the handler sees the output as it is generated).
  model_.before_forward = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); };
  json body = {{"tool_choice", "required"}, {"stream", true}};
  body["messages"] = json::array({{{"role", "user"}, {"content", "Weather in Oslo, and 2 + 3?"}}});
  body["tools"] = kTools;
  body["max_tokens"] = 400;
  body["temperature"] = 0;
  const StreamResult s = post_stream(*server_->client(), "/v1/chat/completions", body);
  ASSERT_TRUE(s.done) << s.raw;
  std::string finish;
  for (const auto& c : s.chunks) {
    const json& d = c["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("content") && !d["content"].get<std::string>().empty()) << c.dump();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  size_t pieces = 0;
  const json streamed = assemble_streamed_calls(s.chunks, &pieces);
  ASSERT_GE(streamed.size(), 1u) << s.raw;
  EXPECT_GT(pieces, 2 * streamed.size()) << "the arguments were not streamed in fragments";
  for (const auto& c : streamed) expect_valid_arguments(c["name"], c["arguments"]);
  EXPECT_EQ(finish, "tool_calls");
}

// tool_choice auto: the model's own Hermes output is parsed (a regex makes the fake model write one call).
TEST_F(ToolServer, AutoChoiceParsesTheModelsFormatWholeAndStreamed) {
  start(ToolParser::kHermes);
  const std::string regex = R"re(I will check\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Oslo|Bergen)", "unit": "celsius"\}\}\n</tool_call>)re";
  int status = 0;
  const json r = chat({{"structured_outputs", {{"regex", regex}}}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "I will check.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << r.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  expect_valid_arguments("get_weather", msg["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");

  model_.before_forward = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); };
  json body = {{"structured_outputs", {{"regex", regex}}}, {"stream", true}, {"tools", kTools}, {"temperature", 0},
               {"max_tokens", 400}};
  body["messages"] = json::array({{{"role", "user"}, {"content", "Weather in Oslo, and 2 + 3?"}}});
  const StreamResult s = post_stream(*server_->client(), "/v1/chat/completions", body);
  ASSERT_TRUE(s.done) << s.raw;
  std::string content;
  for (const auto& c : s.chunks) content += c["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(content, "I will check.");
  size_t pieces = 0;
  const json calls = assemble_streamed_calls(s.chunks, &pieces);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["name"], "get_weather");
  EXPECT_GT(pieces, 10u) << "the arguments came in one piece: " << s.raw;  // one token per byte here
  EXPECT_EQ(calls[0]["arguments"], msg["tool_calls"][0]["function"]["arguments"]);  // byte for byte
  EXPECT_EQ(calls[0]["arguments"].get<std::string>().rfind(R"({"city": ")", 0), 0u);  // as the model wrote it

  // tool_choice none: the same output stays text.
  const json none = chat({{"structured_outputs", {{"regex", regex}}}, {"tool_choice", "none"}}, &status);
  ASSERT_EQ(status, 200);
  EXPECT_FALSE(none["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(none["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
}

TEST_F(ToolServer, ReasoningContentIsSplitOff) {
  start(ToolParser::kHermes, ReasoningParser::kQwen3);
  // The prompt closes the think block, so the regex applies from the first token and makes the fake model write a
  // reasoning block as text.
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hi <think>\n\n</think>"}}})},
               {"tools", kTools}, {"tool_choice", "none"}, {"max_tokens", 100}, {"temperature", 0},
               {"guided_regex", R"(<think>\nshort thought\n</think>\n\nAnswer: [a-z]{3})"}};
  int status = 0;
  const json r = post_json(*server_->client(), "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "\nshort thought\n");
  EXPECT_TRUE(std::regex_match(r["choices"][0]["message"]["content"].get<std::string>(), std::regex("Answer: [a-z]{3}")))
      << r.dump();
}

// With a reasoning parser, the grammar applies after </think>: the reasoning is free (here the fake model is pushed
// to end it at once with a logit bias), the answer constrained; a prompt that already closed the block (Qwen3 with
// thinking off) is constrained from its first token; without a reasoning parser, from the first token too.
TEST_F(ToolServer, StructuredOutputStartsAfterTheReasoning) {
  start(std::nullopt, ReasoningParser::kQwen3);
  const json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                       {"required", {"n"}}};
  auto ask = [&](const std::string& content, int* status) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", content}}})}, {"max_tokens", 60},
                 {"temperature", 0}, {"return_token_ids", true},
                 {"structured_outputs", {{"json", schema}, {"disable_any_whitespace", true}}},
                 {"logit_bias", {{std::to_string(ToolByteCodec::kThinkEnd), 100}}}};
    return post_json(*server_->client(), "/v1/chat/completions", body, status);
  };
  int status = 0;
  json r = ask("Think first.", &status);
  ASSERT_EQ(status, 200) << r.dump();
  auto ids = r["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), ToolByteCodec::kThinkEnd);  // free while reasoning: the biased </think> came first
  const std::string text = r["choices"][0]["message"]["content"];  // "~" (the </think> token) + the answer
  ASSERT_FALSE(text.empty());
  EXPECT_TRUE(json::parse(text.substr(1), nullptr, false).is_object()) << r.dump();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ToolByteCodec::kThinkEnd), 1) << r.dump();  // masked once constrained
  r = ask("No thinking here.<think>\n\n</think>", &status);  // the prompt closed the block
  ASSERT_EQ(status, 200) << r.dump();
  ids = r["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), '{') << r.dump();  // </think> is not in the grammar, however biased
}

TEST_F(ToolServer, BadToolRequestsAre400) {
  start(std::nullopt);
  int status = 0;
  json r = chat({{"tool_choice", "auto"}}, &status);  // no parser for this model
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "tool_choice");
  r = chat({{"tool_choice", "required"}, {"guided_regex", "a"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "tool_choice");
  r = chat({{"tool_choice", "sometimes"}}, &status);
  EXPECT_EQ(status, 400);
  json body = {{"tool_choice", "required"}};
  body["messages"] = json::array({{{"role", "user"}, {"content", "x"}}});
  body["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 3}}}}});
  r = post_json(*server_->client(), "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "tools");
}

}  // namespace
}  // namespace fp4serve::server::testing
