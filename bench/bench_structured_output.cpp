// SPDX-License-Identifier: Apache-2.0
// What constrained decoding adds to one sequence's decode step: the grammar engine's next-token bitmask over the
// real SmolLM2 vocabulary (49152 tokens) plus runtime::apply_token_bitmask on the logits row, in the states a
// JSON reply passes through (after "{", inside a string, in an integer array, after a complete object), and the
// compile of a schema (cold, then from the cache). Compare with the decode step time of `fp4serve bench serve`
// (TPOT): the overhead per token is this time per constrained sequence.
#include <benchmark/benchmark.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "runtime/sampler.h"
#include "runtime/structured_output.h"
#include "text/tokenizer.h"

namespace fp4serve::runtime {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Vocab {
  text::Tokenizer tokenizer;
  std::shared_ptr<GrammarCompiler> compiler;
};

Vocab& vocab() {
  static Vocab v = [] {
    const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/smollm2-real/";
    const std::string json = read_text(dir + "tokenizer.json");
    text::Tokenizer tok = text::Tokenizer::from_json(nlohmann::json::parse(json),
                                                     nlohmann::json::parse(read_text(dir + "tokenizer_config.json")));
    auto compiler = std::make_shared<GrammarCompiler>(vocabulary_info(tok, json, tok.vocab_size(), {*tok.eos_id()}), 2);
    return Vocab{std::move(tok), std::move(compiler)};
  }();
  return v;
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "ids": {"type": "array", "items": {"type": "integer"}},
  "kind": {"enum": ["bolt", "nut", "gear"]}, "ok": {"type": "boolean"}},
  "required": ["name", "ids", "kind", "ok"]})";

// Mask + apply in the state reached after `prefix` (text the model wrote, tokenized).
void BM_MaskAfter(benchmark::State& state, const std::string& prefix) {
  if (!grammar_engine_available()) {
    state.SkipWithError("built without the grammar engine");
    return;
  }
  Vocab& v = vocab();
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kJsonSchema;
  spec.source = kSchema;
  GrammarMatcher matcher(v.compiler->compile(spec));
  for (const int32_t t : v.tokenizer.encode(prefix, false)) {
    if (!matcher.accept(t)) {
      state.SkipWithError("prefix not accepted");
      return;
    }
  }
  std::vector<float> logits(static_cast<size_t>(v.compiler->vocab_size()));
  std::mt19937 rng(1);
  for (auto& x : logits) x = std::normal_distribution<float>()(rng);
  const std::vector<float> fresh = logits;
  for (auto _ : state) {
    logits = fresh;
    apply_token_bitmask(logits, matcher.next_token_bitmask());
    benchmark::DoNotOptimize(logits.data());
  }
}

BENCHMARK_CAPTURE(BM_MaskAfter, object_start, std::string("{"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskAfter, in_string, std::string(R"({"name": "Hello wor)"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskAfter, in_int_array, std::string(R"({"name": "x", "ids": [12, 3)"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskAfter, enum_value, std::string(R"({"name": "x", "ids": [], "kind": ")"))->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MaskAfter, complete, std::string(R"({"name": "x", "ids": [], "kind": "nut", "ok": true})"))
    ->Unit(benchmark::kMicrosecond);

// Copying the row alone (the baseline the mask adds to).
void BM_RowCopy(benchmark::State& state) {
  std::vector<float> logits(49152, 1.0f);
  const std::vector<float> fresh = logits;
  for (auto _ : state) {
    logits = fresh;
    benchmark::DoNotOptimize(logits.data());
  }
}
BENCHMARK(BM_RowCopy)->Unit(benchmark::kMicrosecond);

// A schema compiled the first time (each iteration a new schema text) and again (the cache).
void BM_CompileSchema(benchmark::State& state) {
  if (!grammar_engine_available()) {
    state.SkipWithError("built without the grammar engine");
    return;
  }
  const bool cached = state.range(0) != 0;
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kJsonSchema;
  int64_t i = 0;
  for (auto _ : state) {
    spec.source = std::string(kSchema).replace(1, 0, "\"title\": \"s" + std::to_string(cached ? 0 : i++) + "\", ");
    benchmark::DoNotOptimize(vocab().compiler->compile(spec));
  }
}
BENCHMARK(BM_CompileSchema)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fp4serve::runtime

BENCHMARK_MAIN();
