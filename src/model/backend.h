// SPDX-License-Identifier: Apache-2.0
// The ops a decoder step is written in, implemented once per device in that device's wing of src/backends/
// (backends::cpu::CpuBackend in backends/cpu, backends::cuda::CudaBackend in backends/cuda; backends/registry.h makes
// them). model::Decoder and the MoE block (decoder.h, moe.h) are written against this interface only, so every
// architecture runs on every backend; an op a backend does not have throws UnsupportedError naming the op and the
// layer, at load time where it can. Nothing in src/model names a device's kernels.
//
// Memory: activations are fp32 arrays in the backend's memory (host memory for the CPU, device memory for CUDA),
// addressed by plain `float*` that the caller may offset but never dereference; they come from workspace(). Token
// indices (ids, positions, cache rows) live on the host in the step's FlatBatch (begin_step), and small index
// lists (MoE routing) are passed as host spans, so the backend uploads what it needs. Weights are uploaded once at
// load into opaque handles that only the backend that made them reads. A backend holds one step's state: one
// backend serves one decoder on one thread.
//
// Shapes: m (or "tokens") = rows of the step's flattened batch; H = hidden size; D = head_dim; N / K = a
// linear's out / in features. All arrays are row-major; a `stride` is in floats.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor_view.h"
#include "dist/communicator.h"
#include "model/forward_model.h"
#include "model/kv_cache.h"
#include "model/linear_group.h"
#include "model/model_config.h"
#include "model/rope_table.h"
#include "model/router.h"

namespace fp4serve::model {

/// A linear group (linear_group.h) in a backend's layout: y[m, N] = concat over parts of
/// U(T(x) · Wᵀ + bias) with each part's online input (T) and output (U) transforms.
class BackendLinear {
 public:
  virtual ~BackendLinear() = default;
  std::vector<std::string> modules;  ///< checkpoint module names, for messages and observers
  int64_t in_features = 0;           ///< K
  int64_t out_features = 0;          ///< N (all parts)
};

/// A [size] fp32 vector (norm weights, attention sinks) in backend memory.
class BackendVector {
 public:
  virtual ~BackendVector() = default;
  int64_t size = 0;
};

/// The token embedding table [vocab, dim] (BF16 / F16 / F32 as stored).
class BackendEmbedding {
 public:
  virtual ~BackendEmbedding() = default;
  int64_t vocab = 0;
  int64_t dim = 0;
};

/// An online transform (online_transform.h) in backend memory: value ← value · M̂ per `block`-wide slice.
class BackendTransform {
 public:
  virtual ~BackendTransform() = default;
  int64_t block = 0;
};

/// The rotary cos/sin table of a RopeCache (rope_table.h) in backend memory.
class BackendRope {
 public:
  virtual ~BackendRope() = default;
  int64_t max_positions = 0;
};

/// The host-side bookkeeping of one forward step: the batch flattened into token ids, positions, each token's
/// KV-cache slot and rows, and the token rows whose logits are returned, in output order.
struct FlatBatch {
  std::vector<int32_t> ids;
  std::vector<int64_t> positions;
  std::vector<int> slots;
  /// [groups][rows] (KvCache::num_groups()): token r's row in the first layer of group g's blocks,
  /// cache_rows[g · rows + r] = block · layers_per_block · block_size + position % block_size, block = the slot's
  /// group-g table entry position / block_size; a layer at row j of its group (KvCache::row_of_layer) adds
  /// j · block_size.
  std::vector<int64_t> cache_rows;
  std::vector<int64_t> logit_rows;
  /// Every chunk is one token (a decode step): row r is chunk r, logit_rows = 0 … rows − 1, and the decoder
  /// runs attention as Backend::decode_attention and the whole step through Backend::run_decode.
  bool decode = false;
  /// Set by the decoder on a decode step whose work depends on nothing but device memory (no MoE routing on
  /// the host, no observer): the backend may then pad it (step_rows) and capture it (run_decode).
  bool capturable = false;
};

/// Validates `batch` once for every backend, gives each chunk's slot the blocks its positions need
/// (KvCache::prepare) and flattens it. Throws UsageError for an empty chunk, a chunk beyond the cache length (or
/// with a negative start), a slot given twice or not in use, a token id outside [0, vocab), and a pool without
/// the blocks the step needs.
FlatBatch flatten_batch(std::span<const SequenceChunk> batch, KvCache& cache, int64_t vocab);

/// Options of one attention call (causal GQA with an optional sliding window and sinks).
struct AttentionOp {
  int64_t num_heads = 0;     ///< H_q
  int64_t num_kv_heads = 0;  ///< divides H_q (GQA: head h reads KV head h / (H_q / H_kv))
  int64_t head_dim = 0;      ///< D
  float scale = 0.0f;        ///< multiplies q·k
  int64_t sliding_window = 0;             ///< 0 = full causal, else the last W positions including its own
  const BackendVector* sinks = nullptr;   ///< [H_q] GPT-OSS sinks, or nullptr
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu" or "cuda:<ordinal>", for messages.
  virtual std::string name() const = 0;
  /// True when this backend's arrays are host memory, so that a caller may hand it host buffers directly (the
  /// decoder writes the logits into its result without a copy).
  virtual bool host_memory() const = 0;
  /// The memory of the device this backend computes on, in bytes: `total` (RAM for the CPU, the GPU's memory for
  /// a GPU) and `used` (what this process holds there now: its resident set on the CPU; the GPU's total − free,
  /// as cudaMemGetInfo reports it, on a GPU). For a KV budget given as a fraction of the device's memory
  /// (--gpu-memory-utilization). Zeros where the system does not report them.
  struct MemoryUse {
    int64_t total = 0;
    int64_t used = 0;
  };
  virtual MemoryUse memory_use() const = 0;

  // ---- load time ------------------------------------------------------------------------------------------
  /// Uploads a prepared linear group (all parts, biases, online input/output transforms). Throws
  /// UnsupportedError naming the op and `group.modules()` when this backend has no kernel for a part's layout,
  /// activation quantization or transform.
  virtual std::unique_ptr<BackendLinear> upload_linear(LinearGroup group) = 0;
  /// Uploads a [n] fp32 vector.
  virtual std::unique_ptr<BackendVector> upload_vector(std::vector<float> values) = 0;
  /// Uploads (or, on the CPU, keeps a view of) the embedding table [vocab, dim]; `name` is the tensor's name
  /// for messages. Throws FormatError for a dtype other than BF16 / F16 / F32.
  virtual std::unique_ptr<BackendEmbedding> upload_embedding(const core::TensorView& table, const std::string& name) = 0;
  /// Uploads an online transform used outside a linear (q_attn / k_cache). `where` names the module.
  virtual std::unique_ptr<BackendTransform> upload_transform(std::shared_ptr<const OnlineTransform> transform,
                                                             const std::string& where) = 0;
  /// Uploads the RoPE table (every scaling kind is computed by the host RopeCache).
  virtual std::unique_ptr<BackendRope> upload_rope(RopeCache rope) = 0;
  /// Throws UnsupportedError naming `layer` when this backend's attention cannot run `op`'s shape (head_dim).
  virtual void check_attention(const AttentionOp& op, const std::string& layer) const = 0;
  /// A KV cache with `spec`'s block pool, its keys and values in this backend's memory (the CPU: host memory in
  /// the backend's element; the GPU: its own fp32 layout). Throws UsageError on bad sizes, DeviceError when it
  /// does not fit.
  virtual KvCache make_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                             const KvCacheSpec& spec) const = 0;

  // ---- per step -------------------------------------------------------------------------------------------
  /// Starts a step over `flat` (kept by reference until end_step) and checks that `cache` was made by this
  /// backend's make_cache (UsageError otherwise).
  virtual void begin_step(const FlatBatch& flat, KvCache& cache) = 0;
  /// Waits for the step's work (a no-op on the CPU).
  virtual void end_step() = 0;
  /// Scratch array number `slot` of at least `floats` floats in backend memory; contents undefined. The pointer
  /// stays valid until the next call with the same slot that asks for more.
  virtual float* workspace(int slot, int64_t floats) = 0;

  /// out[t, :] = scale · table[ids[t], :] for the step's tokens. out: [tokens, dim].
  virtual void embed(const BackendEmbedding& table, float scale, float* out) = 0;
  /// out = weight · x · rsqrt(mean(x²) + eps) per row (HF LlamaRMSNorm). x, out: [rows, dim] (may alias);
  /// weight: [dim].
  virtual void rms_norm(const float* x, const BackendVector& weight, int64_t rows, int64_t dim, float eps,
                        float* out) = 0;
  /// y[m, N] = the group on x[m, K] (see BackendLinear). x is not modified.
  virtual void linear(const BackendLinear& w, const float* x, int64_t m, float* y) = 0;
  /// dst[r, 0:width] = src[r, 0:width] for r < rows (strided row copy: q and k out of q|k|v).
  virtual void copy_columns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                            int64_t width) = 0;
  /// In-place NeoX RoPE of x [tokens, heads, D] at the step's positions.
  virtual void rope(const BackendRope& rope, float* x, int64_t heads, int64_t head_dim) = 0;
  /// In-place online transform of x [rows, dim] (block divides dim).
  virtual void transform(const BackendTransform& t, float* x, int64_t rows, int64_t dim) = 0;
  /// Writes the step's keys k[t, kv_width] and values v[t, kv_width] (row strides k_stride, v_stride) at each
  /// token's slot and position in `layer` of the step's cache.
  virtual void write_kv(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) = 0;
  /// Causal attention of one sequence's t query rows q[t, H_q, D] at positions start_pos … over `slot`'s keys and
  /// values of `layer` (positions 0 … start_pos + t − 1 written, read through the slot's block table), scores in
  /// fp32 with a max-subtracted softmax.
  /// out: [t, H_q, D].
  virtual void attention(int64_t layer, int slot, const float* q, int64_t t, int64_t start_pos, const AttentionOp& op,
                         float* out) = 0;
  /// The expert / MLP activation of x [m, 2I] (gate | up halves per row) into y [m, I]: silu(g)·u or GPT-OSS
  /// swiglu (alpha, limit) (ExpertActivation, model_config.h).
  virtual void activation(ExpertActivation kind, float alpha, float limit, const float* x, int64_t m, int64_t inter,
                          float* y) = 0;
  /// x[i] += alpha · delta[i], i < n (the residual add).
  virtual void add_scaled(float* x, const float* delta, float alpha, int64_t n) = 0;
  /// x[i] = value, i < n.
  virtual void fill(float* x, int64_t n, float value) = 0;
  /// Routes m tokens from router logits [m, E] in backend memory to experts [m, k] int32 and weights [m, k] fp32
  /// on the host (router.h: model::route's order of operations, with the backend's RouterMath).
  virtual void route(const RouterSettings& settings, const float* logits, int64_t m, int32_t* experts,
                     float* weights) = 0;
  /// dst[r, :] = src[rows[r], :] for r < rows.size(); src, dst: `width` floats per row; rows on the host.
  virtual void gather_rows(const float* src, int64_t width, std::span<const int64_t> rows, float* dst) = 0;
  /// out[rows[r], :] += y[r, :] · weights[r] for r < rows.size(), in r order (rows distinct); rows, weights on
  /// the host. The MoE combine, expert by expert (transformers' index_add_ order).
  virtual void scatter_add_rows(const float* y, int64_t width, std::span<const int64_t> rows,
                                std::span<const float> weights, float* out) = 0;
  /// out[t, :] += sigmoid(gate[t]) · y[t, :] for t < m (Qwen2-MoE shared expert). gate: [m]; y, out: [m, width].
  virtual void add_sigmoid_gated(const float* y, const float* gate, int64_t m, int64_t width, float* out) = 0;
  /// Tensor parallelism: x[0:n] ← Σ over the ranks of `comm` of x[0:n] (fp32), after this backend's queued work
  /// on x; every rank calls it with the same n. Device memory goes to a device communicator (NCCL) directly and
  /// through a host copy to a host one (MPI). Throws what the communicator throws.
  virtual void all_reduce_sum(dist::Communicator& comm, float* x, int64_t n) = 0;
  /// host[0:n] = x[0:n].
  virtual void to_host(const float* x, int64_t n, float* host) = 0;
  /// x[0:n] readable on the host: x itself on a host backend, else a copy in `copy`.
  virtual const float* host_view(const float* x, int64_t n, std::vector<float>& copy) = 0;
  /// The step's FlatBatch (valid between begin_step and end_step).
  virtual const FlatBatch& step() const = 0;

  // ---- decode steps (FlatBatch::decode) ---------------------------------------------------------------------
  /// Rows the step's ops run on (every m / tokens / rows argument of the step): the batch's rows, or more on a
  /// capturable decode step that the backend pads to a batch-size bucket. Rows past the batch's are padding:
  /// valid work on scratch cache rows whose results the caller ignores. Default: the batch's rows.
  virtual int64_t step_rows() const { return static_cast<int64_t>(step().ids.size()); }
  /// Attention of a decode step: query row r < step_rows() (q [rows, H_q, D]) at its position over its slot's
  /// keys of `layer` (written by write_kv first), as attention() with t = 1. out: [rows, H_q, D]. The default
  /// calls attention() row by row; the CUDA backend splits each row's keys over several blocks.
  virtual void decode_attention(int64_t layer, const float* q, const AttentionOp& op, float* out);
  /// Runs `work`, the decode step's whole device work (embedding to logits, written to workspace() arrays
  /// unless host_memory()). A backend may instead replay what `work` queued on an earlier call with the same
  /// step_rows() (a CUDA graph), when the step is capturable: so `work` must queue the same ops on the same
  /// workspace addresses each time, reading what changes between steps only through the step's ops. The
  /// default calls `work`.
  virtual void run_decode(const std::function<void()>& work) { work(); }
};

}  // namespace fp4serve::model
