// SPDX-License-Identifier: Apache-2.0
// The dense Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Granite) on an NVIDIA GPU: the same layers, plan
// and prepared weights as model::Decoder, every op on the device (kernels/cuda/ops.h for norms, RoPE, attention,
// activations; the FP4 / dense GEMMs of kernels/cuda for the linears), the KV cache in device memory, and only
// the wanted logits copied back to the host, where sampling stays. Compiled only with the CUDA backend
// (FP4SERVE_HAVE_CUDA). Numerics: fp32 activations and KV cache as on the CPU; the GEMM inputs are rounded to
// bf16 (the GPU GEMMs take bf16 activations) and dense fp32-stored weights run as bf16 (linear_cuda.h): those are
// the deliberate differences from model::Decoder. W4A4 emulation (--activation-quant emulate) runs on the GPU
// too (kernels::cuda::linear_w4a4).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/forward_model.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace fp4serve::model {

class CudaDecoder final : public ForwardModel {
 public:
  /// Builds every layer from `weights` and uploads it to GPU `ordinal` (prepared linears, norms, the embedding
  /// table, the RoPE cos/sin table of kernels::RopeCache). Throws UnsupportedError naming the architecture for
  /// MoE models and attention sinks, naming the module for an online transform (input, output, q_attn, k_cache:
  /// QuIP / SpinQuant) or a layout the GPU GEMMs do not run (int4, FP8), and for head_dim > 256; UsageError when
  /// no GPU is present; DeviceError when a CUDA call fails (out of memory); FormatError as model::Decoder does for
  /// mis-shaped tensors. Device memory already taken is released when it throws (RAII buffers).
  CudaDecoder(ModelConfig config, const WeightSource& weights, int ordinal = 0);
  ~CudaDecoder() override;
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  const ModelConfig& config() const override { return config_; }
  /// A cache whose keys and values live on the GPU ([slot][layer][position][kv_heads · head_dim] fp32, allocated
  /// here for all slots at once). Throws DeviceError when it does not fit in device memory.
  KvCache make_cache(int64_t max_seq_len, int max_slots) const override;
  /// The ForwardModel step, on the GPU; returns after the logits are on the host. Not thread-safe (one stream
  /// and one workspace per decoder).
  std::vector<float> forward(std::span<const SequenceChunk> batch, KvCache& cache) const override;

  /// Device bytes of the linear weights (GPU layout) and the embedding table.
  int64_t weight_bytes() const;

 private:
  struct Impl;
  ModelConfig config_;
  std::unique_ptr<Impl> impl_;
};

/// The host-side bookkeeping of one forward step, shared with tests: the batch flattened into token ids,
/// positions, each token's KV-cache row in layer 0 (slot · num_layers · max_seq_len + position; layer l adds
/// l · max_seq_len) and the token rows whose logits are returned, in output order. Throws UsageError (with
/// model::Decoder's messages) for an empty chunk, a chunk beyond the cache length, a slot given twice or outside
/// 0 … max_slots − 1, and a token id outside [0, vocab).
struct FlatBatch {
  std::vector<int32_t> ids;
  std::vector<int64_t> positions;
  std::vector<int64_t> cache_rows;
  std::vector<int64_t> logit_rows;
};
FlatBatch flatten_batch(std::span<const SequenceChunk> batch, int64_t num_layers, int64_t max_seq_len, int max_slots,
                        int64_t vocab);

}  // namespace fp4serve::model
