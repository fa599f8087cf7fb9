// SPDX-License-Identifier: Apache-2.0
// Options shared by every subcommand that loads a model (generate, chat, perplexity, bench, serve).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "model/loader.h"

namespace fp4serve::app {

struct ModelOptions {
  std::string model_dir;
  model::LoadOptions load;
  int64_t max_model_len = 0;  ///< 0: min(config max_position_embeddings, 4096)
};

/// Adds -m/--model, --device, --activation-quant, --activation-precision, --lm-head-dtype, --threads and --max-model-len to `cmd`.
void add_model_options(CLI::App& cmd, ModelOptions& opts);

/// The context length to allocate: --max-model-len, else min(max_position_embeddings, 4096).
int64_t effective_max_model_len(const ModelOptions& opts, const model::ModelConfig& config);

}  // namespace fp4serve::app
