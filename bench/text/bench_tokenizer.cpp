// SPDX-License-Identifier: Apache-2.0
// Tokenizer and chat-template speed on the 21 KB multilingual fixture: encode with a cold word cache (a fresh
// tokenizer per iteration, construction excluded) and warm, decode, streaming decode, loading, rendering.
// Counters: bytes/s of input text (encode) or ids/s (decode, stream).
#include <benchmark/benchmark.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace fp4serve::text {
namespace {

const std::string kDir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string& text() {
  static const std::string t = read_text(kDir + "multilingual.txt");
  return t;
}

const nlohmann::json& tokenizer_json(const std::string& family) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(family);
  if (it == cache.end()) it = cache.emplace(family, nlohmann::json::parse(read_text(kDir + family + "/tokenizer.json"))).first;
  return it->second;
}

void BM_EncodeCold(benchmark::State& state, const std::string& family) {
  const nlohmann::json& j = tokenizer_json(family);
  size_t ids = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const Tokenizer tok = Tokenizer::from_json(j, nullptr);
    state.ResumeTiming();
    ids = tok.encode(text(), true).size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
  state.counters["ids"] = static_cast<double>(ids);
}

void BM_EncodeWarm(benchmark::State& state, const std::string& family) {
  const Tokenizer tok = Tokenizer::from_json(tokenizer_json(family), nullptr);
  tok.encode(text(), true);
  for (auto _ : state) benchmark::DoNotOptimize(tok.encode(text(), true));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
}

void BM_Decode(benchmark::State& state, const std::string& family) {
  const Tokenizer tok = Tokenizer::from_json(tokenizer_json(family), nullptr);
  const auto ids = tok.encode(text(), true);
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids, true));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

void BM_StreamDecode(benchmark::State& state, const std::string& family) {
  const Tokenizer tok = Tokenizer::from_json(tokenizer_json(family), nullptr);
  const auto ids = tok.encode(text(), true);
  for (auto _ : state) {
    StreamDecoder stream(tok);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += stream.push(id).size();
    bytes += stream.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}

void BM_LoadSmolLM2(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(Tokenizer::from_files(kDir + "smollm2-real/tokenizer.json", nullptr));
  }
}

void BM_RenderChat(benchmark::State& state, const std::string& name) {
  const ChatTemplate tmpl = ChatTemplate::from_file(kDir + "chat_templates/" + name + ".jinja");
  std::vector<ChatMessage> messages = {{"system", "You are terse."}};
  for (int k = 0; k < 10; ++k) {
    messages.push_back({"user", "Question number " + std::to_string(k) + "?"});
    messages.push_back({"assistant", "Answer number " + std::to_string(k) + "."});
  }
  messages.push_back({"user", "Last question?"});
  const nlohmann::json extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  for (auto _ : state) benchmark::DoNotOptimize(tmpl.render(messages, true, extra));
}

BENCHMARK_CAPTURE(BM_EncodeCold, gpt2, std::string("gpt2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, qwen2, std::string("qwen2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, smollm2_real, std::string("smollm2-real"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, mistral, std::string("mistral"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWarm, smollm2_real, std::string("smollm2-real"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWarm, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, smollm2_real, std::string("smollm2-real"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, smollm2_real, std::string("smollm2-real"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, llama2, std::string("llama2"))->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadSmolLM2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RenderChat, llama3, std::string("llama3"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_RenderChat, mistral, std::string("mistral"))->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace fp4serve::text

BENCHMARK_MAIN();
