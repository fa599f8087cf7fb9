// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/graph.h"
#include "backends/cuda/kernels/linear_cuda.h"
#include "backends/cuda/kernels/ops.h"
#include "backends/cuda/kernels/ops_moe.h"
#include "backends/cuda/kernels/partition.h"
#include "fp4serve/error.h"
#include "backends/cuda/step_arrays.h"
#include "quant/dequant.h"

namespace fp4serve::backends::cuda {

using namespace fp4serve::model;  // NOLINT: this file implements model::Backend

namespace {

namespace kc = kernels::cuda;


std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// One online transform on the device; identical OnlineTransform objects (TransformCache) share one.
struct GpuTransform {
  TransformKernel kernel = TransformKernel::Fwht;
  int64_t block = 0;
  kc::DeviceBuffer<float> matrix;  // Dense only: [block, block] (a KroneckerHadamard transform runs dense here)
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

// The device KV cache of one KvCache's block pool ([block][layer row in the block's group][block position]
// [kv_heads · head_dim] fp32; `layers` = KvCache::layers_per_block), with
// one more block than the pool hands out: `scratch_block`, where the padding rows of a padded decode step write and
// read (step_arrays.h).
struct CudaKvStorage final : KvStorage {
  const void* owner = nullptr;
  uint64_t id = 0;  // unique per storage: graphs captured on another cache are stale
  int64_t layers = 0, seq = 0, row = 0, block_size = 0;
  int32_t scratch_block = 0;
  kc::DeviceBuffer<float> keys, values;
};

std::atomic<uint64_t> next_storage_id{1};

// Page-locked host memory for the step arrays: a copy from it is asynchronous (pageable memory is staged by
// the driver at the call), so the step's one host→device copy does not block the host.
class PinnedBytes {
 public:
  PinnedBytes() = default;
  ~PinnedBytes() {
    if (data_ != nullptr) cudaFreeHost(data_);  // no check: a destructor must not throw
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  std::span<std::byte> get(size_t bytes) {
    if (bytes > size_) {
      if (data_ != nullptr) FP4SERVE_CUDA_CHECK(cudaFreeHost(data_));
      data_ = nullptr;
      size_ = 0;
      FP4SERVE_CUDA_CHECK(cudaMallocHost(&data_, bytes));
      size_ = bytes;
    }
    return {static_cast<std::byte*>(data_), bytes};
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Marks when the last copy out of the pinned staging has run, so that the next step does not overwrite it
// early (normally the step's closing logits copy has waited for it already).
class CopyDone {
 public:
  CopyDone() { FP4SERVE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CopyDone() { cudaEventDestroy(event_); }
  CopyDone(const CopyDone&) = delete;
  CopyDone& operator=(const CopyDone&) = delete;
  void record(cudaStream_t s) { FP4SERVE_CUDA_CHECK(cudaEventRecord(event_, s)); }
  void wait() { FP4SERVE_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

bool graphs_from_environment() {
  const char* v = std::getenv("FP4SERVE_CUDA_GRAPHS");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

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
  kc::DeviceBuffer<int64_t> gather_index, scatter_index;
  kc::DeviceBuffer<int32_t> attention_table;  // the block table of a prefill attention call
  const KvCache* cache = nullptr;
  kc::W4A4Scratch w4a4;

  const FlatBatch* flat = nullptr;
  CudaKvStorage* storage = nullptr;
  int64_t max_position = -1;
  int64_t rope_limit = INT64_MAX;  // the smallest max_positions of the uploaded RoPE tables
  int multiprocessors = 1;

  // The step's per-row arrays (step_arrays.h) at a fixed device address, refreshed by one copy per step.
  int64_t run_rows = 0;  // step_rows()
  StepArraysLayout layout;
  kc::DeviceBuffer<int64_t> step_arrays;
  PinnedBytes staging;
  CopyDone staging_copied;
  kc::DeviceBuffer<float> attention_workspace;

  // Decode-step graphs. Every buffer a captured step reads is one of this Impl's, the cache's or a weight's;
  // `generation` counts reallocations of the first kind, so that graphs holding an old address are dropped.
  kc::StepGraphs graphs;
  bool graphs_enabled = graphs_from_environment();
  uint64_t generation = 0;
  uint64_t graph_generation = 0;
  uint64_t graph_storage = 0;
  std::thread::id graph_thread;  // the split-K workspace and the cuBLAS handle of linear() are per host thread
  CudaBackend::GraphStats stats;

  cudaStream_t s() const { return stream.get(); }

  // Grows `buffer` to at least n elements. Contents are not kept; queued work may still read the old buffer, so
  // the stream drains first (growth happens on the first steps only).
  template <class T>
  T* grow(kc::DeviceBuffer<T>& buffer, int64_t n) {
    if (static_cast<int64_t>(buffer.size()) < n) {
      stream.sync();
      buffer = kc::DeviceBuffer<T>(static_cast<size_t>(n));
      ++generation;
    }
    return buffer.data();
  }

  template <class T>
  T* array(size_t offset) const {
    return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(const_cast<int64_t*>(step_arrays.data())) + offset);
  }
  const int32_t* ids() const { return array<int32_t>(layout.ids); }
  const int32_t* seq_len() const { return array<int32_t>(layout.seq_len); }
  const int64_t* positions() const { return array<int64_t>(layout.positions); }
  // Group g's arrays (KvCache::group_of_layer): cache rows [rows], block tables [rows][table_width].
  const int64_t* cache_rows(int g) const { return array<int64_t>(layout.cache_rows) + g * layout.rows; }
  const int32_t* block_tables(int g) const {
    return array<int32_t>(layout.block_tables) + g * layout.rows * layout.table_width;
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
      case TransformKernel::Dense:
      case TransformKernel::KroneckerHadamard:
        kc::rotate_blocks(x, rows, width, stride, t.matrix.data(), t.block, s());
        return;
    }
  }

  const GpuTransform* transform_of(const std::shared_ptr<const OnlineTransform>& t, const std::string& where) {
    if (!t) return nullptr;
    auto it = transforms.find(t.get());
    if (it != transforms.end()) return it->second.second.get();
    if (t->block() > kc::kMaxTransformBlock) {
      throw UnsupportedError(fmt::format("{}: online transform of block {}: the GPU transform kernels take blocks up "
                                         "to {}; run this checkpoint with --device cpu",
                                         where, t->block(), kc::kMaxTransformBlock));
    }
    auto g = std::make_unique<GpuTransform>();
    // No structured GPU kernel yet: a KroneckerHadamard transform uploads its dense matrix.
    g->kernel = t->kernel() == TransformKernel::Fwht ? TransformKernel::Fwht : TransformKernel::Dense;
    g->block = t->block();
    if (g->kernel == TransformKernel::Dense) g->matrix = kc::DeviceBuffer<float>::from_host(std::span(t->matrix()));
    const GpuTransform* out = g.get();
    transforms.emplace(t.get(), std::make_pair(t, std::move(g)));
    return out;
  }

  void run_part(const GpuPart& p, const kc::bf16* in, int64_t m, float* out) {
    if (p.emulate_w4a4) {
      const void* before[] = {w4a4.activations.data(), w4a4.codes.data(), w4a4.scales.data(), w4a4.product.data(),
                              w4a4.workspace.data()};
      kc::linear_w4a4(p.weight, in, m, out, w4a4, stream);
      const void* after[] = {w4a4.activations.data(), w4a4.codes.data(), w4a4.scales.data(), w4a4.product.data(),
                             w4a4.workspace.data()};
      if (!std::equal(std::begin(before), std::end(before), std::begin(after))) ++generation;  // scratch regrown
    } else {
      kc::linear(p.weight, in, m, out, stream);
    }
  }
};

CudaBackend::CudaBackend(int ordinal, model::RouterMath host_router_math) : router_math_(host_router_math) {
  if (router_math_.softmax_rows == nullptr || router_math_.top_k == nullptr) {
    throw UsageError("CudaBackend: no host router math (softmax / top-k) given");
  }
  if (!kc::cuda_device(ordinal)) {
    throw UsageError(fmt::format("--device cuda: no CUDA GPU with ordinal {} is usable (no driver, no device, or a "
                                 "runtime error); use --device cpu",
                                 ordinal));
  }
  FP4SERVE_CUDA_CHECK(cudaSetDevice(ordinal));
  impl_ = std::make_unique<Impl>();
  impl_->ordinal = ordinal;
  impl_->multiprocessors = kc::cuda_device(ordinal)->multiprocessors;
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
    const bool mxfp4_w4a4 = part.activation_quant == model::ActivationEmulation::EmulateMxfp4;
    try {
      g.weight = kc::upload_linear(part.weight, im.stream, mxfp4_w4a4);
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(fmt::format("{}: op linear is not on the GPU: {}; run this checkpoint with --device cpu",
                                         where, e.what()));
    }
    g.out = part.weight.out_features();
    g.emulate_w4a4 = mxfp4_w4a4 || part.activation_quant == model::ActivationEmulation::EmulateNvfp4;
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

std::unique_ptr<BackendRope> CudaBackend::upload_rope(RopeCache rope) {
  auto r = std::make_unique<CudaRope>();
  r->max_positions = rope.max_positions();
  r->rotary_dim = rope.rotary_dim();
  const auto table = static_cast<size_t>(rope.max_positions() * (rope.rotary_dim() / 2));
  r->cos = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.cos(0), table));
  r->sin = kc::DeviceBuffer<float>::from_host(std::span<const float>(rope.sin(0), table));
  impl_->rope_limit = std::min(impl_->rope_limit, r->max_positions);
  return r;
}

void CudaBackend::check_attention(const AttentionOp& op, const std::string& layer) const {
  if (op.head_dim > kc::kMaxAttentionHeadDim) {
    throw UnsupportedError(fmt::format("{}: op attention is not on the GPU for head_dim {} (the kernel takes up to {}); "
                                       "use --device cpu",
                                       layer, op.head_dim, kc::kMaxAttentionHeadDim));
  }
}

KvCache CudaBackend::make_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                const KvCacheSpec& spec) const {
  // Sizes and windows checked before any device memory is taken.
  const KvCacheSpec rs = model::resolved_spec(spec, num_layers);
  auto storage = std::make_unique<CudaKvStorage>();
  storage->owner = this;
  storage->id = next_storage_id.fetch_add(1);
  storage->layers = model::kv_group_layout(num_layers, rs).layers_per_block;
  storage->seq = rs.max_seq_len;
  storage->row = num_kv_heads * head_dim;
  storage->block_size = rs.block_size;
  storage->scratch_block = static_cast<int32_t>(rs.num_blocks);
  // num_blocks + 1 blocks: the last is the padding rows' scratch block.
  const auto n = static_cast<size_t>((rs.num_blocks + 1) * storage->layers * rs.block_size *
                                     std::max<int64_t>(storage->row, 0));
  storage->keys = kc::DeviceBuffer<float>(n);
  storage->values = kc::DeviceBuffer<float>(n);
  return KvCache(num_layers, num_kv_heads, head_dim, rs, std::move(storage));
}

void CudaBackend::begin_step(const FlatBatch& flat, KvCache& cache) {
  auto* storage = dynamic_cast<CudaKvStorage*>(cache.storage());
  if (storage == nullptr || storage->owner != this) {
    throw UsageError("CudaBackend: the KV cache was not made by this backend's make_cache");
  }
  Impl& im = *impl_;
  const int64_t max_position =
      flat.positions.empty() ? -1 : *std::max_element(flat.positions.begin(), flat.positions.end());
  if (max_position >= im.rope_limit) {  // checked here, not in rope(): a replayed step calls no op
    throw UsageError(fmt::format("CudaBackend: position {} is outside the RoPE table's [0, {}) "
                                 "(max_position_embeddings)",
                                 max_position, im.rope_limit));
  }
  im.flat = &flat;
  im.storage = storage;
  im.cache = &cache;
  im.max_position = max_position;
  im.run_rows =
      im.graphs_enabled ? padded_step_rows(flat, im.graphs.buckets()) : static_cast<int64_t>(flat.ids.size());
  const int64_t table_width = model::kv_blocks_for(cache.max_seq_len(), cache.block_size());
  im.layout = step_arrays_layout(im.run_rows, table_width, cache.num_groups());
  // Sized for the largest bucket at once, so that the buffer stays put while the batch size moves between
  // buckets (a move drops every graph).
  const size_t capacity = std::max(
      im.layout.bytes, step_arrays_layout(im.graphs.buckets().back(), table_width, cache.num_groups()).bytes);
  im.grow(im.step_arrays, static_cast<int64_t>(capacity / sizeof(int64_t)));
  im.staging_copied.wait();
  const std::span<std::byte> host = im.staging.get(im.layout.bytes);
  pack_step_arrays(flat, cache, im.run_rows, storage->scratch_block, host);
  if (im.layout.bytes > 0) {
    FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(im.step_arrays.data(), host.data(), im.layout.bytes, cudaMemcpyHostToDevice,
                                        im.s()));
  }
  im.staging_copied.record(im.s());
}

int64_t CudaBackend::step_rows() const {
  (void)step();
  return impl_->run_rows;
}

void CudaBackend::decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out) {
  Impl& im = *impl_;
  if (!step().decode) throw UsageError("CudaBackend::decode_attention: the step is not a decode step");
  CudaKvStorage& c = *im.storage;
  const float* sinks = op.sinks == nullptr ? nullptr : as<CudaVector>(*op.sinks, "sinks").values.data();
  const kc::AttentionShape shape{op.num_heads, op.num_kv_heads, op.head_dim, op.scale, op.sliding_window, sinks};
  // Planned for the cache length, not this step's longest sequence: a captured step keeps its split count while
  // the sequences grow (short ranges of a long split plan are empty blocks that return at once).
  const int64_t splits = kc::plan_kv_splits(im.run_rows, op.num_heads, c.seq, im.multiprocessors);
  const int64_t floats = kc::attention_decode_workspace_floats(im.run_rows, op.num_heads, op.head_dim, splits);
  float* workspace = im.grow(im.attention_workspace, floats);
  const int64_t layer_offset = im.cache->row_of_layer(layer) * c.block_size * c.row;
  kc::DecodeAttentionBatch batch{q,     c.keys.data() + layer_offset, c.values.data() + layer_offset,
                                 c.row, nullptr,         im.seq_len(), im.run_rows, c.seq};
  batch.block_tables = im.block_tables(im.cache->group_of_layer(layer));
  batch.table_width = im.layout.table_width;
  batch.block_size = c.block_size;
  batch.block_stride = c.layers * c.block_size;
  kc::attention_decode(batch, shape, splits, workspace, floats, out, im.s());
}

void CudaBackend::run_decode(const std::function<void()>& work) {
  Impl& im = *impl_;
  const FlatBatch& flat = step();
  if (!flat.capturable || !im.graphs_enabled || im.graphs.bucket_for(im.run_rows) != im.run_rows) {
    ++im.stats.eager;
    work();
    return;
  }
  if (im.generation != im.graph_generation || im.storage->id != im.graph_storage ||
      im.graph_thread != std::this_thread::get_id()) {
    if (im.graphs.graphs() > 0) ++im.stats.resets;
    im.graphs.reset();
    im.graph_generation = im.generation;
    im.graph_storage = im.storage->id;
    im.graph_thread = std::this_thread::get_id();
  }
  const uint64_t before = im.generation;
  const kc::StepGraphs::Ran ran = im.graphs.run(im.run_rows, im.s(), [&](int64_t rows, cudaStream_t /*stream*/) {
    if (rows != im.run_rows) {
      throw UsageError(fmt::format("CudaBackend: graph bucket {} for a step of {} rows", rows, im.run_rows));
    }
    work();
  });
  if (im.generation != before) {
    // The warm-up run grew a buffer: the graph just captured reads the new one, the others the old one.
    if (im.graphs.graphs() > 1) ++im.stats.resets;
    im.graphs.reset_except(im.run_rows);
    im.graph_generation = im.generation;
  }
  switch (ran) {
    case kc::StepGraphs::Ran::Eager: ++im.stats.eager; break;
    case kc::StepGraphs::Ran::Captured: ++im.stats.captures; break;
    case kc::StepGraphs::Ran::Replayed: ++im.stats.replays; break;
  }
  im.stats.capture_error = im.graphs.capture_error();
}

CudaBackend::GraphStats CudaBackend::graph_stats() const {
  GraphStats out = impl_->stats;
  out.graphs = static_cast<int64_t>(impl_->graphs.graphs());
  return out;
}

void CudaBackend::set_graphs(bool enabled) {
  impl_->graphs_enabled = enabled;
  if (!enabled) impl_->graphs.reset();
}

void CudaBackend::end_step() {
  impl_->flat = nullptr;
  impl_->storage = nullptr;
  impl_->cache = nullptr;
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
  (void)step();
  kc::embedding_gather(e.table(), e.type, e.vocab, e.dim, impl_->ids(), impl_->run_rows, scale, out, impl_->s());
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
  (void)step();
  if (impl_->max_position >= r.max_positions) {
    throw UsageError(fmt::format("CudaBackend: position {} is outside the RoPE table's [0, {}) "
                                 "(max_position_embeddings)",
                                 impl_->max_position, r.max_positions));
  }
  kc::apply_rope_neox(x, impl_->run_rows, heads, head_dim, r.rotary_dim, impl_->positions(), r.cos.data(),
                      r.sin.data(), impl_->s());
}

void CudaBackend::transform(const BackendTransform& t, float* x, int64_t rows, int64_t dim) {
  impl_->apply(*as<CudaTransformHandle>(t, "a transform").transform, x, rows, dim, dim);
}

void CudaBackend::write_kv(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) {
  Impl& im = *impl_;
  (void)step();
  CudaKvStorage& c = *im.storage;
  // The layer at row j of its group's block b starts at row (b · layers + j) · block_size; the group's cache_rows
  // hold b · layers · block_size + offset.
  const int64_t j = im.cache->row_of_layer(layer);
  const int64_t* rows = im.cache_rows(im.cache->group_of_layer(layer));
  float* k_layer = c.keys.data() + j * c.block_size * c.row;
  float* v_layer = c.values.data() + j * c.block_size * c.row;
  kc::copy_rows(k, k_stride, nullptr, k_layer, c.row, rows, im.run_rows, c.row, im.s());
  kc::copy_rows(v, v_stride, nullptr, v_layer, c.row, rows, im.run_rows, c.row, im.s());
}

void CudaBackend::attention(int64_t layer, int slot, const float* q, int64_t t, int64_t start_pos, const AttentionOp& op,
                            float* out) {
  Impl& im = *impl_;
  (void)step();
  CudaKvStorage& c = *im.storage;
  const float* sinks = op.sinks == nullptr ? nullptr : as<CudaVector>(*op.sinks, "sinks").values.data();
  const kc::AttentionShape shape{op.num_heads, op.num_kv_heads, op.head_dim, op.scale, op.sliding_window, sinks};
  const std::span<const int32_t> table = im.cache->block_table(slot, im.cache->group_of_layer(layer));
  const int32_t* table_dev = im.upload(im.attention_table, table);
  const int64_t base = im.cache->row_of_layer(layer) * c.block_size * c.row;
  kc::attention(q, t, start_pos, c.keys.data() + base, c.values.data() + base, c.row, shape, out, im.s(),
                kc::PagedRows{table_dev, c.block_size, c.layers * c.block_size});
}

void CudaBackend::activation(ExpertActivation kind, float alpha, float limit, const float* x, int64_t m, int64_t inter,
                             float* y) {
  const cudaStream_t s = impl_->s();
  switch (kind) {
    case ExpertActivation::SiluGated: kc::silu_and_mul(x, m, inter, y, s); return;
    case ExpertActivation::SwigluOai: kc::swiglu_oai_and_mul(x, m, inter, alpha, limit, y, s); return;
  }
}

void CudaBackend::add_scaled(float* x, const float* delta, float alpha, int64_t n) {
  kc::add_scaled(x, delta, alpha, n, impl_->s());
}

void CudaBackend::fill(float* x, int64_t n, float value) { kc::fill(x, n, value, impl_->s()); }

void CudaBackend::route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts, float* weights) {
  std::vector<float> host(static_cast<size_t>(m * settings.num_experts));
  to_host(logits, static_cast<int64_t>(host.size()), host.data());
  model::route(settings, host.data(), m, experts, weights, router_math_);
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

void CudaBackend::all_reduce_sum(dist::Communicator& comm, float* x, int64_t n) {
  if (n <= 0) return;
  // The communicator's collectives block until done; the stream's work on x must be finished first.
  impl_->stream.sync();
  if (comm.device_memory()) {
    comm.all_reduce_sum(x, static_cast<size_t>(n));
    return;
  }
  std::vector<float> host(static_cast<size_t>(n));
  to_host(x, n, host.data());
  comm.all_reduce_sum(host.data(), host.size());
  FP4SERVE_CUDA_CHECK(cudaMemcpyAsync(x, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, impl_->s()));
  impl_->stream.sync();
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


Backend::MemoryUse CudaBackend::memory_use() const {
  size_t free_bytes = 0, total_bytes = 0;
  FP4SERVE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(total_bytes), static_cast<int64_t>(total_bytes - free_bytes)};
}
}  // namespace fp4serve::backends::cuda
