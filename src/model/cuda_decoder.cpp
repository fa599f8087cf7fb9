// SPDX-License-Identifier: Apache-2.0
// model::Decoder's forward step op for op on the GPU (see decoder.cpp for the CPU original; keep the two in step).
#include "model/cuda_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>

#include "fp4serve/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/ops.h"
#include "kernels/rope.h"
#include "model/decoder.h"
#include "quant/dequant.h"

namespace fp4serve::model {
namespace {

namespace kc = kernels::cuda;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// One LinearGroup on the device: its parts' weights in the GPU GEMM's layout, outputs concatenated along N.
struct GpuLinearGroup {
  std::vector<kc::DeviceLinear> parts;
  std::vector<int64_t> part_out;
  std::vector<bool> emulate_w4a4;  // per part: ActivationQuant::EmulateNvfp4 or EmulateMxfp4
  std::vector<std::string> modules;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

GpuLinearGroup upload_group(const LinearGroup& group, kc::Stream& stream, int64_t& weight_bytes) {
  GpuLinearGroup g;
  g.modules = group.modules();
  g.in_features = group.in_features();
  g.out_features = group.out_features();
  for (const LinearPart& part : group.parts()) {
    if (part.input_transform != nullptr || !part.output_transforms.empty()) {
      throw UnsupportedError(fmt::format("{}: online input transforms (QuIP / SpinQuant rotations) have no GPU kernel "
                                         "yet; run this checkpoint with --device cpu",
                                         join(g.modules)));
    }
    const bool mxfp4_w4a4 = part.activation_quant == kernels::ActivationQuant::EmulateMxfp4;
    g.parts.push_back(kc::upload_linear(part.weight, stream, mxfp4_w4a4));
    g.part_out.push_back(part.weight.out_features);
    g.emulate_w4a4.push_back(mxfp4_w4a4 || part.activation_quant == kernels::ActivationQuant::EmulateNvfp4);
    weight_bytes += g.parts.back().weight_bytes();
  }
  return g;
}

struct GpuLayer {
  kc::DeviceBuffer<float> input_norm, post_attention_norm, q_norm, k_norm;
  int64_t sliding_window = 0;
  GpuLinearGroup qkv, o_proj, gate_up, down;
};

// The device KV cache of one KvCache (same layout as the host cache).
struct CudaKvStorage final : KvStorage {
  const void* owner = nullptr;
  int64_t layers = 0, seq = 0, row = 0;
  kc::DeviceBuffer<float> keys, values;
};

template <class T>
kc::DeviceBuffer<T> upload(const std::vector<T>& host) {
  return kc::DeviceBuffer<T>::from_host(std::span<const T>(host));
}

// Grows a device buffer to at least `n` elements (contents are not kept: every step rewrites its scratch).
template <class T>
T* ensure(kc::DeviceBuffer<T>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer = kc::DeviceBuffer<T>(static_cast<size_t>(n));
  return buffer.data();
}

}  // namespace

FlatBatch flatten_batch(std::span<const SequenceChunk> batch, int64_t num_layers, int64_t max_seq_len, int max_slots,
                        int64_t vocab) {
  FlatBatch flat;
  std::set<int> slots;
  int64_t row0 = 0;
  for (const SequenceChunk& chunk : batch) {
    const auto t = static_cast<int64_t>(chunk.tokens.size());
    if (t == 0) throw UsageError("Decoder::forward: empty chunk");
    if (chunk.start_pos < 0 || chunk.start_pos + t > max_seq_len) {
      throw UsageError(fmt::format("Decoder::forward: sequence of {} tokens exceeds the cache length {}",
                                   chunk.start_pos + t, max_seq_len));
    }
    if (chunk.slot < 0 || chunk.slot >= max_slots) {
      throw UsageError(fmt::format("Decoder::forward: slot {} is outside the cache's {} slots", chunk.slot, max_slots));
    }
    if (!slots.insert(chunk.slot).second) throw UsageError(fmt::format("Decoder::forward: slot {} appears twice", chunk.slot));
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = chunk.tokens[static_cast<size_t>(i)];
      if (id < 0 || id >= vocab) {
        throw UsageError(fmt::format("Decoder::forward: token id {} at position {} is outside the vocabulary [0, {})",
                                     id, chunk.start_pos + i, vocab));
      }
      flat.ids.push_back(id);
      flat.positions.push_back(chunk.start_pos + i);
      flat.cache_rows.push_back(static_cast<int64_t>(chunk.slot) * num_layers * max_seq_len + chunk.start_pos + i);
    }
    for (int64_t i = chunk.all_logits ? 0 : t - 1; i < t; ++i) flat.logit_rows.push_back(row0 + i);
    row0 += t;
  }
  return flat;
}

struct CudaDecoder::Impl {
  kc::Stream stream;
  kc::TableType embed_type = kc::TableType::Bf16;
  kc::DeviceBuffer<uint16_t> embed_bf16;
  kc::DeviceBuffer<float> embed_f32;
  std::vector<GpuLayer> layers;
  kc::DeviceBuffer<float> final_norm;
  GpuLinearGroup lm_head;
  kc::DeviceBuffer<float> rope_cos, rope_sin;
  int64_t weight_bytes = 0;

  // Step scratch, grown on demand (mutable state of a const forward: one decoder serves one thread).
  kc::DeviceBuffer<int32_t> ids;
  kc::DeviceBuffer<int64_t> positions, cache_rows, logit_rows;
  kc::DeviceBuffer<float> x, h, qkv, q, k, attn, delta, gate_up, act, part_out, selected, logits;
  kc::DeviceBuffer<kc::bf16> x_bf16;
  kc::W4A4Scratch w4a4_scratch;

  const void* embed_table() const {
    return embed_type == kc::TableType::Bf16 ? static_cast<const void*>(embed_bf16.data())
                                             : static_cast<const void*>(embed_f32.data());
  }

  void run_part(const GpuLinearGroup& g, size_t p, const kc::bf16* in, int64_t m, float* out) {
    if (g.emulate_w4a4[p]) {
      kc::linear_w4a4(g.parts[p], in, m, out, w4a4_scratch, stream);
    } else {
      kc::linear(g.parts[p], in, m, out, stream);
    }
  }

  // y[m, out] = concat over parts of x[m, in] · Wᵀ, x rounded to bf16 once for all parts.
  void run(const GpuLinearGroup& g, const float* x_dev, int64_t m, float* y_dev) {
    kc::bf16* xb = ensure(x_bf16, m * g.in_features);
    kc::f32_to_bf16(x_dev, m * g.in_features, xb, stream.get());
    if (g.parts.size() == 1) {
      run_part(g, 0, xb, m, y_dev);
      return;
    }
    int64_t col = 0;
    for (size_t p = 0; p < g.parts.size(); ++p) {
      float* tmp = ensure(part_out, m * g.part_out[p]);
      run_part(g, p, xb, m, tmp);
      kc::copy_rows(tmp, g.part_out[p], nullptr, y_dev + col, g.out_features, nullptr, m, g.part_out[p], stream.get());
      col += g.part_out[p];
    }
  }
};

CudaDecoder::CudaDecoder(ModelConfig config, const WeightSource& weights, int ordinal)
    : config_(std::move(config)), impl_(nullptr) {
  const ModelConfig& c = config_;
  if (c.moe.num_experts > 0) {
    throw UnsupportedError(fmt::format("{}: mixture-of-experts models have no GPU decoder yet (dense Llama, Mistral, "
                                       "Qwen2, Qwen3 and Granite only); use --device cpu",
                                       c.architecture_name));
  }
  if (c.attention_sinks) {
    throw UnsupportedError(fmt::format("{}: attention sinks are not wired into the GPU decoder; use --device cpu",
                                       c.architecture_name));
  }
  if (c.head_dim > kc::kMaxAttentionHeadDim) {
    throw UnsupportedError(fmt::format("{}: head_dim {} exceeds the GPU attention kernel's {}; use --device cpu",
                                       c.architecture_name, c.head_dim, kc::kMaxAttentionHeadDim));
  }
  const auto device = kc::cuda_device(ordinal);
  if (!device) {
    throw UsageError(fmt::format("--device cuda: no CUDA GPU with ordinal {} is usable (no driver, no device, or a "
                                 "runtime error); use --device cpu",
                                 ordinal));
  }
  FP4SERVE_CUDA_CHECK(cudaSetDevice(ordinal));
  impl_ = std::make_unique<Impl>();
  Impl& im = *impl_;

  const core::TensorView embed = weights.tensor("model.embed_tokens.weight");
  if (embed.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
    throw FormatError(fmt::format("model.embed_tokens.weight: shape {} where [{}, {}] (vocab_size, hidden_size) was expected",
                                  core::shape_to_string(embed.shape), c.vocab_size, c.hidden_size));
  }
  const auto n_embed = static_cast<size_t>(c.vocab_size * c.hidden_size);
  if (embed.dtype == core::DType::BF16 && embed.bytes.size() == n_embed * 2) {
    std::vector<uint16_t> bits(n_embed);
    for (size_t i = 0; i < n_embed; ++i) bits[i] = embed.load<uint16_t>(i);
    im.embed_bf16 = upload(bits);
    im.weight_bytes += static_cast<int64_t>(im.embed_bf16.bytes());
    im.embed_type = kc::TableType::Bf16;
  } else {  // F16 / F32: widened exactly; quant::load_float throws FormatError for any other dtype
    std::vector<float> values(n_embed);
    for (size_t i = 0; i < n_embed; ++i) values[i] = quant::load_float(embed, i, "model.embed_tokens.weight");
    im.embed_f32 = upload(values);
    im.weight_bytes += static_cast<int64_t>(im.embed_f32.bytes());
    im.embed_type = kc::TableType::F32;
  }

  im.layers.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l);
    GpuLayer layer;
    layer.input_norm = upload(load_vector(weights, p + ".input_layernorm.weight", c.hidden_size));
    layer.post_attention_norm = upload(load_vector(weights, p + ".post_attention_layernorm.weight", c.hidden_size));
    if (c.qk_norm) {
      layer.q_norm = upload(load_vector(weights, p + ".self_attn.q_norm.weight", c.head_dim));
      layer.k_norm = upload(load_vector(weights, p + ".self_attn.k_norm.weight", c.head_dim));
    }
    layer.sliding_window = c.sliding_window_of(l);
    const AttentionTransforms transforms = weights.attention_transforms(l);
    if (!transforms.query.empty() || !transforms.key.empty()) {
      throw UnsupportedError(fmt::format("{}.self_attn: online q_attn / k_cache transforms (SpinQuant R3) have no GPU "
                                         "kernel yet; run this checkpoint with --device cpu",
                                         p));
    }
    const LinearGroup qkv = weights.linear_group({p + ".self_attn.q_proj", p + ".self_attn.k_proj", p + ".self_attn.v_proj"});
    const int64_t qkv_out = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    if (qkv.out_features() != qkv_out || qkv.in_features() != c.hidden_size) {
      throw FormatError(fmt::format("{}.self_attn q/k/v: [{}, {}] in total where [{}, {}] was expected from config.json",
                                    p, qkv.out_features(), qkv.in_features(), qkv_out, c.hidden_size));
    }
    const LinearGroup gate_up = weights.linear_group({p + ".mlp.gate_proj", p + ".mlp.up_proj"});
    const LinearGroup down = weights.linear_group({p + ".mlp.down_proj"});
    if (gate_up.out_features() != 2 * c.intermediate_size || down.out_features() != c.hidden_size) {
      throw FormatError(fmt::format("{}.mlp: gate|up has {} outputs and down {}; config.json expects {} and {}", p,
                                    gate_up.out_features(), down.out_features(), 2 * c.intermediate_size,
                                    c.hidden_size));
    }
    layer.qkv = upload_group(qkv, im.stream, im.weight_bytes);
    layer.o_proj = upload_group(weights.linear_group({p + ".self_attn.o_proj"}), im.stream, im.weight_bytes);
    layer.gate_up = upload_group(gate_up, im.stream, im.weight_bytes);
    layer.down = upload_group(down, im.stream, im.weight_bytes);
    im.layers.push_back(std::move(layer));
  }
  im.final_norm = upload(load_vector(weights, "model.norm.weight", c.hidden_size));
  const LinearGroup lm_head = weights.linear_group({"lm_head"});
  if (lm_head.out_features() != c.vocab_size || lm_head.in_features() != c.hidden_size) {
    throw FormatError(fmt::format("lm_head: [{}, {}] where [{}, {}] (vocab_size, hidden_size) was expected",
                                  lm_head.out_features(), lm_head.in_features(), c.vocab_size, c.hidden_size));
  }
  im.lm_head = upload_group(lm_head, im.stream, im.weight_bytes);

  // The host RopeCache computes every scaling kind (default / linear / llama3 / yarn); its table goes up once.
  const kernels::RopeCache rope(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings);
  const auto table = static_cast<size_t>(c.max_position_embeddings * (c.head_dim / 2));
  im.rope_cos = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.cos(0), table));
  im.rope_sin = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.sin(0), table));
  im.stream.sync();
}

CudaDecoder::~CudaDecoder() = default;

KvCache CudaDecoder::make_cache(int64_t max_seq_len, int max_slots) const {
  const ModelConfig& c = config_;
  const int64_t row = c.num_kv_heads * c.head_dim;
  if (max_seq_len > c.max_position_embeddings) {
    throw UsageError(fmt::format("CudaDecoder: a cache of {} positions exceeds max_position_embeddings {} (the RoPE "
                                 "table's length)",
                                 max_seq_len, c.max_position_embeddings));
  }
  auto storage = std::make_unique<CudaKvStorage>();
  storage->owner = this;
  storage->layers = c.num_layers;
  storage->seq = max_seq_len;
  storage->row = row;
  const auto n = static_cast<size_t>(static_cast<int64_t>(std::max(max_slots, 0)) * c.num_layers * max_seq_len * row);
  storage->keys = kc::DeviceBuffer<float>(n);
  storage->values = kc::DeviceBuffer<float>(n);
  return KvCache(c.num_layers, c.num_kv_heads, c.head_dim, max_seq_len, max_slots, std::move(storage));
}

std::vector<float> CudaDecoder::forward(std::span<const SequenceChunk> batch, KvCache& cache) const {
  auto* storage = dynamic_cast<CudaKvStorage*>(cache.storage());
  if (storage == nullptr || storage->owner != this) {
    throw UsageError("CudaDecoder::forward: the KV cache was not made by this decoder's make_cache");
  }
  const ModelConfig& c = config_;
  Impl& im = *impl_;
  const cudaStream_t s = im.stream.get();
  const int64_t hidden = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd;
  const int64_t kv_width = c.num_kv_heads * hd;
  const int64_t qkv_width = q_width + 2 * kv_width;
  const int64_t inter = c.intermediate_size;
  const int64_t seq = storage->seq;

  const FlatBatch flat = flatten_batch(batch, c.num_layers, seq, cache.max_slots(), c.vocab_size);
  const auto total = static_cast<int64_t>(flat.ids.size());
  const auto logit_rows = static_cast<int64_t>(flat.logit_rows.size());

  // Host → device copies on the decoder's stream (a non-blocking stream does not order with plain cudaMemcpy);
  // `flat` outlives them because the step ends with a stream sync.
  auto to_device = [&](auto& buffer, const auto& host) {
    auto* dst = ensure(buffer, static_cast<int64_t>(host.size()));
    FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(dst, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice, s));
    return dst;
  };
  const int32_t* ids = to_device(im.ids, flat.ids);
  const int64_t* positions = to_device(im.positions, flat.positions);
  const int64_t* cache_rows = to_device(im.cache_rows, flat.cache_rows);
  const int64_t* logit_index = to_device(im.logit_rows, flat.logit_rows);

  float* x = ensure(im.x, total * hidden);
  float* h = ensure(im.h, total * hidden);
  float* qkv = ensure(im.qkv, total * qkv_width);
  float* q = ensure(im.q, total * q_width);
  float* k = ensure(im.k, total * kv_width);
  float* attn = ensure(im.attn, total * q_width);
  float* delta = ensure(im.delta, total * hidden);
  float* gate_up = ensure(im.gate_up, total * 2 * inter);
  float* act = ensure(im.act, total * inter);
  // Sized once per step for the widest GEMM input and part output, so that run() never frees a buffer that a
  // queued kernel may still read.
  ensure(im.x_bf16, total * std::max({hidden, inter, q_width}));
  ensure(im.part_out, total * std::max({qkv_width, 2 * inter, hidden}));  // lm_head is one module, one part

  kc::embedding_gather(im.embed_table(), im.embed_type, c.vocab_size, hidden, ids, total, c.embedding_multiplier, x, s);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const GpuLayer& layer = im.layers[static_cast<size_t>(l)];
    float* k_layer = storage->keys.data() + l * seq * kv_width;
    float* v_layer = storage->values.data() + l * seq * kv_width;
    kc::rms_norm(x, layer.input_norm.data(), total, hidden, c.rms_norm_eps, h, s);
    im.run(layer.qkv, h, total, qkv);
    kc::copy_rows(qkv, qkv_width, nullptr, q, q_width, nullptr, total, q_width, s);
    kc::copy_rows(qkv + q_width, qkv_width, nullptr, k, kv_width, nullptr, total, kv_width, s);
    if (c.qk_norm) {
      kc::rms_norm(q, layer.q_norm.data(), total * c.num_heads, hd, c.rms_norm_eps, q, s);
      kc::rms_norm(k, layer.k_norm.data(), total * c.num_kv_heads, hd, c.rms_norm_eps, k, s);
    }
    kc::apply_rope_neox(q, total, c.num_heads, hd, hd, positions, im.rope_cos.data(), im.rope_sin.data(), s);
    kc::apply_rope_neox(k, total, c.num_kv_heads, hd, hd, positions, im.rope_cos.data(), im.rope_sin.data(), s);
    kc::copy_rows(k, kv_width, nullptr, k_layer, kv_width, cache_rows, total, kv_width, s);
    kc::copy_rows(qkv + q_width + kv_width, qkv_width, nullptr, v_layer, kv_width, cache_rows, total, kv_width, s);

    const kc::AttentionShape shape{c.num_heads, c.num_kv_heads, hd, c.attention_scale, layer.sliding_window, nullptr};
    int64_t row0 = 0;
    for (const SequenceChunk& chunk : batch) {
      const auto t = static_cast<int64_t>(chunk.tokens.size());
      const int64_t slot_row = static_cast<int64_t>(chunk.slot) * c.num_layers * seq;
      kc::attention(q + row0 * q_width, t, chunk.start_pos, k_layer + slot_row * kv_width,
                    v_layer + slot_row * kv_width, kv_width, shape, attn + row0 * q_width, s);
      row0 += t;
    }
    im.run(layer.o_proj, attn, total, delta);
    kc::add_scaled(x, delta, c.residual_multiplier, total * hidden, s);

    kc::rms_norm(x, layer.post_attention_norm.data(), total, hidden, c.rms_norm_eps, h, s);
    im.run(layer.gate_up, h, total, gate_up);
    kc::silu_and_mul(gate_up, total, inter, act, s);
    im.run(layer.down, act, total, delta);
    kc::add_scaled(x, delta, c.residual_multiplier, total * hidden, s);
  }

  // Final norm and lm_head only on the rows whose logits are wanted.
  float* selected = ensure(im.selected, logit_rows * hidden);
  kc::copy_rows(x, hidden, logit_index, selected, hidden, nullptr, logit_rows, hidden, s);
  kc::rms_norm(selected, im.final_norm.data(), logit_rows, hidden, c.rms_norm_eps, selected, s);
  float* logits_dev = ensure(im.logits, logit_rows * c.vocab_size);
  im.run(im.lm_head, selected, logit_rows, logits_dev);
  std::vector<float> logits(static_cast<size_t>(logit_rows * c.vocab_size));
  FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_dev, logits.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  im.stream.sync();
  if (c.logits_scaling != 1.0f) {
    for (float& v : logits) v /= c.logits_scaling;
  }
  return logits;
}

int64_t CudaDecoder::weight_bytes() const { return impl_->weight_bytes; }

}  // namespace fp4serve::model
