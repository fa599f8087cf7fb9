// SPDX-License-Identifier: Apache-2.0
#include "model/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "fp4serve/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ops_moe.h"
#include "quant/dequant.h"

namespace fp4serve::model {
namespace {

namespace kc = kernels::cuda;

constexpr int64_t kMaxTransformBlock = 4096;  // kc::fwht_blocks / rotate_blocks keep one slice in shared memory

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// One online transform on the device; identical OnlineTransform objects (TransformCache) share one.
struct GpuTransform {
  TransformKernel kernel = TransformKernel::Fwht;
  int64_t block = 0;
  kc::DeviceBuffer<float> matrix;  // Dense only: [block, block]
};

struct GpuOutputTransform {
  int64_t offset = 0;
  int64_t width = 0;
  const GpuTransform* transform = nullptr;
};

struct GpuPart {
  kc::DeviceLinear weight;
  int64_t out = 0;
  bool emulate_w4a4 = false;  // ActivationEmulation::EmulateNvfp4 or EmulateMxfp4
  const GpuTransform* input = nullptr;
  std::vector<GpuOutputTransform> outputs;
};

struct CudaLinear final : BackendLinear {
  std::vector<GpuPart> parts;
};
struct CudaVector final : BackendVector {
  kc::DeviceBuffer<float> values;
};
struct CudaEmbedding final : BackendEmbedding {
  kc::TableType type = kc::TableType::Bf16;
  kc::DeviceBuffer<uint16_t> bf16;
  kc::DeviceBuffer<float> f32;
  const void* table() const {
    return type == kc::TableType::Bf16 ? static_cast<const void*>(bf16.data()) : static_cast<const void*>(f32.data());
  }
};
struct CudaTransformHandle final : BackendTransform {
  const GpuTransform* transform = nullptr;
};
struct CudaRope final : BackendRope {
  int64_t rotary_dim = 0;
  kc::DeviceBuffer<float> cos, sin;
};

// The device KV cache of one KvCache (same layout as the host cache).
struct CudaKvStorage final : KvStorage {
  const void* owner = nullptr;
  int64_t layers = 0, seq = 0, row = 0;
  kc::DeviceBuffer<float> keys, values;
};

template <class T, class B>
const T& as(const B& handle, const char* what) {
  const auto* p = dynamic_cast<const T*>(&handle);
  if (p == nullptr) throw UsageError(fmt::format("cuda backend: {} was not uploaded by this backend", what));
  return *p;
}

}  // namespace

struct CudaBackend::Impl {
  int ordinal = 0;
  kc::Stream stream;
  int64_t weight_bytes = 0;
  std::map<const OnlineTransform*, std::pair<std::shared_ptr<const OnlineTransform>, std::unique_ptr<GpuTransform>>>
      transforms;

  std::vector<kc::DeviceBuffer<float>> workspace;
  kc::DeviceBuffer<kc::bf16> x_bf16;
  kc::DeviceBuffer<float> transformed, part_out, row_weights;
  kc::DeviceBuffer<int32_t> ids;
  kc::DeviceBuffer<int64_t> positions, cache_rows, gather_index, scatter_index;
  kc::W4A4Scratch w4a4;

  const FlatBatch* flat = nullptr;
  CudaKvStorage* storage = nullptr;
  int64_t max_position = -1;

  cudaStream_t s() const { return stream.get(); }

  // Grows `buffer` to at least n elements. Contents are not kept; queued work may still read the old buffer, so
  // the stream drains first (growth happens on the first steps only).
  template <class T>
  T* grow(kc::DeviceBuffer<T>& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) {
      stream.sync();
      buffer = kc::DeviceBuffer<T>(static_cast<size_t>(n));
    }
    return buffer.data();
  }

  template <class T>
  T* upload(kc::DeviceBuffer<T>& buffer, std::span<const T> host) {
    T* dst = grow(buffer, static_cast<int64_t>(host.size()));
    if (!host.empty()) {
      // Pageable host memory is staged at the call, so `host` may go away once it returns; the copy itself runs
      // in stream order after the work already queued.
      FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(dst, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, s()));
    }
    return dst;
  }

  void apply(const GpuTransform& t, float* x, int64_t rows, int64_t width, int64_t stride) {
    switch (t.kernel) {
      case TransformKernel::Fwht: kc::fwht_blocks(x, rows, width, stride, t.block, s()); return;
      case TransformKernel::Dense: kc::rotate_blocks(x, rows, width, stride, t.matrix.data(), t.block, s()); return;
    }
  }

  const GpuTransform* transform_of(const std::shared_ptr<const OnlineTransform>& t, const std::string& where) {
    if (!t) return nullptr;
    auto it = transforms.find(t.get());
    if (it != transforms.end()) return it->second.second.get();
    if (t->block() > kMaxTransformBlock) {
      throw UnsupportedError(fmt::format("{}: online transform of block {}: the GPU transform kernels take blocks up "
                                         "to {}; run this checkpoint with --device cpu",
                                         where, t->block(), kMaxTransformBlock));
    }
    auto g = std::make_unique<GpuTransform>();
    g->kernel = t->kernel();
    g->block = t->block();
    if (g->kernel == TransformKernel::Dense) g->matrix = kc::DeviceBuffer<float>::from_host(std::span(t->matrix()));
    const GpuTransform* out = g.get();
    transforms.emplace(t.get(), std::make_pair(t, std::move(g)));
    return out;
  }

  void run_part(const GpuPart& p, const kc::bf16* in, int64_t m, float* out) {
    if (p.emulate_w4a4) {
      kc::linear_w4a4(p.weight, in, m, out, w4a4, stream);
    } else {
      kc::linear(p.weight, in, m, out, stream);
    }
  }
};

std::unique_ptr<Backend> make_cuda_backend(int ordinal) { return std::make_unique<CudaBackend>(ordinal); }

CudaBackend::CudaBackend(int ordinal) {
  if (!kc::cuda_device(ordinal)) {
    throw UsageError(fmt::format("--device cuda: no CUDA GPU with ordinal {} is usable (no driver, no device, or a "
                                 "runtime error); use --device cpu",
                                 ordinal));
  }
  FP4SERVE_CUDA_CHECK(cudaSetDevice(ordinal));
  impl_ = std::make_unique<Impl>();
  impl_->ordinal = ordinal;
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::name() const { return fmt::format("cuda:{}", impl_->ordinal); }

int64_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

std::unique_ptr<BackendLinear> CudaBackend::upload_linear(LinearGroup group) {
  Impl& im = *impl_;
  auto w = std::make_unique<CudaLinear>();
  w->modules = group.modules();
  w->in_features = group.in_features();
  w->out_features = group.out_features();
  const std::string where = join(w->modules);
  for (const LinearPart& part : group.parts()) {
    GpuPart g;
    const bool mxfp4_w4a4 = part.activation_quant == kernels::ActivationEmulation::EmulateMxfp4;
    try {
      g.weight = kc::upload_linear(part.weight, im.stream, mxfp4_w4a4);
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(fmt::format("{}: op linear is not on the GPU: {}; run this checkpoint with --device cpu",
                                         where, e.what()));
    }
    g.out = part.weight.out_features;
    g.emulate_w4a4 = mxfp4_w4a4 || part.activation_quant == kernels::ActivationEmulation::EmulateNvfp4;
    g.input = im.transform_of(part.input_transform, where);
    for (const OutputTransform& t : part.output_transforms) {
      g.outputs.push_back({t.offset, t.width, im.transform_of(t.transform, where)});
    }
    im.weight_bytes += g.weight.weight_bytes();
    w->parts.push_back(std::move(g));
  }
  return w;
}

std::unique_ptr<BackendVector> CudaBackend::upload_vector(std::vector<float> values) {
  auto v = std::make_unique<CudaVector>();
  v->size = static_cast<int64_t>(values.size());
  v->values = kc::DeviceBuffer<float>::from_host(std::span<const float>(values));
  return v;
}

std::unique_ptr<BackendEmbedding> CudaBackend::upload_embedding(const core::TensorView& table, const std::string& name) {
  if (table.shape.size() != 2) {
    throw FormatError(fmt::format("{}: shape {} where [vocab, hidden] was expected", name, core::shape_to_string(table.shape)));
  }
  auto e = std::make_unique<CudaEmbedding>();
  e->vocab = table.shape[0];
  e->dim = table.shape[1];
  const auto n = static_cast<size_t>(e->vocab * e->dim);
  if (table.dtype == core::DType::BF16 && table.bytes.size() == n * 2) {
    std::vector<uint16_t> bits(n);
    for (size_t i = 0; i < n; ++i) bits[i] = table.load<uint16_t>(i);
    e->bf16 = kc::DeviceBuffer<uint16_t>::from_host(std::span<const uint16_t>(bits));
    e->type = kc::TableType::Bf16;
    impl_->weight_bytes += static_cast<int64_t>(e->bf16.bytes());
  } else {  // F16 / F32: widened exactly; quant::load_float throws FormatError for any other dtype
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = quant::load_float(table, i, name);
    e->f32 = kc::DeviceBuffer<float>::from_host(std::span<const float>(values));
    e->type = kc::TableType::F32;
    impl_->weight_bytes += static_cast<int64_t>(e->f32.bytes());
  }
  return e;
}

std::unique_ptr<BackendTransform> CudaBackend::upload_transform(std::shared_ptr<const OnlineTransform> transform,
                                                                const std::string& where) {
  if (!transform) throw UsageError(fmt::format("{}: null online transform", where));
  auto t = std::make_unique<CudaTransformHandle>();
  t->block = transform->block();
  t->transform = impl_->transform_of(transform, where);
  return t;
}

std::unique_ptr<BackendRope> CudaBackend::upload_rope(kernels::RopeCache rope) {
  auto r = std::make_unique<CudaRope>();
  r->max_positions = rope.max_positions();
  r->rotary_dim = rope.rotary_dim();
  const auto table = static_cast<size_t>(rope.max_positions() * (rope.rotary_dim() / 2));
  r->cos = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.cos(0), table));
  r->sin = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.sin(0), table));
  return r;
}

void CudaBackend::check_attention(const AttentionOp& op, const std::string& layer) const {
  if (op.head_dim > kc::kMaxAttentionHeadDim) {
    throw UnsupportedError(fmt::format("{}: op attention is not on the GPU for head_dim {} (the kernel takes up to {}); "
                                       "use --device cpu",
                                       layer, op.head_dim, kc::kMaxAttentionHeadDim));
  }
}

KvCache CudaBackend::make_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                                int max_slots) const {
  auto storage = std::make_unique<CudaKvStorage>();
  storage->owner = this;
  storage->layers = num_layers;
  storage->seq = max_seq_len;
  storage->row = num_kv_heads * head_dim;
  const auto n = static_cast<size_t>(std::max<int64_t>(max_slots, 0) * std::max<int64_t>(num_layers, 0) *
                                     std::max<int64_t>(max_seq_len, 0) * std::max<int64_t>(storage->row, 0));
  storage->keys = kc::DeviceBuffer<float>(n);
  storage->values = kc::DeviceBuffer<float>(n);
  return KvCache(num_layers, num_kv_heads, head_dim, max_seq_len, max_slots, std::move(storage));
}

void CudaBackend::begin_step(const FlatBatch& flat, KvCache& cache) {
  auto* storage = dynamic_cast<CudaKvStorage*>(cache.storage());
  if (storage == nullptr || storage->owner != this) {
    throw UsageError("CudaBackend: the KV cache was not made by this backend's make_cache");
  }
  Impl& im = *impl_;
  im.flat = &flat;
  im.storage = storage;
  im.max_position = flat.positions.empty() ? -1 : *std::max_element(flat.positions.begin(), flat.positions.end());
  im.upload(im.ids, std::span<const int32_t>(flat.ids));
  im.upload(im.positions, std::span<const int64_t>(flat.positions));
  im.upload(im.cache_rows, std::span<const int64_t>(flat.cache_rows));
}

void CudaBackend::end_step() {
  impl_->flat = nullptr;
  impl_->storage = nullptr;
}

const FlatBatch& CudaBackend::step() const {
  if (impl_->flat == nullptr) throw UsageError("cuda backend: an op ran outside begin_step … end_step");
  return *impl_->flat;
}

float* CudaBackend::workspace(int slot, int64_t floats) {
  Impl& im = *impl_;
  if (slot < 0) throw UsageError(fmt::format("cuda backend: workspace slot {}", slot));
  if (static_cast<size_t>(slot) >= im.workspace.size()) im.workspace.resize(static_cast<size_t>(slot) + 1);
  return im.grow(im.workspace[static_cast<size_t>(slot)], std::max<int64_t>(floats, 1));
}

void CudaBackend::embed(const BackendEmbedding& table, float scale, float* out) {
  const auto& e = as<CudaEmbedding>(table, "an embedding");
  const auto n = static_cast<int64_t>(step().ids.size());
  kc::embedding_gather(e.table(), e.type, e.vocab, e.dim, impl_->ids.data(), n, scale, out, impl_->s());
}

void CudaBackend::rms_norm(const float* x, const BackendVector& weight, int64_t rows, int64_t dim, float eps, float* out) {
  kc::rms_norm(x, as<CudaVector>(weight, "a vector").values.data(), rows, dim, eps, out, impl_->s());
}

void CudaBackend::linear(const BackendLinear& w, const float* x, int64_t m, float* y) {
  Impl& im = *impl_;
  const auto& g = as<CudaLinear>(w, "a linear");
  const int64_t k = g.in_features;
  if (m == 0) return;
  kc::bf16* xb = im.grow(im.x_bf16, m * k);
  if (g.parts.size() > 1) {
    int64_t widest = 0;
    for (const GpuPart& p : g.parts) widest = std::max(widest, p.out);
    im.grow(im.part_out, m * widest);
  }
  bool converted = false;
  const GpuTransform* current = nullptr;
  int64_t col = 0;
  for (const GpuPart& p : g.parts) {
    // The bf16 GEMM input, recomputed only when a part's input transform differs (q|k|v share one).
    if (!converted || p.input != current) {
      if (p.input != nullptr) {
        float* t = im.grow(im.transformed, m * k);
        FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(t, x, static_cast<size_t>(m * k) * sizeof(float), cudaMemcpyDeviceToDevice, im.s()));
        im.apply(*p.input, t, m, k, k);
        kc::f32_to_bf16(t, m * k, xb, im.s());
      } else {
        kc::f32_to_bf16(x, m * k, xb, im.s());
      }
      converted = true;
      current = p.input;
    }
    const bool single = g.parts.size() == 1;
    float* out = single ? y : im.part_out.data();
    im.run_part(p, xb, m, out);
    for (const GpuOutputTransform& t : p.outputs) im.apply(*t.transform, out + t.offset, m, t.width, single ? g.out_features : p.out);
    if (!single) kc::copy_rows(out, p.out, nullptr, y + col, g.out_features, nullptr, m, p.out, im.s());
    col += p.out;
  }
}

void CudaBackend::copy_columns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                               int64_t width) {
  kc::copy_rows(src, src_stride, nullptr, dst, dst_stride, nullptr, rows, width, impl_->s());
}

void CudaBackend::rope(const BackendRope& rope, float* x, int64_t heads, int64_t head_dim) {
  const auto& r = as<CudaRope>(rope, "a RoPE table");
  const FlatBatch& s = step();
  if (impl_->max_position >= r.max_positions) {
    throw UsageError(fmt::format("CudaBackend: position {} is outside the RoPE table's [0, {}) "
                                 "(max_position_embeddings)",
                                 impl_->max_position, r.max_positions));
  }
  kc::apply_rope_neox(x, static_cast<int64_t>(s.positions.size()), heads, head_dim, r.rotary_dim,
                      impl_->positions.data(), r.cos.data(), r.sin.data(), impl_->s());
}

void CudaBackend::transform(const BackendTransform& t, float* x, int64_t rows, int64_t dim) {
  impl_->apply(*as<CudaTransformHandle>(t, "a transform").transform, x, rows, dim, dim);
}

void CudaBackend::write_kv(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) {
  Impl& im = *impl_;
  const FlatBatch& s = step();
  CudaKvStorage& c = *im.storage;
  const auto total = static_cast<int64_t>(s.cache_rows.size());
  float* k_layer = c.keys.data() + layer * c.seq * c.row;
  float* v_layer = c.values.data() + layer * c.seq * c.row;
  kc::copy_rows(k, k_stride, nullptr, k_layer, c.row, im.cache_rows.data(), total, c.row, im.s());
  kc::copy_rows(v, v_stride, nullptr, v_layer, c.row, im.cache_rows.data(), total, c.row, im.s());
}

void CudaBackend::attention(int64_t layer, int slot, const float* q, int64_t t, int64_t start_pos, const AttentionOp& op,
                            float* out) {
  Impl& im = *impl_;
  (void)step();
  CudaKvStorage& c = *im.storage;
  const float* sinks = op.sinks == nullptr ? nullptr : as<CudaVector>(*op.sinks, "sinks").values.data();
  const kc::AttentionShape shape{op.num_heads, op.num_kv_heads, op.head_dim, op.scale, op.sliding_window, sinks};
  const int64_t slot_row = static_cast<int64_t>(slot) * c.layers * c.seq;
  const int64_t base = (slot_row + layer * c.seq) * c.row;
  kc::attention(q, t, start_pos, c.keys.data() + base, c.values.data() + base, c.row, shape, out, im.s());
}

void CudaBackend::activation(ExpertActivation kind, float alpha, float limit, const float* x, int64_t m, int64_t inter,
                             float* y) {
  const cudaStream_t s = impl_->s();
  switch (kind) {
    case ExpertActivation::SiluGated: kc::silu_and_mul(x, m, inter, y, s); return;
    case ExpertActivation::SwigluOai: kc::swiglu_oai_and_mul(x, m, inter, alpha, limit, y, s); return;
    case ExpertActivation::ReluSquared: kc::relu_squared(x, m * inter, y, s); return;
    case ExpertActivation::Silu: kc::silu(x, m * inter, y, s); return;
  }
}

void CudaBackend::add_scaled(float* x, const float* delta, float alpha, int64_t n) {
  kc::add_scaled(x, delta, alpha, n, impl_->s());
}

void CudaBackend::fill(float* x, int64_t n, float value) { kc::fill(x, n, value, impl_->s()); }

void CudaBackend::route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights) {
  std::vector<float> host(static_cast<size_t>(m * settings.num_experts));
  to_host(logits, static_cast<int64_t>(host.size()), host.data());
  model::route(settings, host.data(), m, experts, weights);
}

void CudaBackend::gather_rows(const float* src, int64_t width, std::span<const int64_t> rows, float* dst) {
  Impl& im = *impl_;
  const int64_t* index = im.upload(im.gather_index, rows);
  kc::copy_rows(src, width, index, dst, width, nullptr, static_cast<int64_t>(rows.size()), width, im.s());
}

void CudaBackend::scatter_add_rows(const float* y, int64_t width, std::span<const int64_t> rows,
                                   std::span<const float> weights, float* out) {
  Impl& im = *impl_;
  if (rows.size() != weights.size()) {
    throw UsageError(fmt::format("scatter_add_rows: {} rows and {} weights", rows.size(), weights.size()));
  }
  const int64_t* index = im.upload(im.scatter_index, rows);
  const float* w = im.upload(im.row_weights, weights);
  kc::scatter_add_rows(y, width, index, w, static_cast<int64_t>(rows.size()), out, im.s());
}

void CudaBackend::add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out) {
  kc::add_sigmoid_gated(y, gate, m, width, out, impl_->s());
}

void CudaBackend::to_host(const float* x, int64_t n, float* host) {
  if (n <= 0) return;
  FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(host, x, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost, impl_->s()));
  impl_->stream.sync();
}

const float* CudaBackend::host_view(const float* x, int64_t n, std::vector<float>& copy) {
  copy.resize(static_cast<size_t>(std::max<int64_t>(n, 0)));
  to_host(x, n, copy.data());
  return copy.data();
}

}  // namespace fp4serve::model
