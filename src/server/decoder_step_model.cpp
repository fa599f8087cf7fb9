// SPDX-License-Identifier: Apache-2.0
#include "server/decoder_step_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::server {

int64_t kv_blocks_for_budget(const model::ModelConfig& config, int64_t max_seq_len, int64_t budget_bytes,
                             model::KvCacheDtype element, int64_t block_size) {
  // Keys and values for one layer group (KvGroupLayout) and every KV head of a block: what the backend's pool
  // holds per block. One sequence at full length takes a block of every group per block_size positions (a sliding
  // group's chunk included, before its window releases them).
  const model::KvGroupLayout layout =
      model::kv_group_layout(config.num_layers, model::KvCacheSpec{.layer_windows = config.layer_windows()});
  const int64_t per_block =
      model::kv_block_bytes(layout.layers_per_block, config.num_kv_heads, config.head_dim, block_size, element);
  const int64_t blocks = per_block > 0 ? budget_bytes / per_block : 0;
  const int64_t one_sequence = model::kv_blocks_for(max_seq_len, block_size) * layout.num_groups();
  if (blocks < one_sequence) {
    throw UsageError(fmt::format("the KV-cache budget of {} MiB holds {} blocks of {} positions, but one sequence of "
                                 "{} positions needs {} ({} MiB): lower --max-model-len or raise the budget (--kv-cache-memory, "
                                 "or --gpu-memory-utilization)",
                                 budget_bytes >> 20, blocks, block_size, max_seq_len, one_sequence,
                                 (one_sequence * per_block + (1 << 20) - 1) >> 20));
  }
  return blocks;
}

int64_t kv_budget_for_utilization(double fraction, int64_t total, int64_t used) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw UsageError(fmt::format("--gpu-memory-utilization {}: expected a fraction of the device's memory in (0, 1], "
                                 "e.g. 0.9",
                                 fraction));
  }
  if (total <= 0) {
    throw UsageError("--gpu-memory-utilization: this system does not report the device's total memory; give the KV "
                     "budget in GiB with --kv-cache-memory");
  }
  const auto allowed = static_cast<int64_t>(fraction * static_cast<double>(total));
  const int64_t budget = allowed - used;
  if (budget <= 0) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const double needed = std::min(1.0, (static_cast<double>(used) + kGiB) / static_cast<double>(total));
    throw UsageError(fmt::format("--gpu-memory-utilization {}: {:.2f} GiB of the device's {:.2f} GiB, but the process "
                                 "already holds {:.2f} GiB after loading, which leaves nothing for the KV cache (about "
                                 "{:.2f} leaves 1 GiB; or give the budget with --kv-cache-memory)",
                                 fraction, static_cast<double>(allowed) / kGiB, static_cast<double>(total) / kGiB,
                                 static_cast<double>(used) / kGiB, needed));
  }
  return budget;
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
