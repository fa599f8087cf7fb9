// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_linear.h"
#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/attention.h"
#include "backends/cpu/kernels/embedding.h"
#include "backends/cpu/kernels/norm.h"
#include "backends/cpu/kernels/rope.h"
#include "backends/cpu/kernels/softmax.h"
#include "core/memory_stats.h"
#include "fp4serve/error.h"

namespace fp4serve::backends::cpu {
namespace {

struct CpuLinear final : BackendLinear {
  CpuLinearGroup group;
};
struct CpuVector final : BackendVector {
  std::vector<float> values;
};
struct CpuEmbedding final : BackendEmbedding {
  core::TensorView table;
};
struct CpuTransformHandle final : BackendTransform {
  std::shared_ptr<const CpuTransform> transform;
};
struct CpuRope final : BackendRope {
  explicit CpuRope(RopeCache c)
      : cache(std::move(c)), table{cache.cos(0), cache.sin(0), cache.rotary_dim(), cache.max_positions()} {}
  RopeCache cache;
  kernels::RopeTable table;  // cache's rows
};

template <class T, class B>
const T& as(const B& handle, const char* what) {
  const auto* p = dynamic_cast<const T*>(&handle);
  if (p == nullptr) throw UsageError(fmt::format("cpu backend: {} was uploaded by another backend", what));
  return *p;
}

}  // namespace

Backend::MemoryUse CpuBackend::memory_use() const {
  return {core::system_memory().total, core::process_memory().rss};
}

model::RouterMath router_math() { return model::RouterMath{kernels::softmax_rows, kernels::top_k}; }

std::unique_ptr<BackendLinear> CpuBackend::upload_linear(LinearGroup group) {
  auto w = std::make_unique<CpuLinear>();
  w->modules = group.modules();
  w->in_features = group.in_features();
  w->out_features = group.out_features();
  // The CPU's repack of the checkpoint-order weights; the bytes every decode step streams go on huge pages.
  w->group = prepare_linear_group(std::move(group), transforms_, activation_precision_, &weights_arena_,
                                  weight_cache_.get(), int4_activation_precision_);
  return w;
}

std::unique_ptr<BackendVector> CpuBackend::upload_vector(std::vector<float> values) {
  auto v = std::make_unique<CpuVector>();
  v->size = static_cast<int64_t>(values.size());
  v->values = std::move(values);
  return v;
}

std::unique_ptr<BackendEmbedding> CpuBackend::upload_embedding(const core::TensorView& table, const std::string& name) {
  if (table.shape.size() != 2) {
    throw FormatError(fmt::format("{}: shape {} where [vocab, hidden] was expected", name, core::shape_to_string(table.shape)));
  }
  auto e = std::make_unique<CpuEmbedding>();
  e->table = table;
  e->vocab = table.shape[0];
  e->dim = table.shape[1];
  return e;
}

std::unique_ptr<BackendTransform> CpuBackend::upload_transform(std::shared_ptr<const OnlineTransform> transform,
                                                               const std::string& where) {
  if (!transform) throw UsageError(fmt::format("{}: null online transform", where));
  auto t = std::make_unique<CpuTransformHandle>();
  t->block = transform->block();
  t->transform = transforms_.get(transform);
  return t;
}

std::unique_ptr<BackendRope> CpuBackend::upload_rope(RopeCache rope) {
  auto r = std::make_unique<CpuRope>(std::move(rope));
  r->max_positions = r->cache.max_positions();
  return r;
}

void CpuBackend::check_attention(const AttentionOp& /*op*/, const std::string& /*layer*/) const {}

KvCache CpuBackend::make_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                               const KvCacheSpec& spec) const {
  return make_host_kv_cache(num_layers, num_kv_heads, head_dim, spec, kv_dtype_);
}

void CpuBackend::begin_step(const FlatBatch& flat, KvCache& cache) {
  kv_ = dynamic_cast<CpuKvStorage*>(cache.storage());
  if (kv_ == nullptr) {
    throw UsageError("KvCache: this cache's keys and values live in a backend's memory (a GPU cache); the CPU "
                     "backend cannot use it");
  }
  step_ = &flat;
  cache_ = &cache;
}

void CpuBackend::end_step() {
  step_ = nullptr;
  cache_ = nullptr;
  kv_ = nullptr;
}

const FlatBatch& CpuBackend::step() const {
  if (step_ == nullptr) throw UsageError("cpu backend: an op ran outside begin_step … end_step");
  return *step_;
}

float* CpuBackend::workspace(int slot, int64_t floats) {
  if (slot < 0) throw UsageError(fmt::format("cpu backend: workspace slot {}", slot));
  if (static_cast<size_t>(slot) >= workspace_.size()) workspace_.resize(static_cast<size_t>(slot) + 1);
  std::vector<float>& w = workspace_[static_cast<size_t>(slot)];
  if (static_cast<int64_t>(w.size()) < floats) w.resize(static_cast<size_t>(floats));
  return w.data();
}

void CpuBackend::embed(const BackendEmbedding& table, float scale, float* out) {
  const FlatBatch& s = step();
  const auto& e = as<CpuEmbedding>(table, "an embedding");
  const auto total = static_cast<int64_t>(s.ids.size());
  kernels::embedding_gather(e.table, s.ids.data(), total, out);
  if (scale != 1.0f) {
    const int64_t n = total * e.dim;
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
  }
}

void CpuBackend::rms_norm(const float* x, const BackendVector& weight, int64_t rows, int64_t dim, float eps, float* out) {
  kernels::rms_norm(x, as<CpuVector>(weight, "a vector").values.data(), rows, dim, eps, out);
}

void CpuBackend::linear(const BackendLinear& w, const float* x, int64_t m, float* y) {
  linear_forward(as<CpuLinear>(w, "a linear").group, x, m, y, linear_scratch_);
}

void CpuBackend::copy_columns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                              int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(width) * sizeof(float));
  }
}

void CpuBackend::rope(const BackendRope& rope, float* x, int64_t heads, int64_t head_dim) {
  const FlatBatch& s = step();
  kernels::apply_rope(x, static_cast<int64_t>(s.positions.size()), heads, head_dim, s.positions.data(),
                      as<CpuRope>(rope, "a RoPE table").table, kernels::RopeLayout::NeoX);
}

void CpuBackend::transform(const BackendTransform& t, float* x, int64_t rows, int64_t dim) {
  apply_transform(*as<CpuTransformHandle>(t, "a transform").transform, x, rows, dim);
}

kernels::KvRows CpuBackend::layer_rows(int slot, int64_t layer) const {
  return kv_->rows(cache_->block_table(slot, cache_->group_of_layer(layer)), cache_->row_of_layer(layer));
}

void CpuBackend::write_kv(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) {
  const FlatBatch& s = step();
  const int64_t d = cache_->head_dim();
  // cache_rows[g · rows + r] = block · layers_per_block · block_size + row in the block (FlatBatch).
  const int64_t bs = cache_->block_size(), per_block = cache_->layers_per_block() * bs;
  const int64_t rows = static_cast<int64_t>(s.positions.size()), layer_row = cache_->row_of_layer(layer);
  const int64_t* cache_rows = s.cache_rows.data() + cache_->group_of_layer(layer) * rows;
  for (int64_t i = 0; i < rows; ++i) {
    const auto block = static_cast<int32_t>(cache_rows[i] / per_block);
    const int64_t row = cache_rows[i] % bs;
    for (int64_t h = 0; h < cache_->num_kv_heads(); ++h) {
      kernels::write_kv_row(k + i * k_stride + h * d, d, kv_->element(), kv_->key_data(block, layer_row, h, row));
      kernels::write_kv_row(v + i * v_stride + h * d, d, kv_->element(), kv_->value_data(block, layer_row, h, row));
    }
  }
}

bool bf16_attention_products(prepare::ActivationPrecision precision) {
  switch (precision) {
    case prepare::ActivationPrecision::Bf16:
    case prepare::ActivationPrecision::Bf16DecodeInt8: return true;
    case prepare::ActivationPrecision::Fp32:
    case prepare::ActivationPrecision::Int8:
    case prepare::ActivationPrecision::Int8Decode: return false;
  }
  return false;
}

void CpuBackend::attention(int64_t layer, int slot, const float* q, int64_t t, int64_t start_pos, const AttentionOp& op,
                           float* out) {
  (void)step();
  kernels::AttentionParams params{op.num_heads, op.num_kv_heads, op.head_dim, op.scale, op.sliding_window,
                                  op.sinks == nullptr ? nullptr : as<CpuVector>(*op.sinks, "sinks").values.data()};
  // A prefill's products on bf16 dot products where the linears round x to bf16 as well (attention.h).
  params.bf16_dot_products = bf16_attention_products(activation_precision_);
  kernels::attention(q, t, start_pos, layer_rows(slot, layer), params, out);
}

void CpuBackend::decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out) {
  const FlatBatch& s = step();
  const kernels::AttentionParams params{op.num_heads, op.num_kv_heads, op.head_dim, op.scale, op.sliding_window,
                                        op.sinks == nullptr ? nullptr : as<CpuVector>(*op.sinks, "sinks").values.data()};
  const int64_t width = op.num_heads * op.head_dim;
  decode_rows_.clear();
  for (size_t r = 0; r < s.ids.size(); ++r) {
    const auto offset = static_cast<int64_t>(r) * width;
    decode_rows_.push_back({q + offset, s.positions[r], layer_rows(s.slots[r], layer), out + offset});
  }
  kernels::decode_attention(decode_rows_, params);
}

void CpuBackend::activation(ExpertActivation kind, float alpha, float limit, const float* x, int64_t m, int64_t inter,
                            float* y) {
  switch (kind) {
    case ExpertActivation::SiluGated: kernels::silu_and_mul(x, m, inter, y); return;
    case ExpertActivation::SwigluOai: kernels::swiglu_oai_and_mul(x, m, inter, alpha, limit, y); return;
  }
}

void CpuBackend::add_scaled(float* x, const float* delta, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += alpha * delta[i];
}

void CpuBackend::fill(float* x, int64_t n, float value) { std::fill(x, x + n, value); }

void CpuBackend::route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights) {
  model::route(settings, logits, m, experts, weights, router_math());
}

void CpuBackend::gather_rows(const float* src, int64_t width, std::span<const int64_t> rows, float* dst) {
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(src + rows[r] * width, src + (rows[r] + 1) * width, dst + static_cast<int64_t>(r) * width);
  }
}

void CpuBackend::scatter_add_rows(const float* y, int64_t width, std::span<const int64_t> rows,
                                  std::span<const float> weights, float* out) {
  for (size_t r = 0; r < rows.size(); ++r) {
    float* o = out + rows[r] * width;
    const float wt = weights[r];
    const float* yr = y + static_cast<int64_t>(r) * width;
    for (int64_t c = 0; c < width; ++c) o[c] += yr[c] * wt;
  }
}

void CpuBackend::add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out) {
  for (int64_t t = 0; t < m; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-gate[t]));
    for (int64_t c = 0; c < width; ++c) out[t * width + c] += g * y[t * width + c];
  }
}

void CpuBackend::all_reduce_sum(dist::Communicator& comm, float* x, int64_t n) {
  if (n <= 0) return;
  if (comm.device_memory()) {
    throw UsageError(fmt::format("all_reduce_sum: the {} communicator reduces device memory; the CPU backend's "
                                 "activations are host memory (use an MPI communicator with --device cpu)",
                                 comm.name()));
  }
  comm.all_reduce_sum(x, static_cast<size_t>(n));
}

void CpuBackend::to_host(const float* x, int64_t n, float* host) {
  if (n > 0 && host != x) std::memcpy(host, x, static_cast<size_t>(n) * sizeof(float));
}

const float* CpuBackend::host_view(const float* x, int64_t /*n*/, std::vector<float>& /*copy*/) { return x; }

}  // namespace fp4serve::backends::cpu
