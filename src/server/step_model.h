// SPDX-License-Identifier: Apache-2.0
// What the scheduler needs from a model: KV-cache slots and one batched forward step. The production
// implementation (decoder_step_model.h) wraps model::Decoder + model::KvCache; tests drive the scheduler with a
// small deterministic model so that batching bookkeeping is checked independently of the kernels.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fp4serve::server {

/// One sequence's share of a step: `tokens` at positions start_pos … start_pos + size − 1 of the sequence held
/// in `slot` (positions before start_pos are already cached).
struct StepChunk {
  int slot = -1;
  int64_t start_pos = 0;
  std::span<const int32_t> tokens;
};

/// Not thread-safe: only the scheduler thread calls it.
class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual int64_t vocab_size() const = 0;
  /// Positions one slot holds (the context length requests are checked against).
  virtual int64_t max_seq_len() const = 0;
  virtual int max_slots() const = 0;
  /// A free KV-cache slot, or −1 when all are in use.
  virtual int acquire_slot() = 0;
  virtual void release_slot(int slot) = 0;
  /// Whether copy_prefix works (n > 1 then prefills a prompt once). Default: no.
  virtual bool can_copy_prefix() const { return false; }
  /// Makes `dst` (acquired, empty) hold the first `positions` cached positions of `src`, as if it had been
  /// prefilled with the same tokens. Only called when can_copy_prefix(); may throw (the scheduler then prefills
  /// `dst` itself).
  virtual void copy_prefix(int src, int dst, int64_t positions) {
    (void)src;
    (void)dst;
    (void)positions;
  }
  /// Runs all chunks as one step and returns the logits of each chunk's last token, [chunks, vocab] fp32 in
  /// chunk order. May throw; the scheduler then fails the sequences of this step and keeps serving.
  virtual std::vector<float> forward(std::span<const StepChunk> chunks) = 0;
};

}  // namespace fp4serve::server
