// SPDX-License-Identifier: Apache-2.0
// The production StepModel: a model::ForwardModel's batched forward (model::Decoder on any backend) over a
// model::KvCache owned here and made by that model. Only the scheduler thread uses it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "server/step_model.h"

namespace fp4serve::server {

/// Blocks of model::kDefaultKvBlockSize positions that fit in `budget_bytes` of keys and values stored as
/// `element`s (model::LoadedModel::kv_element) for `config`'s layers and KV heads. Throws UsageError naming the
/// sizes when the budget does not hold one sequence of `max_seq_len` positions.
int64_t kv_blocks_for_budget(const model::ModelConfig& config, int64_t max_seq_len, int64_t budget_bytes,
                             model::KvCacheDtype element, int64_t block_size = model::kDefaultKvBlockSize);

/// The KV budget in bytes of `--gpu-memory-utilization fraction`, vLLM's flag on either device: this process may
/// fill `fraction` of the device's `total` memory (RAM on the CPU, the GPU's memory), and what it holds there after
/// loading (`used`: the weights as loaded, buffers) comes off: budget = ⌊fraction · total⌋ − used. Throws
/// UsageError naming the flag when fraction is not in (0, 1], when total is unknown (0), or when nothing is left
/// for the cache (with the sizes and the fraction that would leave 1 GiB).
int64_t kv_budget_for_utilization(double fraction, int64_t total, int64_t used);

class DecoderStepModel final : public StepModel {
 public:
  /// A cache of `spec` made by `decoder` (its pool's memory is committed as blocks are first used).
  DecoderStepModel(const model::ForwardModel& decoder, const model::KvCacheSpec& spec);
  /// The same with spec {max_seq_len, slots}: a pool that holds every slot at full length.
  DecoderStepModel(const model::ForwardModel& decoder, int64_t max_seq_len, int slots);

  int64_t vocab_size() const override { return decoder_.config().vocab_size; }
  model::KvCache& cache() override { return cache_; }
  const model::KvCache& cache() const override { return cache_; }
  std::vector<float> forward(std::span<const StepChunk> chunks) override;

 private:
  const model::ForwardModel& decoder_;
  model::KvCache cache_;
  std::vector<model::SequenceChunk> batch_;
};

}  // namespace fp4serve::server
