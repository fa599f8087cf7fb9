// SPDX-License-Identifier: Apache-2.0
// model::Backend on the CPU kernels of backends/cpu/kernels (Highway AVX-512 / AVX2 / scalar, OpenMP):
// activations, KV cache (cpu_kv_storage.h) and weights in host memory; each op is the kernel call model::Decoder
// made before the backend existed, in the same order with the same arguments, so the numbers do not depend on the
// refactoring. The embedding stays a zero-copy view of the mapped checkpoint. Made by backends::make_cpu_backend
// (registry.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backends/cpu/cpu_kv_storage.h"
#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/kernels/attention.h"
#include "model/backend.h"
#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::backends::cpu {

using model::AttentionOp;
using model::Backend;
using model::BackendEmbedding;
using model::BackendLinear;
using model::BackendRope;
using model::BackendTransform;
using model::BackendVector;
using model::ExpertActivation;
using model::FlatBatch;
using model::KvCache;
using model::KvCacheSpec;
using model::LinearGroup;
using model::OnlineTransform;
using model::RopeCache;
using model::RouterSettings;

/// Whether a CpuBackend running `precision` lets a prefill's attention take bf16 dot products
/// (kernels::AttentionParams::bf16_dot_products; the kernel decides where they run): under the precisions whose
/// linears round x to bf16 as well, Bf16 and Bf16DecodeInt8.
bool bf16_attention_products(prepare::ActivationPrecision precision);

class CpuBackend final : public Backend {
 public:
  /// Its KV caches store `kv_cache_dtype` elements (--kv-cache-dtype; kv_element_of); its FP4 layers without an
  /// activation emulation multiply with `activation_precision` (--activation-precision), its int4 layers with
  /// `int4_activation_precision` (absent: `activation_precision`).
  /// With a `weight_cache`, uploaded linears are taken from it where it holds them and stored in it otherwise
  /// (prepare/weight_cache.h); the caller finishes it once the model is built.
  explicit CpuBackend(model::KvCacheDtype kv_cache_dtype = model::KvCacheDtype::F32,
                      prepare::ActivationPrecision activation_precision = prepare::ActivationPrecision::Fp32,
                      std::shared_ptr<prepare::WeightCache> weight_cache = nullptr,
                      std::optional<prepare::ActivationPrecision> int4_activation_precision = std::nullopt)
      : kv_dtype_(kv_cache_dtype),
        activation_precision_(activation_precision),
        int4_activation_precision_(int4_activation_precision.value_or(activation_precision)),
        weight_cache_(std::move(weight_cache)) {}
  bool host_memory() const override { return true; }
  MemoryUse memory_use() const override;
  std::string name() const override { return "cpu"; }

  std::unique_ptr<BackendLinear> upload_linear(LinearGroup group) override;
  std::unique_ptr<BackendVector> upload_vector(std::vector<float> values) override;
  std::unique_ptr<BackendEmbedding> upload_embedding(const core::TensorView& table, const std::string& name) override;
  std::unique_ptr<BackendTransform> upload_transform(std::shared_ptr<const OnlineTransform> transform,
                                                     const std::string& where) override;
  std::unique_ptr<BackendRope> upload_rope(RopeCache rope) override;
  void check_attention(const AttentionOp& op, const std::string& layer) const override;
  KvCache make_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                     const KvCacheSpec& spec) const override;

  void begin_step(const FlatBatch& flat, KvCache& cache) override;
  void end_step() override;
  float* workspace(int slot, int64_t floats) override;

  void embed(const BackendEmbedding& table, float scale, float* out) override;
  void rms_norm(const float* x, const BackendVector& weight, int64_t rows, int64_t dim, float eps, float* out) override;
  void linear(const BackendLinear& w, const float* x, int64_t m, float* y) override;
  void copy_columns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                    int64_t width) override;
  void rope(const BackendRope& rope, float* x, int64_t heads, int64_t head_dim) override;
  void transform(const BackendTransform& t, float* x, int64_t rows, int64_t dim) override;
  void write_kv(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) override;
  void attention(int64_t layer, int slot, const float* q, int64_t t, int64_t start_pos, const AttentionOp& op,
                 float* out) override;
  /// All rows of the decode step in one kernels::decode_attention call (one parallel region per layer).
  void decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out) override;
  void activation(ExpertActivation kind, float alpha, float limit, const float* x, int64_t m, int64_t inter,
                  float* y) override;
  void add_scaled(float* x, const float* delta, float alpha, int64_t n) override;
  void fill(float* x, int64_t n, float value) override;
  void route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights) override;
  void gather_rows(const float* src, int64_t width, std::span<const int64_t> rows, float* dst) override;
  void scatter_add_rows(const float* y, int64_t width, std::span<const int64_t> rows, std::span<const float> weights,
                        float* out) override;
  void add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out) override;
  void all_reduce_sum(dist::Communicator& comm, float* x, int64_t n) override;
  void to_host(const float* x, int64_t n, float* host) override;
  const float* host_view(const float* x, int64_t n, std::vector<float>& copy) override;
  const FlatBatch& step() const override;

 private:
  // `layer`'s keys and values of `slot` as the attention kernels read them: its group's table, its row in the blocks.
  kernels::KvRows layer_rows(int slot, int64_t layer) const;
  std::vector<std::vector<float>> workspace_;
  std::vector<float> linear_scratch_;  // linear_forward's part buffer
  std::vector<kernels::DecodeQuery> decode_rows_;  // decode_attention's rows, kept to reuse the allocation
  const FlatBatch* step_ = nullptr;
  KvCache* cache_ = nullptr;
  CpuKvStorage* kv_ = nullptr;  // cache_'s storage during a step
  model::KvCacheDtype kv_dtype_;
  prepare::ActivationPrecision activation_precision_;
  prepare::ActivationPrecision int4_activation_precision_;
  prepare::HugePageArena weights_arena_;  // every uploaded linear's weights (but those mapped from weight_cache_)
  std::shared_ptr<prepare::WeightCache> weight_cache_;
  CpuTransforms transforms_;              // the CPU form of each online transform, made once
};

/// The router math the CPU backend routes with (kernels::softmax_rows, kernels::top_k); the registry gives the CUDA
/// backend the same for its host copy of the logits, so both choose the same experts.
model::RouterMath router_math();

}  // namespace fp4serve::backends::cpu
