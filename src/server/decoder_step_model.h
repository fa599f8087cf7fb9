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

/// KV-cache slots that fit in `budget_bytes` when each reserves `max_seq_len` positions of keys and values stored
/// as `element`s (model::LoadedModel::kv_element), capped at `max_num_seqs`. Throws UsageError naming the sizes
/// when not even one slot fits.
int kv_slots_for_budget(const model::ModelConfig& config, int64_t max_seq_len, int64_t budget_bytes,
                        int max_num_seqs, model::KvCacheDtype element);

class DecoderStepModel final : public StepModel {
 public:
  /// A cache of `slots` sequences of `max_seq_len` positions made by `decoder` (memory is allocated when a slot
  /// is first used).
  DecoderStepModel(const model::ForwardModel& decoder, int64_t max_seq_len, int slots);

  int64_t vocab_size() const override { return decoder_.config().vocab_size; }
  int64_t max_seq_len() const override { return cache_.max_seq_len(); }
  int max_slots() const override { return cache_.max_slots(); }
  int acquire_slot() override { return cache_.acquire(); }
  void release_slot(int slot) override { cache_.release(slot); }
  std::vector<float> forward(std::span<const StepChunk> chunks) override;

 private:
  const model::ForwardModel& decoder_;
  model::KvCache cache_;
  std::vector<model::SequenceChunk> batch_;
};

}  // namespace fp4serve::server
