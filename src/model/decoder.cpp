// SPDX-License-Identifier: Apache-2.0
#include "model/decoder.h"

#include <fmt/format.h>

#include <algorithm>

#include "checkpoint/architecture.h"
#include "fp4serve/error.h"
#include "model/moe.h"
#include "quant/dequant.h"

namespace fp4serve::model {
namespace {

using checkpoint::ModuleRole;
using checkpoint::TensorRole;

// Workspace slots of the decoder step (moe.cpp uses kMoeWorkspace and up).
enum Slot : int { kX, kH, kQkv, kQ, kK, kAttn, kDelta, kGateUp, kAct, kSelected, kLogits };

// SwiGLU MLP: down(silu(gate(h)) * up(h)); gate and up run as one group whose halves feed the activation.
class DenseMlp final : public FeedForward {
 public:
  DenseMlp(Backend& backend, std::unique_ptr<BackendLinear> gate_up, std::unique_ptr<BackendLinear> down)
      : backend_(backend), gate_up_(std::move(gate_up)), down_(std::move(down)) {}

  void forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const override {
    const int64_t inter = gate_up_->out_features / 2;
    float* gate_up = backend_.workspace(kGateUp, m * 2 * inter);
    float* act = backend_.workspace(kAct, m * inter);
    observe(observer, backend_, *gate_up_, h, m);
    backend_.linear(*gate_up_, h, m, gate_up);
    backend_.activation(ExpertActivation::SiluGated, 0.0f, 0.0f, gate_up, m, inter, act);
    observe(observer, backend_, *down_, act, m);
    backend_.linear(*down_, act, m, out);
  }

 private:
  Backend& backend_;
  std::unique_ptr<BackendLinear> gate_up_;
  std::unique_ptr<BackendLinear> down_;
};

}  // namespace

void observe(ActivationObserver* observer, Backend& backend, const BackendLinear& w, const float* x, int64_t m) {
  if (observer == nullptr) return;
  std::vector<float> copy;
  observer->observe(w.modules, backend.host_view(x, m * w.in_features, copy), m, w.in_features);
}

std::vector<float> load_vector(const WeightSource& weights, const std::string& name, int64_t n) {
  const core::TensorView t = weights.tensor(name);
  if (t.shape != std::vector<int64_t>{n}) {
    throw FormatError(fmt::format("{}: shape {} where [{}] was expected", name, core::shape_to_string(t.shape), n));
  }
  std::vector<float> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = quant::load_float(t, i, name);
  return out;
}

Decoder::~Decoder() = default;

Decoder::Decoder(ModelConfig config, const WeightSource& weights, std::unique_ptr<Backend> backend)
    : Decoder(std::move(config), weights, std::move(backend), nullptr) {}

Decoder::Decoder(ModelConfig config, const WeightSource& weights, std::unique_ptr<Backend> backend,
                 dist::Communicator* comm)
    : config_(std::move(config)), backend_(std::move(backend)), comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr) {
  if (!backend_) throw UsageError("Decoder: no backend");
  const ModelConfig& c = config_;
  const std::optional<AttentionHeads> shard = weights.attention_heads();
  num_heads_ = shard ? shard->q_count : c.num_heads;
  num_kv_heads_ = shard ? shard->kv_count : c.num_kv_heads;
  if (shard.has_value() != (comm_ != nullptr)) {
    throw UsageError(fmt::format("Decoder: a {} weight source needs {} (communicator size {})",
                                 shard ? "sharded" : "whole", shard ? "a communicator of size > 1" : "no communicator",
                                 comm ? comm->size() : 1));
  }
  Backend& b = *backend_;
  const checkpoint::ArchitectureSpec& spec = checkpoint::architecture_spec(c.architecture_name);
  const auto vector = [&](TensorRole role, int64_t layer, int64_t n) {
    return b.upload_vector(load_vector(weights, checkpoint::tensor_name(spec, role, layer), n));
  };
  const auto group = [&](std::initializer_list<ModuleRole> roles, int64_t layer) {
    std::vector<std::string> names;
    for (ModuleRole r : roles) names.push_back(checkpoint::module_name(spec, r, layer));
    return weights.linear_group(names);
  };

  const std::string embed_name = checkpoint::tensor_name(spec, TensorRole::Embedding, -1);
  const core::TensorView embed = weights.tensor(embed_name);
  if (embed.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
    throw FormatError(fmt::format("{}: shape {} where [{}, {}] (vocab_size, hidden_size) was expected", embed_name,
                                  core::shape_to_string(embed.shape), c.vocab_size, c.hidden_size));
  }
  embed_tokens_ = b.upload_embedding(embed, embed_name);
  layers_.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = checkpoint::layer_name(spec, l);
    Layer layer;
    layer.input_norm = vector(TensorRole::InputNorm, l, c.hidden_size);
    layer.post_attention_norm = vector(TensorRole::PostAttentionNorm, l, c.hidden_size);
    if (c.qk_norm) {
      layer.q_norm = vector(TensorRole::QNorm, l, c.head_dim);
      layer.k_norm = vector(TensorRole::KNorm, l, c.head_dim);
    }
    if (c.attention_sinks) {
      std::vector<float> sinks = load_vector(weights, checkpoint::tensor_name(spec, TensorRole::Sinks, l), c.num_heads);
      if (shard) {
        const auto first = sinks.begin() + shard->q_begin;
        sinks = std::vector<float>(first, first + shard->q_count);
      }
      layer.sinks = b.upload_vector(std::move(sinks));
    }
    layer.sliding_window = c.sliding_window_of(l);
    const std::string attn = checkpoint::attention_module(spec, l);
    b.check_attention({num_heads_, num_kv_heads_, c.head_dim, c.attention_scale, layer.sliding_window,
                       layer.sinks.get()},
                      attn);
    LinearGroup qkv = group({ModuleRole::QProj, ModuleRole::KProj, ModuleRole::VProj}, l);
    const AttentionTransforms transforms = weights.attention_transforms(l);
    for (const auto* list : {&transforms.query, &transforms.key}) {
      for (const auto& t : *list) {
        if (!t || c.head_dim % t->block() != 0) {
          throw FormatError(fmt::format("{}: an online {} transform of block {} does not divide head_dim {}", attn,
                                        list == &transforms.query ? "q_attn" : "k_cache", t ? t->block() : 0,
                                        c.head_dim));
        }
        auto& out = list == &transforms.query ? layer.query_transforms : layer.key_transforms;
        out.push_back(b.upload_transform(t, attn));
      }
    }
    const int64_t qkv_out = (num_heads_ + 2 * num_kv_heads_) * c.head_dim;
    if (qkv.out_features() != qkv_out || qkv.in_features() != c.hidden_size) {
      throw FormatError(fmt::format("{} q/k/v: [{}, {}] in total where [{}, {}] was expected from config.json", attn,
                                    qkv.out_features(), qkv.in_features(), qkv_out, c.hidden_size));
    }
    layer.qkv = b.upload_linear(std::move(qkv));
    layer.o_proj = b.upload_linear(group({ModuleRole::OProj}, l));
    if (c.is_moe_layer(l)) {
      layer.ffn = make_moe_block(c, weights, l, &b);
      layers_.push_back(std::move(layer));
      weights.release_read();  // the layer is in the backend's layout now: its checkpoint pages may go
      continue;
    }
    LinearGroup gate_up = group({ModuleRole::GateProj, ModuleRole::UpProj}, l);
    LinearGroup down = group({ModuleRole::DownProj}, l);
    const int64_t inter = shard ? down.in_features() : c.intermediate_size;  // a shard holds a slice of I
    if (gate_up.out_features() != 2 * inter || down.out_features() != c.hidden_size) {
      throw FormatError(fmt::format("{}.mlp: gate|up has {} outputs and down {}; config.json expects {} and {}", p,
                                    gate_up.out_features(), down.out_features(), 2 * inter,
                                    c.hidden_size));
    }
    layer.ffn = std::make_unique<DenseMlp>(b, b.upload_linear(std::move(gate_up)), b.upload_linear(std::move(down)));
    layers_.push_back(std::move(layer));
    weights.release_read();
  }
  final_norm_ = vector(TensorRole::FinalNorm, -1, c.hidden_size);
  // The plan resolves lm_head: its own (possibly quantized) weight, or the embedding when tied.
  LinearGroup lm_head = group({ModuleRole::LmHead}, -1);
  for (LinearPart& part : lm_head.parts()) part.lm_head = true;
  if (lm_head.out_features() != c.vocab_size || lm_head.in_features() != c.hidden_size) {
    throw FormatError(fmt::format("lm_head: [{}, {}] where [{}, {}] (vocab_size, hidden_size) was expected",
                                  lm_head.out_features(), lm_head.in_features(), c.vocab_size, c.hidden_size));
  }
  lm_head_ = b.upload_linear(std::move(lm_head));
  // Also the embedding's pages: a backend that gathers from the mapping in place faults in the rows it reads.
  weights.release_read();
  // MoE blocks route on the host (Backend::route copies the router logits back), so their decode steps cannot
  // be captured; dense models run every op on the backend.
  // Tensor parallelism: the all-reduces wait on the stream and call the communicator, outside any graph.
  capturable_ = comm_ == nullptr;
  for (int64_t l = 0; l < c.num_layers; ++l) capturable_ = capturable_ && !c.is_moe_layer(l);
  rope_ = b.upload_rope(RopeCache(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings));
}

KvCache Decoder::make_cache(const KvCacheSpec& spec) const {
  KvCacheSpec s = spec;
  // Each layer's window: layers of different windows get blocks of their own (KvGroupLayout), so a sliding layer's
  // blocks return to the pool as its window passes them, beside full-attention layers that keep theirs.
  s.layer_windows = config_.layer_windows();  // each Layer's sliding_window
  s.sliding_window = 0;
  return backend_->make_cache(config_.num_layers, num_kv_heads_, config_.head_dim, s);
}

std::vector<float> Decoder::forward(std::span<const SequenceChunk> batch, KvCache& cache) const {
  const ModelConfig& c = config_;
  Backend& b = *backend_;
  const int64_t hidden = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_width = num_heads_ * hd;
  const int64_t kv_width = num_kv_heads_ * hd;
  const int64_t qkv_width = q_width + 2 * kv_width;
  const int64_t vocab = lm_head_->out_features;

  FlatBatch flat = flatten_batch(batch, cache, c.vocab_size);
  flat.capturable = flat.decode && capturable_ && observer_ == nullptr;
  const auto logit_rows = static_cast<int64_t>(flat.logit_rows.size());
  b.begin_step(flat, cache);
  struct EndStep {  // the step's references to `flat` and `cache` end with this call, also when an op throws
    Backend& b;
    ~EndStep() { b.end_step(); }
  } end_step{b};
  // A decode step may be padded past the batch's rows (step_rows); every op below runs on `rows` rows.
  const int64_t rows = b.step_rows();

  // Sized once per step for the whole step, so that no buffer is reallocated while queued work may read it.
  float* x = b.workspace(kX, rows * hidden);
  float* h = b.workspace(kH, rows * hidden);
  float* qkv = b.workspace(kQkv, rows * qkv_width);
  float* q = b.workspace(kQ, rows * q_width);
  float* k = b.workspace(kK, rows * kv_width);
  float* attn = b.workspace(kAttn, rows * q_width);
  float* delta = b.workspace(kDelta, rows * hidden);

  const auto layers = [&] {
    b.embed(*embed_tokens_, c.embedding_multiplier, x);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const Layer& layer = layers_[static_cast<size_t>(l)];
      const AttentionOp attention{num_heads_, num_kv_heads_, hd, c.attention_scale, layer.sliding_window,
                                  layer.sinks.get()};
      b.rms_norm(x, *layer.input_norm, rows, hidden, c.rms_norm_eps, h);
      observe(observer_, b, *layer.qkv, h, rows);
      b.linear(*layer.qkv, h, rows, qkv);
      b.copy_columns(qkv, qkv_width, q, q_width, rows, q_width);
      b.copy_columns(qkv + q_width, qkv_width, k, kv_width, rows, kv_width);
      if (c.qk_norm) {
        b.rms_norm(q, *layer.q_norm, rows * num_heads_, hd, c.rms_norm_eps, q);
        b.rms_norm(k, *layer.k_norm, rows * num_kv_heads_, hd, c.rms_norm_eps, k);
      }
      b.rope(*rope_, q, num_heads_, hd);
      b.rope(*rope_, k, num_kv_heads_, hd);
      // compressed-tensors' query / key hooks see the post-RoPE (and post-q/k-norm) states; the keys are rotated
      // before the cache write below, so the cache holds rotated keys. head_dim blocks never straddle two heads.
      for (const auto& t : layer.query_transforms) b.transform(*t, q, rows, q_width);
      for (const auto& t : layer.key_transforms) b.transform(*t, k, rows, kv_width);

      b.write_kv(l, k, kv_width, qkv + q_width + kv_width, qkv_width);
      if (flat.decode) {
        b.decode_attention(l, q, attention, attn);
      } else {
        int64_t row0 = 0;
        for (const SequenceChunk& chunk : batch) {
          const auto t = static_cast<int64_t>(chunk.tokens.size());
          b.attention(l, chunk.slot, q + row0 * q_width, t, chunk.start_pos, attention, attn + row0 * q_width);
          row0 += t;
        }
      }
      observe(observer_, b, *layer.o_proj, attn, rows);
      b.linear(*layer.o_proj, attn, rows, delta);
      if (comm_ != nullptr) b.all_reduce_sum(*comm_, delta, rows * hidden);  // row-parallel partial sums
      b.add_scaled(x, delta, c.residual_multiplier, rows * hidden);

      b.rms_norm(x, *layer.post_attention_norm, rows, hidden, c.rms_norm_eps, h);
      layer.ffn->forward(h, rows, delta, observer_);
      if (comm_ != nullptr) b.all_reduce_sum(*comm_, delta, rows * hidden);
      b.add_scaled(x, delta, c.residual_multiplier, rows * hidden);
    }
  };

  std::vector<float> logits(static_cast<size_t>(logit_rows * vocab));
  if (flat.decode) {
    // Every row wants its logits (logit_rows = 0 … n − 1): final norm and lm_head on all step rows, inside the
    // work a backend may capture; only the batch's rows are copied back.
    float* out = b.host_memory() ? logits.data() : b.workspace(kLogits, rows * vocab);
    float* normed = b.workspace(kSelected, rows * hidden);
    b.run_decode([&] {
      layers();
      b.rms_norm(x, *final_norm_, rows, hidden, c.rms_norm_eps, normed);
      b.linear(*lm_head_, normed, rows, out);
    });
    if (!b.host_memory()) b.to_host(out, static_cast<int64_t>(logits.size()), logits.data());
  } else {
    layers();
    // Final norm and lm_head only on the rows whose logits are wanted.
    float* selected = b.workspace(kSelected, logit_rows * hidden);
    b.gather_rows(x, hidden, flat.logit_rows, selected);
    b.rms_norm(selected, *final_norm_, logit_rows, hidden, c.rms_norm_eps, selected);
    if (b.host_memory()) {
      b.linear(*lm_head_, selected, logit_rows, logits.data());
    } else {
      float* logits_dev = b.workspace(kLogits, logit_rows * vocab);
      b.linear(*lm_head_, selected, logit_rows, logits_dev);
      b.to_host(logits_dev, static_cast<int64_t>(logits.size()), logits.data());
    }
  }
  if (c.logits_scaling != 1.0f) {
    for (float& v : logits) v /= c.logits_scaling;
  }
  // The step's keys and values are written (a failed step records nothing): register its full blocks.
  for (const SequenceChunk& chunk : batch) cache.commit(chunk.slot, chunk.start_pos, chunk.tokens);
  return logits;
}

}  // namespace fp4serve::model
