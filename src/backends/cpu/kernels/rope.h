// SPDX-License-Identifier: Apache-2.0
// The in-place rotary rotation on the CPU (rope.cpp) with a host cos/sin table: the table itself is device-neutral
// (model/rope_table.h, model::RopeCache, built from config.json as transformers computes it); the CPU backend
// hands its rows here as a RopeTable.
#pragma once

#include <cstdint>

namespace fp4serve::kernels {

/// How the rotated dims of a head are paired.
enum class RopeLayout {
  NeoX,  ///< HF rotate_half (Llama, Qwen, GPT-OSS): dim i pairs with i + rotary_dim/2, frequency i
  GptJ,  ///< interleaved (GPT-J, some DeepSeek/GLM exports): dims 2i and 2i+1 pair, frequency i
};

/// A cos/sin table for positions [0, max_positions): row p of each is the rotary_dim/2 values of frequency i at
/// position p (attention factor applied), at cos + p · rotary_dim/2 (model::RopeCache's rows).
struct RopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rotary_dim = 0;     ///< even, ≥ 2
  int64_t max_positions = 0;  ///< ≥ 1
};

/// Rotates, in place, the first table.rotary_dim dims of each head of each token by its position; the
/// remaining head_dim − rotary_dim dims pass through (partial rotary). NeoX: (x_i, x_{i+r/2}) ←
/// (x_i cos_i − x_{i+r/2} sin_i, x_{i+r/2} cos_i + x_i sin_i); GptJ the same on (x_{2i}, x_{2i+1}).
/// x: [tokens, heads, head_dim] f32; positions: [tokens]. Throws UsageError when rotary_dim > head_dim, a table
/// pointer is null or a position is outside the table (naming the token and position).
void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions,
                const RopeTable& table, RopeLayout layout);

}  // namespace fp4serve::kernels
