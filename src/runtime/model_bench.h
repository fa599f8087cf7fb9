// SPDX-License-Identifier: Apache-2.0
// `fp4serve bench model`: offline prefill / decode speed of one or more loaded models, llama-bench style.
// Models are interleaved inside every repetition (A B C, then B C A, …), so a slow spell of a shared machine
// hits every model alike, and each model's speed relative to the first is taken per repetition before the
// median: the ratio is measured in one run, not pieced together from separate runs. Each sample loads its model
// afresh and frees it afterwards: with every model resident at once, the model loaded first decoded 5–10% and
// prefilled 15–25% slower than the same checkpoint loaded later (default model, 2-core VM, either order),
// an allocation-history effect that interleaving alone does not cancel.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <filesystem>

#include "backends/load_model.h"

namespace fp4serve::runtime {

struct ModelBenchConfig {
  int64_t prompt_tokens = 128;  ///< prefill length (random token ids, the same ids for every model)
  int64_t gen_tokens = 64;      ///< decode steps after the prompt (greedy, EOS ignored)
  int repetitions = 5;          ///< rounds over all models
  uint64_t seed = 0;            ///< token-id RNG seed
  /// Before each timed sample, an untimed generation of min(prompt_tokens, kWarmupPromptTokens) prompt tokens
  /// and one output token, as llama-bench's default warmup: every weight is touched once, so pages of a mapped
  /// checkpoint or weight cache that the page cache lost are read before the clock starts, for both tools alike
  /// (without it, `bench-scale`'s one-sample runs measured a 512-token prefill at hidden 4096 at 96 instead of 139
  /// tokens/s after llama.cpp's files had pushed fp4serve's out of the page cache).
  bool warmup = true;
};

/// Prompt tokens of ModelBenchConfig::warmup's generation (llama-bench's warmup prompt is at most 32 tokens too).
inline constexpr int64_t kWarmupPromptTokens = 32;

/// One model under test: a checkpoint folder and how to load it.
struct ModelBenchTarget {
  std::string name;
  std::filesystem::path dir;
  model::LoadOptions load;
};

/// One timed generation.
struct ModelBenchSample {
  double prefill_seconds = 0;  ///< time to first token: prompt forward + first sample
  double decode_seconds = 0;   ///< the remaining gen_tokens − 1 steps
};

/// Summary over repetitions (medians; min/max of the per-repetition figures show the spread).
struct ModelBenchSummary {
  std::string name;
  double prefill_tokens_per_s = 0, prefill_min = 0, prefill_max = 0;
  double decode_tokens_per_s = 0, decode_min = 0, decode_max = 0;
  double tpot_ms = 0;              ///< median time per output token in decode, milliseconds
  double decode_vs_first = 1;      ///< median over repetitions of decode speed / the first model's, same repetition
  double prefill_vs_first = 1;
};

/// The model one sample runs: what the loader loaded and the ForwardModel timed (the decoder itself, or a
/// tensor-parallel RankZeroModel around it; destroyed first).
struct BenchModel {
  model::LoadedModel loaded;
  std::unique_ptr<model::ForwardModel> wrapper;  ///< null: loaded.decoder runs
  const model::ForwardModel& model() const { return wrapper ? *wrapper : *loaded.decoder; }
};
/// Loads targets[index] for one sample; the default is model::load_model(target.dir, target.load).
using ModelBenchLoader = std::function<BenchModel(size_t index, const ModelBenchTarget& target)>;

/// Runs the benchmark: for r in 0…repetitions−1, each model (rotated start) is loaded, warms up (config.warmup),
/// prefills the same prompt, decodes gen_tokens greedily from an empty KV cache, and is freed (load time and the
/// warmup are not counted). `progress` (may be empty) is told each finished sample. Returns
/// samples[model][repetition]. Throws UsageError when a count is out of range, there is no target, or prompt +
/// generated tokens exceed a model's context (max_position_embeddings); what load_model and the model throw.
std::vector<std::vector<ModelBenchSample>> run_model_bench(
    std::span<const ModelBenchTarget> targets, const ModelBenchConfig& config,
    const std::function<void(size_t model, int repetition, const ModelBenchSample&)>& progress = {},
    const ModelBenchLoader& loader = {});

/// Medians, spreads and ratios of run_model_bench's samples for `prompt_tokens` / `gen_tokens` as configured.
/// samples[i] belongs to names[i]; every model must have the same number (≥ 1) of samples (UsageError).
std::vector<ModelBenchSummary> summarize_model_bench(std::span<const std::string> names,
                                                     const std::vector<std::vector<ModelBenchSample>>& samples,
                                                     const ModelBenchConfig& config);

/// The summaries as a Markdown table (one row per model).
std::string format_model_bench(std::span<const ModelBenchSummary> rows, const ModelBenchConfig& config);

}  // namespace fp4serve::runtime
