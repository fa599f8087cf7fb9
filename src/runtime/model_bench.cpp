// SPDX-License-Identifier: Apache-2.0
#include "runtime/model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "fp4serve/error.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"

namespace fp4serve::runtime {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double per_second(int64_t count, double seconds) { return static_cast<double>(count) / std::max(seconds, 1e-12); }

}  // namespace

std::vector<std::vector<ModelBenchSample>> run_model_bench(
    std::span<const ModelBenchTarget> targets, const ModelBenchConfig& config,
    const std::function<void(size_t, int, const ModelBenchSample&)>& progress, const ModelBenchLoader& loader) {
  if (targets.empty()) throw UsageError("bench model: no model to benchmark");
  if (config.prompt_tokens < 1 || config.gen_tokens < 2 || config.repetitions < 1) {
    throw UsageError(fmt::format("bench model: prompt tokens ({}) and repetitions ({}) must be ≥ 1 and generated "
                                 "tokens ({}) ≥ 2 (decode speed needs a step after the first token)",
                                 config.prompt_tokens, config.repetitions, config.gen_tokens));
  }
  // Ids drawn from the vocabulary all models share, so every model reads the same prompt; the configs are read
  // without loading weights.
  int64_t vocab = INT64_MAX;
  for (const ModelBenchTarget& t : targets) {
    const model::ModelConfig cfg = model::parse_model_config(checkpoint::Checkpoint::open(t.dir).config());
    if (cfg.max_position_embeddings > 0 && config.prompt_tokens + config.gen_tokens > cfg.max_position_embeddings) {
      throw UsageError(fmt::format("bench model: {}: {} prompt + {} generated tokens exceed its context of {}", t.name,
                                   config.prompt_tokens, config.gen_tokens, cfg.max_position_embeddings));
    }
    vocab = std::min(vocab, cfg.vocab_size);
  }
  std::mt19937_64 rng(config.seed);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  GenerationRequest request;
  for (int64_t i = 0; i < config.prompt_tokens; ++i) request.prompt.push_back(static_cast<int32_t>(pick(rng)));
  request.max_new_tokens = config.gen_tokens;
  request.ignore_eos = true;
  request.sampling.temperature = 0.0f;  // greedy: the same work every repetition

  std::vector<std::vector<ModelBenchSample>> samples(targets.size());
  for (int r = 0; r < config.repetitions; ++r) {
    for (size_t j = 0; j < targets.size(); ++j) {
      const size_t i = (j + static_cast<size_t>(r)) % targets.size();
      const ModelBenchTarget& t = targets[i];
      const BenchModel bench = loader ? loader(i, t) : BenchModel{model::load_model(t.dir, t.load), nullptr};
      const text::Tokenizer tokenizer = load_tokenizer(bench.loaded.checkpoint);
      if (config.warmup) {
        GenerationRequest warm = request;
        warm.prompt.resize(static_cast<size_t>(std::min(config.prompt_tokens, kWarmupPromptTokens)));
        warm.max_new_tokens = 1;
        model::KvCache warm_cache = bench.model().make_cache(static_cast<int64_t>(warm.prompt.size()) + 1, 1);
        generate(bench.model(), warm_cache, tokenizer, warm, [](std::string_view) { return true; });
      }
      model::KvCache cache = bench.model().make_cache(config.prompt_tokens + config.gen_tokens, 1);
      const GenerationResult result = generate(bench.model(), cache, tokenizer, request, [](std::string_view) { return true; });
      if (static_cast<int64_t>(result.tokens.size()) != config.gen_tokens) {
        throw FormatError(fmt::format("bench model: {} generated {} of {} tokens", t.name, result.tokens.size(),
                                      config.gen_tokens));
      }
      samples[i].push_back({result.prefill_seconds, result.decode_seconds});
      if (progress) progress(i, r, samples[i].back());
    }
  }
  return samples;
}

std::vector<ModelBenchSummary> summarize_model_bench(std::span<const std::string> names,
                                                     const std::vector<std::vector<ModelBenchSample>>& samples,
                                                     const ModelBenchConfig& config) {
  if (names.size() != samples.size() || samples.empty() || samples.front().empty()) {
    throw UsageError("summarize_model_bench: one non-empty sample list per model name is required");
  }
  const size_t reps = samples.front().size();
  const int64_t decode_steps = config.gen_tokens - 1;
  auto prefill_rate = [&](const ModelBenchSample& s) { return per_second(config.prompt_tokens, s.prefill_seconds); };
  auto decode_rate = [&](const ModelBenchSample& s) { return per_second(decode_steps, s.decode_seconds); };
  std::vector<ModelBenchSummary> out;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].size() != reps) throw UsageError("summarize_model_bench: models have different sample counts");
    std::vector<double> prefill, decode, tpot, decode_ratio, prefill_ratio;
    for (size_t r = 0; r < reps; ++r) {
      const ModelBenchSample& s = samples[i][r];
      prefill.push_back(prefill_rate(s));
      decode.push_back(decode_rate(s));
      tpot.push_back(1e3 * s.decode_seconds / static_cast<double>(decode_steps));
      decode_ratio.push_back(decode.back() / decode_rate(samples[0][r]));
      prefill_ratio.push_back(prefill.back() / prefill_rate(samples[0][r]));
    }
    ModelBenchSummary row;
    row.name = names[i];
    row.prefill_tokens_per_s = median(prefill);
    row.prefill_min = *std::min_element(prefill.begin(), prefill.end());
    row.prefill_max = *std::max_element(prefill.begin(), prefill.end());
    row.decode_tokens_per_s = median(decode);
    row.decode_min = *std::min_element(decode.begin(), decode.end());
    row.decode_max = *std::max_element(decode.begin(), decode.end());
    row.tpot_ms = median(tpot);
    row.decode_vs_first = median(decode_ratio);
    row.prefill_vs_first = median(prefill_ratio);
    out.push_back(std::move(row));
  }
  return out;
}

std::string format_model_bench(std::span<const ModelBenchSummary> rows, const ModelBenchConfig& config) {
  std::string out = fmt::format(
      "prompt {} tokens, decode {} tokens, {} repetitions (models interleaved{}); medians, [min–max]; ratios are "
      "per-repetition medians vs the first model\n\n",
      config.prompt_tokens, config.gen_tokens, config.repetitions, config.warmup ? ", each after a warmup" : "");
  out += "| model | prefill tok/s | decode tok/s | TPOT ms | prefill vs first | decode vs first |\n";
  out += "|---|---|---|---|---|---|\n";
  for (const ModelBenchSummary& r : rows) {
    out += fmt::format("| {} | {:.1f} [{:.1f}–{:.1f}] | {:.2f} [{:.2f}–{:.2f}] | {:.2f} | {:.3f} | {:.3f} |\n", r.name,
                       r.prefill_tokens_per_s, r.prefill_min, r.prefill_max, r.decode_tokens_per_s, r.decode_min,
                       r.decode_max, r.tpot_ms, r.prefill_vs_first, r.decode_vs_first);
  }
  return out;
}

}  // namespace fp4serve::runtime
