// SPDX-License-Identifier: Apache-2.0
// Tool-call and reasoning parsers on the goldens of tests/data/tool_calls: each output parsed whole, split in two
// at every byte boundary, and fed byte by byte must give the same content, reasoning and calls.
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

json tool_goldens() {
  std::ifstream in(std::string(FP4SERVE_TEST_DATA) + "/tool_calls/golden.json", std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

OutputParser parser_for(const json& c) {
  std::optional<ToolParser> tools;
  std::optional<ReasoningParser> reasoning;
  if (c.contains("tool_parser")) tools = tool_parser_from_name(c["tool_parser"].get<std::string>());
  if (c.contains("reasoning_parser")) reasoning = reasoning_parser_from_name(c["reasoning_parser"].get<std::string>());
  EXPECT_EQ(tools.has_value(), c.contains("tool_parser"));
  EXPECT_EQ(reasoning.has_value(), c.contains("reasoning_parser"));
  return OutputParser(tools, reasoning);
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
