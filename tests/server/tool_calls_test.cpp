// SPDX-License-Identifier: Apache-2.0
// Tool-call and reasoning parsers on the goldens of tests/data/tool_calls (hand-written ones, and the outputs each
// family's published chat template renders for an assistant turn with tool calls and reasoning): each output parsed
// whole, split in two at every byte boundary, and fed byte by byte must give the same content, reasoning and calls,
// whole and streamed.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;

json read_goldens(const std::string& file) {
  std::ifstream in(std::string(FP4SERVE_TEST_DATA) + "/tool_calls/" + file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

// The hand-written goldens, then the outputs rendered by each family's published chat template
// (tools/tool_calls/make_parser_goldens.py).
json tool_goldens() {
  json all = read_goldens("golden.json");
  const json rendered = read_goldens("rendered.json");
  EXPECT_GE(rendered.size(), 17u);
  for (const auto& c : rendered) all.push_back(c);
  return all;
}

OutputParser parser_for(const json& c, CallOutput mode = CallOutput::kWhole) {
  std::optional<ToolParser> tools;
  std::optional<ReasoningParser> reasoning;
  if (c.contains("tool_parser")) tools = tool_parser_from_name(c["tool_parser"].get<std::string>());
  if (c.contains("reasoning_parser")) reasoning = reasoning_parser_from_name(c["reasoning_parser"].get<std::string>());
  EXPECT_EQ(tools.has_value(), c.contains("tool_parser"));
  EXPECT_EQ(reasoning.has_value(), c.contains("reasoning_parser"));
  return OutputParser(tools, reasoning, mode);
}

void expect_golden(const json& c, const ParsedOutput& got, const std::string& how) {
  const std::string label = c["name"].get<std::string>() + " (" + how + ")";
  EXPECT_EQ(got.content, c["content"].get<std::string>()) << label;
  EXPECT_EQ(got.reasoning, c["reasoning"].get<std::string>()) << label;
  ASSERT_EQ(got.calls.size(), c["calls"].size()) << label;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, c["calls"][i]["name"].get<std::string>()) << label;
    EXPECT_EQ(json::parse(got.calls[i].arguments), c["calls"][i]["arguments"]) << label;
  }
}

TEST(ToolCallParsers, GoldensWholeSplitAndByteByByte) {
  const json goldens = tool_goldens();
  ASSERT_GE(goldens.size(), 15u);
  for (const auto& c : goldens) {
    const std::string output = c["output"];
    {
      OutputParser p = parser_for(c);
      ParsedOutput got = p.push(output);
      got += p.finish();
      expect_golden(c, got, "whole");
    }
    for (size_t cut = 1; cut < output.size(); ++cut) {
      OutputParser p = parser_for(c);
      ParsedOutput got = p.push(output.substr(0, cut));
      got += p.push(output.substr(cut));
      got += p.finish();
      expect_golden(c, got, "split at " + std::to_string(cut));
      if (::testing::Test::HasFailure()) return;
    }
    OutputParser p = parser_for(c);
    ParsedOutput got;
    for (const char ch : output) got += p.push(std::string_view(&ch, 1));
    got += p.finish();
    expect_golden(c, got, "byte by byte");
  }
}

// Streamed calls (CallOutput::kStreamed) on every golden, fed whole, split at every byte boundary and byte by byte:
// each call's first piece carries its name (and only the first), and the pieces concatenate to exactly the
// arguments text the whole parser returns; content and reasoning are the golden's. The one difference by design:
// a call whose arguments turn out not to be JSON was already announced, so it stays a call.
void expect_streamed(const json& c, const ParsedOutput& whole, const ParsedOutput& got, const std::string& how) {
  const std::string label = c["name"].get<std::string>() + " (streamed, " + how + ")";
  EXPECT_TRUE(got.calls.empty()) << label;
  std::vector<bool> named;
  for (const auto& d : got.deltas) {
    ASSERT_GE(d.index, 0) << label;
    if (static_cast<size_t>(d.index) >= named.size()) {
      ASSERT_EQ(static_cast<size_t>(d.index), named.size()) << label << ": calls out of order";
      ASSERT_FALSE(d.name.empty()) << label << ": the first piece of call " << d.index << " has no name";
      named.push_back(true);
    } else {
      EXPECT_TRUE(d.name.empty()) << label << ": a later piece repeats the name";
    }
  }
  const std::vector<ToolCall> calls = assemble_calls(got.deltas);
  if (c["name"].get<std::string>().find("broken") != std::string::npos && whole.calls.empty() && !calls.empty()) {
    EXPECT_EQ(calls.size(), 1u) << label;  // announced, then not JSON: stays a call (see tool_calls.h)
    return;
  }
  EXPECT_EQ(got.content, whole.content) << label;
  EXPECT_EQ(got.reasoning, whole.reasoning) << label;
  ASSERT_EQ(calls.size(), whole.calls.size()) << label;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].name, whole.calls[i].name) << label;
    EXPECT_EQ(calls[i].arguments, whole.calls[i].arguments) << label;  // byte for byte
  }
}

TEST(ToolCallParsers, StreamedCallsConcatenateToTheWholeOnes) {
  const json goldens = tool_goldens();
  int fragmented = 0;  // goldens whose arguments came in more than one piece when fed byte by byte
  for (const auto& c : goldens) {
    const std::string output = c["output"];
    OutputParser w = parser_for(c);
    ParsedOutput whole = w.push(output);
    whole += w.finish();
    {
      OutputParser p = parser_for(c, CallOutput::kStreamed);
      ParsedOutput got = p.push(output);
      got += p.finish();
      expect_streamed(c, whole, got, "whole");
    }
    for (size_t cut = 1; cut < output.size(); ++cut) {
      OutputParser p = parser_for(c, CallOutput::kStreamed);
      ParsedOutput got = p.push(output.substr(0, cut));
      got += p.push(output.substr(cut));
      got += p.finish();
      expect_streamed(c, whole, got, "split at " + std::to_string(cut));
      if (::testing::Test::HasFailure()) return;
    }
    OutputParser p = parser_for(c, CallOutput::kStreamed);
    ParsedOutput got;
    for (const char ch : output) got += p.push(std::string_view(&ch, 1));
    got += p.finish();
    expect_streamed(c, whole, got, "byte by byte");
    if (got.deltas.size() > 2 * whole.calls.size() && !whole.calls.empty()) ++fragmented;
  }
  EXPECT_GE(fragmented, 8) << "arguments were not streamed in fragments";
}

// A streamed call: the name as soon as it is written, then the arguments as they come, before the call ends.
TEST(ToolCallParsers, StreamsArgumentsAsTheModelWritesThem) {
  OutputParser p(ToolParser::kHermes, std::nullopt, CallOutput::kStreamed);
  EXPECT_EQ(p.push("Checking. <tool_call>\n{\"name\": \"get_wea").deltas.size(), 0u);
  ParsedOutput named = p.push("ther\", \"arguments\": {\"ci");
  ASSERT_EQ(named.deltas.size(), 2u);
  EXPECT_EQ(named.deltas[0].name, "get_weather");
  EXPECT_EQ(named.deltas[0].arguments, "");
  EXPECT_EQ(named.deltas[1].arguments, "{\"ci");
  ParsedOutput more = p.push("ty\": \"Paris\"}}\n</tool");
  ASSERT_EQ(more.deltas.size(), 1u);
  EXPECT_EQ(more.deltas[0].arguments, "ty\": \"Paris\"}");
  ParsedOutput end = p.push("_call>");
  EXPECT_TRUE(end.deltas.empty());
  EXPECT_TRUE(p.finish().content.empty());
  // A forced named function streams its output as the arguments; required streams each call.
  ForcedCallStream named_fn(std::string("get_weather"));
  auto d = named_fn.push(" {\"city\"");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[1].arguments, "{\"city\"");
  EXPECT_EQ(named_fn.push(": \"Oslo\"} \n")[0].arguments, ": \"Oslo\"}");
  EXPECT_TRUE(named_fn.finish().empty());
  const std::string required = R"([{"name": "a", "parameters": {"x": [1, 2]}}, {"name": "b", "parameters": {}}])";
  for (size_t cut = 1; cut < required.size(); ++cut) {
    ForcedCallStream r(std::nullopt);
    auto pieces = r.push(required.substr(0, cut));
    for (auto& x : r.push(required.substr(cut))) pieces.push_back(x);
    for (auto& x : r.finish()) pieces.push_back(x);
    const auto calls = assemble_calls(pieces);
    const auto expected = forced_tool_calls(required, std::nullopt);
    ASSERT_EQ(calls.size(), 2u) << cut;
    EXPECT_EQ(calls[0].name, "a");
    EXPECT_EQ(calls[0].arguments, expected[0].arguments) << cut;
    EXPECT_EQ(calls[1].arguments, expected[1].arguments) << cut;
  }
  EXPECT_EQ(forced_tool_calls(required, std::nullopt)[0].arguments, R"({"x": [1, 2]})");
}

// Content is streamed as it comes (only a possible marker is held back), and a call only once it is whole.
TEST(ToolCallParsers, StreamsContentEarlyAndCallsWhole) {
  OutputParser p(ToolParser::kHermes, std::nullopt);
  EXPECT_EQ(p.push("Sure, checking").content, "Sure, checking");
  EXPECT_EQ(p.push(" now <tool_").content, " now");  // the space may precede a call: held with "<tool_"
  ParsedOutput mid = p.push("call>\n{\"name\": \"f\", \"argu");
  EXPECT_TRUE(mid.content.empty());
  EXPECT_TRUE(mid.calls.empty());
  ParsedOutput end = p.push("ments\": {}}\n</tool_call>");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].name, "f");
  EXPECT_EQ(end.calls[0].arguments, "{}");
  EXPECT_TRUE(p.finish().content.empty());
}

TEST(ToolCallParsers, DetectsTheFamilyFromArchitectureAndTemplate) {
  EXPECT_EQ(detect_tool_parser("Qwen2ForCausalLM", "{% for tool in tools %}<tools>…<tool_call>"), ToolParser::kHermes);
  EXPECT_EQ(detect_tool_parser("LlamaForCausalLM", "<|python_tag|>{{ tool_call }}"), ToolParser::kLlama3Json);
  EXPECT_EQ(detect_tool_parser("MistralForCausalLM", "[AVAILABLE_TOOLS]…[TOOL_CALLS]"), ToolParser::kMistral);
  EXPECT_EQ(detect_tool_parser("GraniteForCausalLM", "<|tool_call|>"), ToolParser::kGranite);
  EXPECT_EQ(detect_tool_parser("GptOssForCausalLM", ""), ToolParser::kOpenAi);
  EXPECT_EQ(detect_tool_parser("LlamaForCausalLM", "{{ messages }}"), std::nullopt);  // SmolLM2: no tool format
  for (const char* name : {"hermes", "llama3_json", "mistral", "granite", "openai"}) {
    EXPECT_EQ(tool_parser_name(*tool_parser_from_name(name)), std::string(name));
  }
  EXPECT_EQ(tool_parser_from_name("pythonic"), std::nullopt);
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningParser::kQwen3);
  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningParser::kDeepSeekR1);
  EXPECT_EQ(reasoning_parser_from_name("openai_gptoss"), ReasoningParser::kGptOss);
}

// The published templates in tests/data/tokenizers/published pick the parser vLLM's documentation names for each
// family (Granite 4.0 writes <tool_call>: hermes; Llama 3.2's template has no <|python_tag|> but renders tools).
TEST(ToolCallParsers, PublishedTemplatesPickTheirFamilysParser) {
  const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/published/";
  auto read = [&](const std::string& name) {
    std::ifstream in(dir + name, std::ios::binary);
    EXPECT_TRUE(in) << name;
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::vector<std::tuple<std::string, std::string, std::optional<ToolParser>>> cases = {
      {"HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "LlamaForCausalLM", std::nullopt},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen2ForCausalLM", ToolParser::kHermes},
      {"Qwen-Qwen3-0.6B.jinja", "Qwen3ForCausalLM", ToolParser::kHermes},
      {"ibm-granite-granite-3.0-8b-instruct.jinja", "GraniteForCausalLM", ToolParser::kGranite},
      {"ibm-granite-granite-3.3-2B-Instruct.jinja", "GraniteForCausalLM", ToolParser::kGranite},
      {"ibm-granite-granite-4.0.jinja", "GraniteMoeHybridForCausalLM", ToolParser::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", "LlamaForCausalLM", ToolParser::kLlama3Json},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", "LlamaForCausalLM", ToolParser::kLlama3Json},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", "LlamaForCausalLM", ToolParser::kLlama3Json},
      {"mistralai-Mistral-7B-Instruct-v0.2.jinja", "MistralForCausalLM", std::nullopt},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "MistralForCausalLM", ToolParser::kMistral},
      {"openai-gpt-oss-120b.jinja", "GptOssForCausalLM", ToolParser::kOpenAi}};
  for (const auto& [file, arch, expected] : cases) {
    EXPECT_EQ(detect_tool_parser(arch, read(file)), expected) << file;
  }
}

TEST(ToolCallParsers, ForcedToolCalls) {
  auto calls = forced_tool_calls(R"([{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}])", std::nullopt);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "a");
  EXPECT_EQ(json::parse(calls[0].arguments), json({{"x", 1}}));
  calls = forced_tool_calls(R"({"city": "Oslo"})", std::string("get_weather"));
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_THROW(forced_tool_calls(R"([{"name": "a", "param)", std::nullopt), UsageError);
  EXPECT_THROW(forced_tool_calls("[]", std::nullopt), UsageError);
  EXPECT_THROW(forced_tool_calls(R"({"city": )", std::string("f")), UsageError);
}

}  // namespace
}  // namespace fp4serve::server
