// SPDX-License-Identifier: Apache-2.0
// model::Backend on an NVIDIA GPU (backends/cuda/kernels): weights in the GPU GEMM layouts (linear_cuda.h), norms,
// sinks, the embedding table and the RoPE cos/sin table uploaded once, the KV cache in device memory
// (the block pool as [block][layer][block position][kv_heads · head_dim] fp32, read through each sequence's block
// table, plus one scratch block for the padding rows of graph steps), activations fp32 in device workspaces, one stream. Decode steps of dense models
// run as CUDA graphs per batch-size bucket (run_decode) between one host→device copy of the step's arrays and one
// copy of the logits back, the step's only sync. Compiled only with the CUDA backend (FP4SERVE_HAVE_CUDA);
// backends::make_cuda_backend (registry.h) is the way in. Numerics: fp32 activations and KV cache (the CPU's fp32
// choice); GEMM inputs are rounded to bf16 (the GPU GEMMs take bf16 activations) and dense fp32-stored weights run
// as bf16: those are the deliberate differences from CpuBackend. Decode attention splits each row's keys over
// several blocks (flash-decoding), so its fp32 sums run in another order than the CPU's. MoE routing copies the
// router logits [m, E] to the host and routes them with model::route and the host router math it is given (the
// registry gives it the CPU backend's), so the chosen experts are exactly the CPU's for the same logits.
//
// What the GPU does not run throws UnsupportedError at load, naming the op and the module: int4 and FP8 linears
// (no CUDA GEMM), a head_dim above kernels::cuda::kMaxAttentionHeadDim, online transforms with a block above
// 4096.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"

namespace fp4serve::backends::cuda {

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

class CudaBackend final : public Backend {
 public:
  /// Selects GPU `ordinal`; MoE routing runs on the host with `host_router_math` (backends::make_cuda_backend
  /// passes the CPU backend's). Throws UsageError (the no-GPU message) when no usable GPU is found or the router
  /// math is incomplete, DeviceError when a CUDA call fails.
  CudaBackend(int ordinal, model::RouterMath host_router_math);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  bool host_memory() const override { return false; }
  MemoryUse memory_use() const override;
  std::string name() const override;

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

  /// A capturable decode step (FlatBatch::capturable) runs on the smallest graph bucket ≥ its rows
  /// (kernels::cuda::default_graph_buckets: 1, 2, 4, … 256), the padding rows on the cache's scratch slot.
  int64_t step_rows() const override;
  /// kernels::cuda::attention_decode over the step's rows, split over the cache length (plan_kv_splits).
  void decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out) override;
  /// A capturable decode step runs as a CUDA graph of its bucket (kernels::cuda::StepGraphs): the first step of a
  /// bucket runs `work` and captures it, later ones replay it after begin_step's one copy of the step arrays
  /// (step_arrays.h). Graphs are dropped when the cache, the host thread or any buffer they read changes
  /// (a workspace or scratch that grows, e.g. for a longer prefill); they are captured again on the next step.
  /// Non-capturable steps, batches above 256 rows and buckets whose capture failed run `work` directly.
  void run_decode(const std::function<void()>& work) override;

  /// How decode steps ran since construction.
  struct GraphStats {
    int64_t captures = 0;  ///< steps that ran eagerly and captured their bucket
    int64_t replays = 0;   ///< steps that were one graph launch
    int64_t eager = 0;     ///< decode steps without a graph (not capturable, too large, disabled, capture failed)
    int64_t resets = 0;    ///< times graphs were dropped because something they read moved
    int64_t graphs = 0;    ///< graphs held now
    std::string capture_error;  ///< why the last failed capture failed, or empty
  };
  GraphStats graph_stats() const;
  /// Turns graph capture on or off (off drops the graphs). The initial state is on unless the environment has
  /// FP4SERVE_CUDA_GRAPHS=0 (for A/B measurements and debugging).
  void set_graphs(bool enabled);

  /// Device bytes of the uploaded linear weights (GPU layout) and the embedding table.
  int64_t weight_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  model::RouterMath router_math_;
};

}  // namespace fp4serve::backends::cuda
