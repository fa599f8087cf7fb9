// SPDX-License-Identifier: Apache-2.0
#include "server/decoder_step_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::server {

int64_t kv_blocks_for_budget(const model::ModelConfig& config, int64_t max_seq_len, int64_t budget_bytes,
                             model::KvCacheDtype element, int64_t block_size) {
  // Keys and values for every layer and KV head of one block: what the backend's pool holds per block.
  const int64_t per_block =
      model::kv_block_bytes(config.num_layers, config.num_kv_heads, config.head_dim, block_size, element);
  const int64_t blocks = per_block > 0 ? budget_bytes / per_block : 0;
  const int64_t one_sequence = model::kv_blocks_for(max_seq_len, block_size);
  if (blocks < one_sequence) {
    throw UsageError(fmt::format("the KV-cache budget of {} MiB holds {} blocks of {} positions, but one sequence of "
                                 "{} positions needs {} ({} MiB): lower --max-model-len or raise --kv-cache-memory",
                                 budget_bytes >> 20, blocks, block_size, max_seq_len, one_sequence,
                                 (one_sequence * per_block + (1 << 20) - 1) >> 20));
  }
  return blocks;
}

DecoderStepModel::DecoderStepModel(const model::ForwardModel& decoder, const model::KvCacheSpec& spec)
    : decoder_(decoder), cache_(decoder.make_cache(spec)) {}

DecoderStepModel::DecoderStepModel(const model::ForwardModel& decoder, int64_t max_seq_len, int slots)
    : DecoderStepModel(decoder, model::KvCacheSpec{max_seq_len, slots}) {}

std::vector<float> DecoderStepModel::forward(std::span<const StepChunk> chunks) {
  batch_.clear();
  for (const auto& c : chunks) batch_.push_back({c.slot, c.start_pos, c.tokens, /*all_logits=*/false});
  return decoder_.forward(batch_, cache_);
}

}  // namespace fp4serve::server
