// SPDX-License-Identifier: Apache-2.0
#include "model/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "fp4serve/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "model/moe.h"
#include "quant/dequant.h"

namespace fp4serve::model {
namespace {

std::string layer_prefix(int64_t layer) { return fmt::format("model.layers.{}", layer); }

// SwiGLU MLP: down(silu(gate(h)) * up(h)); gate and up run as one group whose halves feed silu_and_mul.
class DenseMlp final : public FeedForward {
 public:
  DenseMlp(LinearGroup gate_up, LinearGroup down) : gate_up_(std::move(gate_up)), down_(std::move(down)) {}

  void forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const override {
    const int64_t inter = gate_up_.out_features() / 2;
    std::vector<float> gate_up(static_cast<size_t>(m * 2 * inter));
    std::vector<float> act(static_cast<size_t>(m * inter));
    std::vector<float> scratch;
    if (observer != nullptr) observer->observe(gate_up_.modules(), h, m, gate_up_.in_features());
    gate_up_.forward(h, m, gate_up.data(), scratch);
    kernels::silu_and_mul(gate_up.data(), m, inter, act.data());
    if (observer != nullptr) observer->observe(down_.modules(), act.data(), m, inter);
    down_.forward(act.data(), m, out, scratch);
  }

 private:
  LinearGroup gate_up_;
  LinearGroup down_;
};

}  // namespace

std::vector<float> load_vector(const WeightSource& weights, const std::string& name, int64_t n) {
  const core::TensorView t = weights.tensor(name);
  if (t.shape != std::vector<int64_t>{n}) {
    throw FormatError(fmt::format("{}: shape {} where [{}] was expected", name, core::shape_to_string(t.shape), n));
  }
  std::vector<float> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = quant::load_float(t, i, name);
  return out;
}

Decoder::Decoder(ModelConfig config, const WeightSource& weights)
    : config_(std::move(config)),
      rope_(config_.head_dim, config_.rope_theta, config_.rope_scaling, config_.max_position_embeddings) {
  const ModelConfig& c = config_;
  embed_tokens_ = weights.tensor("model.embed_tokens.weight");
  if (embed_tokens_.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
    throw FormatError(fmt::format("model.embed_tokens.weight: shape {} where [{}, {}] (vocab_size, hidden_size) was expected",
                                  core::shape_to_string(embed_tokens_.shape), c.vocab_size, c.hidden_size));
  }
  layers_.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = layer_prefix(l);
    Layer layer;
    layer.input_norm = load_vector(weights, p + ".input_layernorm.weight", c.hidden_size);
    layer.post_attention_norm = load_vector(weights, p + ".post_attention_layernorm.weight", c.hidden_size);
    if (c.qk_norm) {
      layer.q_norm = load_vector(weights, p + ".self_attn.q_norm.weight", c.head_dim);
      layer.k_norm = load_vector(weights, p + ".self_attn.k_norm.weight", c.head_dim);
    }
    if (c.attention_sinks) layer.sinks = load_vector(weights, p + ".self_attn.sinks", c.num_heads);
    layer.sliding_window = c.sliding_window_of(l);
    layer.qkv = weights.linear_group({p + ".self_attn.q_proj", p + ".self_attn.k_proj", p + ".self_attn.v_proj"});
    layer.o_proj = weights.linear_group({p + ".self_attn.o_proj"});
    layer.transforms = weights.attention_transforms(l);
    for (const auto* list : {&layer.transforms.query, &layer.transforms.key}) {
      for (const auto& t : *list) {
        if (!t || c.head_dim % t->block() != 0) {
          throw FormatError(fmt::format("{}.self_attn: an online {} transform of block {} does not divide head_dim {}", p,
                                        list == &layer.transforms.query ? "q_attn" : "k_cache", t ? t->block() : 0,
                                        c.head_dim));
        }
      }
    }
    const int64_t qkv_out = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    if (layer.qkv.out_features() != qkv_out || layer.qkv.in_features() != c.hidden_size) {
      throw FormatError(fmt::format("{}.self_attn q/k/v: [{}, {}] in total where [{}, {}] was expected from config.json",
                                    p, layer.qkv.out_features(), layer.qkv.in_features(), qkv_out, c.hidden_size));
    }
    if (c.is_moe_layer(l)) {
      layer.ffn = make_moe_block(c, weights, l);
      layers_.push_back(std::move(layer));
      continue;
    }
    LinearGroup gate_up = weights.linear_group({p + ".mlp.gate_proj", p + ".mlp.up_proj"});
    LinearGroup down = weights.linear_group({p + ".mlp.down_proj"});
    if (gate_up.out_features() != 2 * c.intermediate_size || down.out_features() != c.hidden_size) {
      throw FormatError(fmt::format("{}.mlp: gate|up has {} outputs and down {}; config.json expects {} and {}", p,
                                    gate_up.out_features(), down.out_features(), 2 * c.intermediate_size,
                                    c.hidden_size));
    }
    layer.ffn = std::make_unique<DenseMlp>(std::move(gate_up), std::move(down));
    layers_.push_back(std::move(layer));
  }
  final_norm_ = load_vector(weights, "model.norm.weight", c.hidden_size);
  // The plan resolves lm_head: its own (possibly quantized) weight, or the embedding when tied.
  lm_head_ = weights.linear_group({"lm_head"});
  if (lm_head_.out_features() != c.vocab_size || lm_head_.in_features() != c.hidden_size) {
    throw FormatError(fmt::format("lm_head: [{}, {}] where [{}, {}] (vocab_size, hidden_size) was expected",
                                  lm_head_.out_features(), lm_head_.in_features(), c.vocab_size, c.hidden_size));
  }
}

KvCache Decoder::make_cache(int64_t max_seq_len, int max_slots) const {
  return KvCache(config_.num_layers, config_.num_kv_heads, config_.head_dim, max_seq_len, max_slots);
}

std::vector<float> Decoder::forward(std::span<const SequenceChunk> batch, KvCache& cache) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd;
  const int64_t kv_width = c.num_kv_heads * hd;
  const int64_t qkv_width = q_width + 2 * kv_width;

  // Flatten the batch: token ids and positions of every chunk, back to back.
  std::vector<int32_t> ids;
  std::vector<int64_t> positions;
  std::set<int> slots;
  int64_t logit_rows = 0;
  for (const SequenceChunk& chunk : batch) {
    const auto t = static_cast<int64_t>(chunk.tokens.size());
    if (t == 0) throw UsageError("Decoder::forward: empty chunk");
    if (chunk.start_pos + t > cache.max_seq_len()) {
      throw UsageError(fmt::format("Decoder::forward: sequence of {} tokens exceeds the cache length {}",
                                   chunk.start_pos + t, cache.max_seq_len()));
    }
    if (!slots.insert(chunk.slot).second) throw UsageError(fmt::format("Decoder::forward: slot {} appears twice", chunk.slot));
    ids.insert(ids.end(), chunk.tokens.begin(), chunk.tokens.end());
    for (int64_t i = 0; i < t; ++i) positions.push_back(chunk.start_pos + i);
    logit_rows += chunk.all_logits ? t : 1;
  }
  const auto total = static_cast<int64_t>(ids.size());

  std::vector<float> x(static_cast<size_t>(total * hidden));
  std::vector<float> h(x.size());
  std::vector<float> qkv(static_cast<size_t>(total * qkv_width));
  std::vector<float> q(static_cast<size_t>(total * q_width));
  std::vector<float> k(static_cast<size_t>(total * kv_width));
  std::vector<float> attn(static_cast<size_t>(total * q_width));
  std::vector<float> delta(x.size());
  std::vector<float> scratch;

  kernels::embedding_gather(embed_tokens_, ids.data(), total, x.data());
  if (c.embedding_multiplier != 1.0f) {
    for (float& v : x) v *= c.embedding_multiplier;
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& layer = layers_[static_cast<size_t>(l)];
    const kernels::AttentionParams attention_params{c.num_heads, c.num_kv_heads, hd, c.attention_scale,
                                                    layer.sliding_window,
                                                    layer.sinks.empty() ? nullptr : layer.sinks.data()};
    kernels::rms_norm(x.data(), layer.input_norm.data(), total, hidden, c.rms_norm_eps, h.data());
    if (observer_ != nullptr) observer_->observe(layer.qkv.modules(), h.data(), total, hidden);
    layer.qkv.forward(h.data(), total, qkv.data(), scratch);
    for (int64_t r = 0; r < total; ++r) {
      const float* row = qkv.data() + r * qkv_width;
      std::memcpy(q.data() + r * q_width, row, static_cast<size_t>(q_width) * sizeof(float));
      std::memcpy(k.data() + r * kv_width, row + q_width, static_cast<size_t>(kv_width) * sizeof(float));
    }
    if (c.qk_norm) {
      kernels::rms_norm(q.data(), layer.q_norm.data(), total * c.num_heads, hd, c.rms_norm_eps, q.data());
      kernels::rms_norm(k.data(), layer.k_norm.data(), total * c.num_kv_heads, hd, c.rms_norm_eps, k.data());
    }
    kernels::apply_rope(q.data(), total, c.num_heads, hd, positions.data(), rope_, kernels::RopeLayout::NeoX);
    kernels::apply_rope(k.data(), total, c.num_kv_heads, hd, positions.data(), rope_, kernels::RopeLayout::NeoX);
    // compressed-tensors' query / key hooks see the post-RoPE (and post-q/k-norm) states; the keys are rotated
    // before the cache write below, so the cache holds rotated keys. head_dim blocks never straddle two heads.
    for (const auto& t : layer.transforms.query) t->apply(q.data(), total, q_width);
    for (const auto& t : layer.transforms.key) t->apply(k.data(), total, kv_width);

    int64_t row0 = 0;
    for (const SequenceChunk& chunk : batch) {
      const auto t = static_cast<int64_t>(chunk.tokens.size());
      for (int64_t i = 0; i < t; ++i) {
        const int64_t r = row0 + i;
        std::memcpy(cache.key(chunk.slot, l, chunk.start_pos + i), k.data() + r * kv_width,
                    static_cast<size_t>(kv_width) * sizeof(float));
        std::memcpy(cache.value(chunk.slot, l, chunk.start_pos + i), qkv.data() + r * qkv_width + q_width + kv_width,
                    static_cast<size_t>(kv_width) * sizeof(float));
      }
      kernels::attention(q.data() + row0 * q_width, t, chunk.start_pos, cache.key(chunk.slot, l, 0),
                         cache.value(chunk.slot, l, 0), cache.row_stride(), attention_params,
                         attn.data() + row0 * q_width);
      row0 += t;
    }
    if (observer_ != nullptr) observer_->observe(layer.o_proj.modules(), attn.data(), total, q_width);
    layer.o_proj.forward(attn.data(), total, delta.data(), scratch);
    for (size_t i = 0; i < x.size(); ++i) x[i] += c.residual_multiplier * delta[i];

    kernels::rms_norm(x.data(), layer.post_attention_norm.data(), total, hidden, c.rms_norm_eps, h.data());
    layer.ffn->forward(h.data(), total, delta.data(), observer_);
    for (size_t i = 0; i < x.size(); ++i) x[i] += c.residual_multiplier * delta[i];
  }

  // Final norm and lm_head only on the rows whose logits are wanted.
  std::vector<float> selected(static_cast<size_t>(logit_rows * hidden));
  int64_t out_row = 0;
  int64_t row0 = 0;
  for (const SequenceChunk& chunk : batch) {
    const auto t = static_cast<int64_t>(chunk.tokens.size());
    const int64_t first = chunk.all_logits ? row0 : row0 + t - 1;
    const int64_t count = chunk.all_logits ? t : 1;
    std::memcpy(selected.data() + out_row * hidden, x.data() + first * hidden,
                static_cast<size_t>(count * hidden) * sizeof(float));
    out_row += count;
    row0 += t;
  }
  kernels::rms_norm(selected.data(), final_norm_.data(), logit_rows, hidden, c.rms_norm_eps, selected.data());
  std::vector<float> logits(static_cast<size_t>(logit_rows * lm_head_.out_features()));
  lm_head_.forward(selected.data(), logit_rows, logits.data(), scratch);
  if (c.logits_scaling != 1.0f) {
    for (float& v : logits) v /= c.logits_scaling;
  }
  return logits;
}

}  // namespace fp4serve::model
