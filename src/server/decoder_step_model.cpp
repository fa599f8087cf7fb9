// SPDX-License-Identifier: Apache-2.0
#include "server/decoder_step_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::server {

int kv_slots_for_budget(const model::ModelConfig& config, int64_t max_seq_len, int64_t budget_bytes,
                        int max_num_seqs, model::KvCacheDtype element) {
  // Keys and values for every layer, KV head and position: what model::KvCache allocates per slot.
  const int64_t per_slot = 2 * config.num_layers * max_seq_len * config.num_kv_heads * config.head_dim *
                           model::kv_cache_dtype_bytes(element);
  const int64_t fit = per_slot > 0 ? budget_bytes / per_slot : 0;
  if (fit < 1) {
    throw UsageError(fmt::format("the KV-cache budget of {} MiB holds no sequence: one slot of {} positions needs "
                                 "{} MiB (lower --max-model-len or raise --kv-cache-mib)",
                                 budget_bytes >> 20, max_seq_len, (per_slot + (1 << 20) - 1) >> 20));
  }
  return static_cast<int>(std::min<int64_t>(fit, max_num_seqs));
}

DecoderStepModel::DecoderStepModel(const model::ForwardModel& decoder, int64_t max_seq_len, int slots)
    : decoder_(decoder), cache_(decoder.make_cache(max_seq_len, slots)) {}

std::vector<float> DecoderStepModel::forward(std::span<const StepChunk> chunks) {
  batch_.clear();
  for (const auto& c : chunks) batch_.push_back({c.slot, c.start_pos, c.tokens, /*all_logits=*/false});
  return decoder_.forward(batch_, cache_);
}

}  // namespace fp4serve::server
