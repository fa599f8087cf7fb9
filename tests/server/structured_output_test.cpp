// SPDX-License-Identifier: Apache-2.0
// Structured outputs through the HTTP server over the fake model (one token per byte): every request form
// (response_format, structured_outputs, guided_*) constrains the reply, constrained and free sequences share a
// batch without their masks leaking into each other, and bad constraints are 400s naming the field.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <regex>

#include "server/openai_api.h"
#include "server/structured_request.h"
#include "server/fakes.h"
#include "server/server_harness.h"

namespace fp4serve::server::testing {
namespace {

using nlohmann::json;

// The byte codec's vocabulary as the grammar engine sees it: ids 0…255 are their byte, the rest special.
std::shared_ptr<const runtime::GrammarCompiler> byte_grammars(const runtime::GrammarLimits& limits = {}) {
  runtime::VocabularyInfo v;
  for (int b = 0; b < 256; ++b) v.tokens.emplace_back(1, static_cast<char>(b));
  v.tokens.resize(kVocab);
  v.encoding = runtime::VocabEncoding::kRaw;
  v.vocab_size = kVocab;
  v.stop_token_ids = {kEos};
  return std::make_shared<const runtime::GrammarCompiler>(v, 1, int64_t{256} << 20, limits);
}

class StructuredServer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!runtime::grammar_engine_available()) GTEST_SKIP() << runtime::grammar_engine_description();
    setup_.grammars = byte_grammars();
    server_ = std::make_unique<RunningServer>(model_, codec_, setup_);
  }
  json chat(json body, int* status) {
    body["messages"] = json::array({{{"role", "user"}, {"content", "Describe a widget"}}});
    body["max_tokens"] = 250;
    body["temperature"] = 0;
    return post_json(*server_->client(), "/v1/chat/completions", body, status);
  }
  FakeModel model_{8, 512};
  ByteCodec codec_;
  ServerSetup setup_{.context_length = 512};
  std::unique_ptr<RunningServer> server_;
};

const json kSchema = json::parse(R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "size": {"type": "integer", "minimum": -5, "maximum": 500},
    "kind": {"enum": ["bolt", "nut", "gear"]},
    "parts": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
  "required": ["name", "size", "kind", "parts"], "additionalProperties": false})");

void expect_valid(const std::string& text) {
  const json v = json::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << text;
  ASSERT_TRUE(v.is_object()) << text;
  EXPECT_EQ(v.size(), 4u) << text;
  ASSERT_TRUE(v["name"].is_string()) << text;
  EXPECT_LE(v["name"].get<std::string>().size(), 6u) << text;
  ASSERT_TRUE(v["size"].is_number_integer()) << text;
  EXPECT_GE(v["size"].get<int>(), -5);
  EXPECT_LE(v["size"].get<int>(), 500);
  ASSERT_TRUE(v["kind"].is_string());
  EXPECT_TRUE(std::regex_match(v["kind"].get<std::string>(), std::regex("bolt|nut|gear"))) << text;
  ASSERT_TRUE(v["parts"].is_array());
  EXPECT_LE(v["parts"].size(), 2u);
  for (const auto& p : v["parts"]) EXPECT_TRUE(p.is_boolean());
}

TEST_F(StructuredServer, EveryJsonSchemaFormConstrainsTheReply) {
  const std::vector<json> forms = {
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", kSchema}, {"strict", true}}}}}},
      {{"structured_outputs", {{"json", kSchema}}}},
      {{"structured_outputs", {{"json", kSchema.dump()}, {"disable_any_whitespace", true}}}},
      {{"guided_json", kSchema}},
      {{"guided_json", kSchema.dump()}, {"guided_decoding_backend", "xgrammar"}}};
  for (const auto& form : forms) {
    int status = 0;
    const json r = chat(form, &status);
    ASSERT_EQ(status, 200) << form.dump() << " → " << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    expect_valid(r["choices"][0]["message"]["content"].get<std::string>());
  }
  // Without the constraint the fake model writes printable noise, not this JSON.
  int status = 0;
  const json free = chat(json::object(), &status);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(json::parse(free["choices"][0]["message"]["content"].get<std::string>(), nullptr, false).is_discarded());
}

// The schema's property order is the client's (the engine writes properties in schema order), and options in a
// structured_outputs beside response_format shape its constraint, as vLLM merges them.
TEST_F(StructuredServer, PropertyOrderAndMergedOptions) {
  // Sent as text: nlohmann::json would sort the keys before the server saw them.
  const std::string body = R"({"prompt": "Order:", "max_tokens": 60, "temperature": 0,
      "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object",
          "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["zeta", "alpha"]}}},
      "structured_outputs": {"disable_any_whitespace": true}})";
  auto res = server_->client()->Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string text = json::parse(res->body)["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(text, std::regex(R"(\{"zeta": (true|false), "alpha": [0-9]\})"))) << text;
  // Options alone, without response_format, constrain nothing: refused.
  int status = 0;
  const json alone = chat({{"structured_outputs", {{"disable_any_whitespace", true}}}}, &status);
  EXPECT_EQ(status, 400) << alone.dump();
}

TEST_F(StructuredServer, JsonObjectRegexChoiceAndGrammar) {
  int status = 0;
  json r = chat({{"response_format", {{"type", "json_object"}}}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const std::string obj = r["choices"][0]["message"]["content"];
  if (r["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(obj, nullptr, false).is_object()) << obj;
  }
  EXPECT_EQ(obj.front(), '{');

  for (const auto& [body, pattern] : std::vector<std::pair<json, std::string>>{
           {{{"structured_outputs", {{"regex", "[A-Z][a-z]{2,5} [0-9]{2}"}}}}, "[A-Z][a-z]{2,5} [0-9]{2}"},
           {{{"guided_regex", "(yes|no)!"}}, "(yes|no)!"},
           {{{"structured_outputs", {{"choice", {"alpha", "beta", "gamma ray"}}}}}, "alpha|beta|gamma ray"},
           {{{"guided_choice", {"left", "right"}}}, "left|right"},
           {{{"structured_outputs", {{"grammar", "root ::= \"<\" [a-c]+ \">\""}}}}, "<[a-c]+>"},
           {{{"guided_grammar", "start: \"id-\" /[0-9]{3}/"}}, "id-[0-9]{3}"}}) {
    r = chat(body, &status);
    ASSERT_EQ(status, 200) << body.dump() << " → " << r.dump();
    const std::string text = r["choices"][0]["message"]["content"];
    if (body.dump().find("[a-c]+") == std::string::npos) {
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << text;
    }
    if (r["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << body.dump() << " → " << text;
    }
  }
}

// Structural tags: vLLM's older structures + triggers form (converted to xgrammar's format form) and the format
// form itself; a tag forced at the start shows the schema inside it is applied.
TEST_F(StructuredServer, StructuralTagsInBothForms) {
  const json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                       {"required", {"n"}}};
  int status = 0;
  json r = chat({{"response_format", {{"type", "structural_tag"},
                                      {"structures", {{{"begin", "<fn>"}, {"schema", schema}, {"end", "</fn>"}}}},
                                      {"triggers", {"<fn"}}}}},
                &status);
  EXPECT_EQ(status, 200) << r.dump();
  const json format = {{"type", "structural_tag"},
                       {"format", {{"type", "tag"}, {"begin", "<fn>"},
                                   {"content", {{"type", "json_schema"}, {"json_schema", schema}}}, {"end", "</fn>"}}}};
  r = chat({{"structured_outputs", {{"structural_tag", format.dump()}}}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const std::string text = r["choices"][0]["message"]["content"];
  EXPECT_TRUE(std::regex_match(text, std::regex(R"(<fn>\s*\{\s*"n"\s*:\s*[0-9]\s*\}\s*</fn>)"))) << text;
  r = chat({{"structured_outputs", {{"structural_tag", R"({"type": "structural_tag", "format": {"type": "nope"}})"}}}},
           &status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "structured_outputs");
}

TEST_F(StructuredServer, CompletionsAndStreamsAreConstrainedToo) {
  auto cli = server_->client();
  int status = 0;
  const json body = {{"prompt", "A widget:"}, {"max_tokens", 250}, {"temperature", 0}, {"guided_json", kSchema}};
  const json whole = post_json(*cli, "/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  expect_valid(whole["choices"][0]["text"].get<std::string>());
  json streamed = body;
  streamed["stream"] = true;
  const StreamResult s = post_stream(*cli, "/v1/completions", streamed);
  ASSERT_TRUE(s.done) << s.raw;
  std::string text;
  for (const auto& c : s.chunks) text += c["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, whole["choices"][0]["text"].get<std::string>());
}

// Free and constrained sequences in one batch: the free ones give exactly the unconstrained reference, so no
// mask reaches a row it does not belong to; the constrained ones are valid.
TEST_F(StructuredServer, MasksStayWithTheirSequenceInTheBatch) {
  model_.before_forward = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); };  // so they overlap
  std::vector<std::future<std::pair<int, json>>> replies;
  for (int i = 0; i < 8; ++i) {
    replies.push_back(std::async(std::launch::async, [this, i] {
      json body = {{"prompt", "item " + std::to_string(i)}, {"max_tokens", 60}, {"temperature", 0},
                   {"return_token_ids", true}};
      if (i % 2 == 0) {
        body["guided_json"] = kSchema;
        body["max_tokens"] = 250;
      }
      int status = 0;
      json r = post_json(*server_->client(), "/v1/completions", body, &status);
      return std::make_pair(status, r);
    }));
  }
  for (int i = 0; i < 8; ++i) {
    const auto [status, r] = replies[static_cast<size_t>(i)].get();
    ASSERT_EQ(status, 200) << r.dump();
    const std::string text = r["choices"][0]["text"];
    if (i % 2 == 0) {
      expect_valid(text);
    } else {
      const auto prompt = codec_.encode("item " + std::to_string(i), true);
      EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), reference_greedy(prompt, 60, false));
    }
  }
  EXPECT_GT(model_.max_chunks.load(), 1);  // they did share steps
}

TEST_F(StructuredServer, BadConstraintsAre400NamingTheField) {
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"guided_json", "{not json"}}, "guided_json"},
           {{{"guided_json", 3}}, "guided_json"},
           {{{"guided_regex", "(unclosed"}}, "guided_regex"},
           {{{"guided_choice", json::array()}}, "guided_choice"},
           {{{"guided_grammar", "root ::= missing_rule"}}, "guided_grammar"},
           {{{"structured_outputs", {{"regex", "a"}, {"choice", {"a"}}}}}, "structured_outputs"},
           {{{"structured_outputs", {{"regex", "a"}, {"whitespace_pattern", " "}}}}, "structured_outputs"},
           {{{"structured_outputs", {{"regexp", "a"}}}}, "structured_outputs"},
           {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}, "response_format"},
           {{{"response_format", {{"type", "yaml"}}}}, "response_format"},
           {{{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a"}}, "guided_regex"},
           {{{"guided_decoding_backend", "outlines"}, {"guided_regex", "a"}}, "guided_decoding_backend"},
           {{{"guided_jsn", json::object()}}, "guided_jsn"}}) {
    int status = 0;
    const json r = chat(body, &status);
    EXPECT_EQ(status, 400) << body.dump() << " → " << r.dump();
    EXPECT_EQ(r["error"]["param"], param) << body.dump() << " → " << r.dump();
  }
}

// Hostile constraints end fast with a 400 naming the field, and the server keeps serving: a body nested 400 000
// levels (before the check, copying the parsed schema recursed once per level and overflowed the handler's stack:
// the process died), a schema given as text nested 5 000 levels, a schema over the nesting limit,
// a regex of 5 000 nested groups, an oversized choice list; a compile past the deadline (0.3 s here) is a 400 too.
TEST(StructuredServerLimits, HostileConstraintsAre400Fast) {
  if (!runtime::grammar_engine_available()) GTEST_SKIP() << runtime::grammar_engine_description();
  FakeModel model{4, 512};
  ByteCodec codec;
  ServerSetup setup{.context_length = 512};
  setup.http.max_body_bytes = size_t{1} << 20;  // the server's default
  runtime::GrammarLimits limits;
  limits.compile_timeout_seconds = 0.3;
  limits.max_source_bytes = 16384;
  setup.grammars = byte_grammars(limits);
  RunningServer server(model, codec, setup);
  const std::string head = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, )";
  auto post = [&](const std::string& body, const std::string& param, const std::string& says) {
    const auto start = std::chrono::steady_clock::now();
    auto r = server.client()->Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r) << param;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << param;
    EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
    const json j = json::parse(r->body, nullptr, false);
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body.substr(0, 300);
    }
    EXPECT_NE(r->body.find(says), std::string::npos) << r->body.substr(0, 300);
  };
  post(head + R"("guided_json": )" + std::string(400000, '[') + std::string(400000, ']') + "}", "",
       "the request body nests 400001 levels deep; at most 512");
  std::string deep_text;
  for (int i = 0; i < 5000; ++i) deep_text += R"({\"a\": )";
  deep_text += "1" + std::string(5000, '}');
  post(head + R"("guided_json": ")" + deep_text + R"("})", "guided_json", "nested 5000 levels deep; at most 512");
  json schema = json::object();
  for (int i = 0; i < 40; ++i) schema = {{"type", "object"}, {"properties", {{"a", schema}}}};
  post(head + R"("guided_json": )" + schema.dump() + "}", "guided_json", "nests 81 levels deep; at most 64");
  post(head + R"("guided_regex": ")" + std::string(5000, '(') + "a" + std::string(5000, ')') + R"("})",
       "guided_regex", "the regex nests 5000 levels deep");
  post(head + R"("guided_choice": [)" + [] {
    std::string c;
    for (int i = 0; i < 400; ++i) c += (i ? ", \"" : "\"") + std::string(50, 'x') + "\"";
    return c;
  }() + "]}", "guided_choice", "the choice list is 20000 bytes; at most 16384");
  // Patterns with nested repetitions, which the engine unrolls for a second or more (3 of them; ten times that
  // under ASan, where 8 took 50 s): answered at the deadline.
  json slow = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 3; ++i) {
    const char a = static_cast<char>('a' + 3 * i), b = static_cast<char>(a + 1), c = static_cast<char>(a + 2);
    slow["properties"]["p" + std::to_string(i)] = {
        {"type", "string"}, {"pattern", fmt::format("(({}|{}){{1,100}}{}){{1,100}}", a, b, c)}};
  }
  post(head + R"("guided_json": )" + slow.dump() + "}", "guided_json", "did not compile within 0.3 s");
  int status = 0;
  const json ok = post_json(*server.client(), "/v1/chat/completions",
                            {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                             {"max_tokens", 8}, {"guided_regex", "[0-9]{3}"}},
                            &status);
  EXPECT_EQ(status, 200) << ok.dump();
  EXPECT_TRUE(std::regex_match(ok["choices"][0]["message"]["content"].get<std::string>(), std::regex("[0-9]{3}")));
  // The overdue compile ends in the background (nothing is left running when the test ends).
  for (int i = 0; i < 1200 && setup.grammars->overdue_compiles() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(setup.grammars->overdue_compiles(), 0);
}

}  // namespace
}  // namespace fp4serve::server::testing
