// SPDX-License-Identifier: Apache-2.0
#include "app/model_options.h"

#include <algorithm>

namespace fp4serve::app {

void add_model_options(CLI::App& cmd, ModelOptions& opts) {
  cmd.add_option("-m,--model", opts.model_dir, "checkpoint folder (config.json + safetensors)")->required();
  cmd.add_option("--device", opts.load.device,
                 "cpu; cuda (run on the GPU found: generate and chat); or a GPU generation for a dry-run plan (sm80, sm86, sm89, sm90, sm100, sm120)")
      ->capture_default_str();
  cmd.add_option("--activation-quant", opts.load.activation_quant,
                 "auto (follow the scheme table), weight-only, or emulate (W4A4 emulation, the numerical reference)")
      ->check(CLI::IsMember({"auto", "weight-only", "emulate"}))
      ->capture_default_str();
  cmd.add_option("--activation-precision", opts.load.activation_precision,
                 "fp32, or int8: NVFP4/MXFP4 linears quantize their input to int8 per weight group and use integer dot products")
      ->check(CLI::IsMember({"fp32", "int8"}))
      ->capture_default_str();
  cmd.add_option("--lm-head-dtype", opts.load.lm_head_dtype,
                 "bf16 (as stored), fp8 or int8 (per-row scaled copy in memory): how an unquantized lm_head / tied embedding is served")
      ->check(CLI::IsMember({"bf16", "fp8", "int8"}))
      ->capture_default_str();
  cmd.add_option("--threads", opts.load.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("--max-model-len", opts.max_model_len, "context length to allocate (0 = min(model limit, 4096))");
}

int64_t effective_max_model_len(const ModelOptions& opts, const model::ModelConfig& config) {
  if (opts.max_model_len > 0) return opts.max_model_len;
  return std::min<int64_t>(config.max_position_embeddings, 4096);
}

}  // namespace fp4serve::app
