// SPDX-License-Identifier: Apache-2.0
// Causal scaled-dot-product attention of one sequence over its fp32 KV cache, on CPU (cpu/attention.cpp).
#pragma once

#include <cstdint>

namespace fp4serve::kernels {

/// Shapes and options of one attention call.
struct AttentionParams {
  int64_t num_heads;     ///< H query heads
  int64_t num_kv_heads;  ///< KVH; divides H. Query head h reads KV head h / (H / KVH) (GQA; HF repeat_kv order)
  int64_t head_dim;      ///< D
  float scale;           ///< multiplies q·k before the softmax, usually 1/√D
  /// 0 = full causal attention. Otherwise each query attends only to the last W positions including its own:
  /// keys at positions p with q_pos − W < p ≤ q_pos. This is transformers' `sliding_window` mask
  /// (masking_utils sliding_window_overlay, used by Mistral, Qwen2 and GPT-OSS sliding layers) and the mask of
  /// the original GPT-OSS reference (tril with diagonal −W): W keys in all.
  int64_t sliding_window = 0;
  /// nullptr, or [H] GPT-OSS attention sinks: one extra logit per head that joins the softmax max and
  /// denominator but contributes no value (HF GptOss eager_attention_forward).
  const float* sinks = nullptr;
};

/// out[i, h, :] = Σ_p softmax_p(scale · q[i, h, :] · k[p, kvh, :]) · v[p, kvh, :] over the causal (and
/// windowed) positions p ≤ start_pos + i, with fp32 scores and a max-subtracted softmax.
/// q: [t, H, D] f32, row i at position start_pos + i. k_cache, v_cache: cache rows 0 … start_pos + t − 1 must be
/// filled (including this call's own keys/values); row p holds [KVH, D] f32 starting at p · cache_row_stride
/// floats (cache_row_stride ≥ KVH·D). out: [t, H, D] f32, must not alias q or the caches.
/// Work runs in parallel over (query row, KV head) with OpenMP; each item reads each key/value row once for
/// all H/KVH query heads that share it. Throws UsageError on null pointers or inconsistent sizes.
void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionParams& params, float* out);

}  // namespace fp4serve::kernels
