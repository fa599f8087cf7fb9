// SPDX-License-Identifier: Apache-2.0
#include "model/backend.h"

#include <fmt/format.h>

#include <set>

#include "fp4serve/error.h"

namespace fp4serve::model {

FlatBatch flatten_batch(std::span<const SequenceChunk> batch, KvCache& cache, int64_t vocab) {
  FlatBatch flat;
  std::set<int> slots;
  const int64_t max_seq_len = cache.max_seq_len(), bs = cache.block_size(), layers = cache.layers_per_block();
  for (const SequenceChunk& chunk : batch) {
    const auto t = static_cast<int64_t>(chunk.tokens.size());
    if (t == 0) throw UsageError("Decoder::forward: empty chunk");
    if (chunk.start_pos < 0 || chunk.start_pos + t > max_seq_len) {
      throw UsageError(fmt::format("Decoder::forward: sequence of {} tokens exceeds the cache length {}",
                                   chunk.start_pos + t, max_seq_len));
    }
    if (chunk.slot < 0 || chunk.slot >= cache.max_slots()) {
      throw UsageError(
          fmt::format("Decoder::forward: slot {} is outside the cache's {} slots", chunk.slot, cache.max_slots()));
    }
    if (!slots.insert(chunk.slot).second) throw UsageError(fmt::format("Decoder::forward: slot {} appears twice", chunk.slot));
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = chunk.tokens[static_cast<size_t>(i)];
      if (id < 0 || id >= vocab) {
        throw UsageError(fmt::format("Decoder::forward: token id {} at position {} is outside the vocabulary [0, {})",
                                     id, chunk.start_pos + i, vocab));
      }
    }
    if (chunk.first_logit_row < 0 || chunk.first_logit_row >= t) {
      throw UsageError(fmt::format("Decoder::forward: first_logit_row {} is outside the chunk's {} tokens",
                                   chunk.first_logit_row, t));
    }
  }
  // Validated: now the blocks (a step that cannot get them fails before any op runs).
  for (const SequenceChunk& chunk : batch) {
    cache.acquire(chunk.slot);  // a caller that never acquired its slot (a single-sequence tool) gets it here
    cache.prepare(chunk.slot, chunk.start_pos, static_cast<int64_t>(chunk.tokens.size()));
  }
  int64_t row0 = 0;
  for (const SequenceChunk& chunk : batch) {
    const auto t = static_cast<int64_t>(chunk.tokens.size());
    for (int64_t i = 0; i < t; ++i) {
      flat.ids.push_back(chunk.tokens[static_cast<size_t>(i)]);
      flat.positions.push_back(chunk.start_pos + i);
      flat.slots.push_back(chunk.slot);
    }
    for (int64_t i = chunk.all_logits ? chunk.first_logit_row : t - 1; i < t; ++i) flat.logit_rows.push_back(row0 + i);
    row0 += t;
  }
  for (int g = 0; g < cache.num_groups(); ++g) {
    for (const SequenceChunk& chunk : batch) {
      const std::span<const int32_t> table = cache.block_table(chunk.slot, g);
      for (int64_t pos = chunk.start_pos; pos < chunk.start_pos + static_cast<int64_t>(chunk.tokens.size()); ++pos) {
        flat.cache_rows.push_back(static_cast<int64_t>(table[static_cast<size_t>(pos / bs)]) * layers * bs + pos % bs);
      }
    }
  }
  flat.decode = !batch.empty() && row0 == static_cast<int64_t>(batch.size());
  return flat;
}

void Backend::decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out) {
  const FlatBatch& s = step();
  const int64_t width = op.num_heads * op.head_dim;
  for (size_t r = 0; r < s.ids.size(); ++r) {
    const auto offset = static_cast<int64_t>(r) * width;
    attention(layer, s.slots[r], q + offset, 1, s.positions[r], op, out + offset);
  }
}

}  // namespace fp4serve::model
