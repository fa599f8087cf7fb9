// SPDX-License-Identifier: Apache-2.0
// Options shared by every subcommand that loads a model (generate, chat, perplexity, bench, serve), and the
// checks that turn a command line into a model folder and a context length before anything heavy is read.
// Commands add their own flags next to these; a flag several commands share belongs here, as one add_* helper.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <string>

#include "app/option_values.h"
#include "backends/load_model.h"

namespace fp4serve::app {

struct ModelOptions {
  std::string model;  ///< -m/--model or the positional MODEL: a folder, a .safetensors file or ORG/NAME
  model::LoadOptions load = cli_load_options();
  int64_t max_model_len = 0;  ///< -c/--ctx-size/--max-model-len; 0 = the model's limit (context_limit)
};

/// Adds MODEL (positional) with -m/--model, --device, --activation-quant, --activation-precision, --lm-head-dtype,
/// --kv-cache-dtype, --batch-invariant, --weight-cache, -t/--threads and, when `context_option`, -c/--ctx-size/--max-model-len to `cmd` (perplexity's
/// -c is its window instead). The values are parsed into opts.load as CLI11 reads them (option_values.h).
void add_model_options(CLI::App& cmd, ModelOptions& opts, bool context_option = true);
/// Adds --weight-cache auto|on|off (add_model_options does; `bench model` too).
void add_weight_cache_option(CLI::App& cmd, model::WeightCacheMode& mode);

/// Adds --tensor-parallel-size N (-tp N, see remember_command_line) and --expert-parallel to `cmd` (the launcher
/// fills the rank: TensorParallelRun).
void add_tensor_parallel_options(CLI::App& cmd, plan::ParallelConfig& parallel);

/// Adds the positional MODEL with -m/--model alone (inspect, explain, quantize).
CLI::Option* add_model_path_option(CLI::App& cmd, std::string& model, const std::string& help);

/// Adds -t/--threads.
void add_threads_option(CLI::App& cmd, int& threads);

/// Where a -m argument points, checked before load_model reads anything:
/// - an existing folder with config.json and model.safetensors or model.safetensors.index.json;
/// - an existing .safetensors file (only when `allow_file`: inspect and explain read headers only);
/// - ORG/NAME of the local Hugging Face hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/
///   hub): models--ORG--NAME/snapshots/<refs/main>/, as transformers and vLLM resolve it offline.
/// Throws UsageError naming what was found instead: a GGUF file (by its magic), a config.json file, a folder
/// without safetensors, a missing path (with the cache folders looked in and the `huggingface-cli download`
/// command when the argument looks like ORG/NAME).
std::filesystem::path resolve_model_path(const std::string& arg, bool allow_file = false);

/// The longest sequence (prompt + generated tokens) the model runs: max_position_embeddings, which is also the
/// length of the decoder's RoPE table. (vLLM multiplies it by a linear/dynamic/yarn rope_scaling factor; this
/// engine's table stops at max_position_embeddings, so the scaled figure is named in messages only.)
struct ContextLimit {
  int64_t tokens = 0;
  std::string source;  ///< "max_position_embeddings 8192" (+ the rope scaling note), for messages
};
ContextLimit context_limit(const model::ModelConfig& config);

/// The context length to allocate: --max-model-len when given, else the model's limit. Throws UsageError when
/// --max-model-len exceeds the limit (both numbers in the message) or is negative.
int64_t effective_max_model_len(const ModelOptions& opts, const model::ModelConfig& config);

/// Loads opts.model (resolve_model_path, model::load_model) and prints the plan's
/// warnings on stderr unless the log level hides warnings.
model::LoadedModel load_model_for(const ModelOptions& opts);

}  // namespace fp4serve::app
