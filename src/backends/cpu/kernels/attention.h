// SPDX-License-Identifier: Apache-2.0
// Causal scaled-dot-product attention of one sequence over its KV cache (fp32, bf16 or fp16 rows), on CPU
// (cpu/attention.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace fp4serve::kernels {

/// Element type of KV cache rows. Attention widens 16-bit rows to fp32 as it reads them and computes in fp32, so a
/// 16-bit cache differs from an fp32 one only by the rounding of the stored keys and values (to nearest even).
/// Bf16 keeps fp32's range with 8 significant bits; F16 has 11 bits but overflows to ±inf above 65504 (the
/// writer saturates nothing: write_kv_row).
enum class KvElement : uint8_t { F32, Bf16, F16 };

/// Bytes per element: 4, 2, 2.
int64_t kv_element_bytes(KvElement element);
/// "fp32", "bf16", "fp16" (the --kv-cache-dtype spelling).
std::string_view kv_element_name(KvElement element);

/// One layer's keys and values of one sequence: the D elements of KV head h at position p start at
/// `keys` + p · row_stride + h · head_stride elements, likewise `values`. Rows of all heads together
/// ([position][KVH · D]: row_stride ≥ KVH · D, head_stride = D) or each head's positions together
/// ([KVH][positions][D]: row_stride = D, head_stride ≥ positions · D).
/// Paged (block_table not null, model::KvCache's layout): position p lives in block block_table[p / block_size]
/// at row p % block_size, so KV head h at position p starts at `keys` + block_table[p / block_size] · block_stride
/// + (p % block_size) · row_stride + h · head_stride elements; within a block the positions are laid out as
/// above with block_size positions ([KVH][block_size][D] on the CPU). Entries for positions a call does not read
/// (before a sliding window) may be negative.
struct KvRows {
  const void* keys;
  const void* values;
  int64_t row_stride;   ///< elements between consecutive positions of one head
  int64_t head_stride;  ///< elements between consecutive KV heads at one position
  KvElement element = KvElement::F32;
  const int32_t* block_table = nullptr;  ///< [block_table_size] block indices, or nullptr: contiguous positions
  int64_t block_table_size = 0;
  int64_t block_size = 0;    ///< positions per block (paged)
  int64_t block_stride = 0;  ///< elements between consecutive blocks (paged)
};

/// dst[0..n) = src[0..n) converted to `element` (fp32: copied; bf16 / fp16: rounded to nearest even, fp16
/// overflowing to ±inf like a C cast). dst holds n elements of that type.
void write_kv_row(const float* src, int64_t n, KvElement element, void* dst);

/// Shapes and options of one attention call.
struct AttentionParams {
  int64_t num_heads;     ///< H query heads
  int64_t num_kv_heads;  ///< KVH; divides H. Query head h reads KV head h / (H / KVH) (GQA; HF repeat_kv order)
  int64_t head_dim;      ///< D
  float scale;           ///< multiplies q·k before the softmax, usually 1/√D
  /// 0 = full causal attention. Otherwise each query attends only to the last W positions including its own:
  /// keys at positions p with q_pos − W < p ≤ q_pos. This is transformers' `sliding_window` mask
  /// (masking_utils sliding_window_overlay, used by Mistral, Qwen2 and GPT-OSS sliding layers) and the mask of
  /// the original GPT-OSS reference (tril with diagonal −W): W keys in all.
  int64_t sliding_window = 0;
  /// nullptr, or [H] GPT-OSS attention sinks: one extra logit per head that joins the softmax max and
  /// denominator but contributes no value (HF GptOss eager_attention_forward).
  const float* sinks = nullptr;
  /// Allows a blocked prefill (below) to run both products on bf16 dot products, as GPU flash attention runs a bf16
  /// model: q and the softmax weights P rounded to bf16 (nearest even) at the products' inputs, the cache's keys
  /// and values as stored, each pair of products summed in fp32 (vdpbf16ps); scores, softmax and output stay
  /// fp32. Taken only where prefill_attention_uses_bf16() says so. The CPU backend sets it under the bf16
  /// activation precisions (prepare::ActivationPrecision Bf16, Bf16DecodeInt8), whose linears round x to bf16 too.
  bool bf16_dot_products = false;
};

/// out[i, h, :] = Σ_p softmax_p(scale · q[i, h, :] · k[p, kvh, :]) · v[p, kvh, :] over the causal (and
/// windowed) positions p ≤ start_pos + i, with fp32 scores and a max-subtracted softmax.
/// q: [t, H, D] f32, row i at position start_pos + i. cache: rows 0 … start_pos + t − 1 must be filled
/// (including this call's own keys/values). out: [t, H, D] f32, must not alias q or the caches.
/// A call of t ≥ kMinBlockedPrefillRows rows whose keys are not split (below) runs blocked: a block of rows × the
/// heads of one KV head is a matrix, and S = Q·Kᵀ, O = P·V run on the panel GEMM's micro-kernel over tiles of keys
/// with an online softmax (flash attention's rescaled running max and sum), so its scratch is one tile of scores
/// per thread whatever the prompt's length (cpu/attention_prefill.cpp). Otherwise work runs in parallel over (query row, KV head) with OpenMP; each item
/// reads each key/value row once for all H/KVH query heads that share it. When there are fewer such items than
/// twice the threads (a decode step with few KV heads), each item's keys are split into attention_key_splits()
/// ranges whose partial softmax sums are merged afterwards (flash-decoding), so that every thread has keys to read.
/// In batch-invariant mode (batch_invariant.h) every call runs row by row with no key split, so a row's output does
/// not depend on the call's other rows or the threads.
/// 16-bit rows are widened a few keys at a time into an fp32 scratch that stays in L1 (decode), or once per call
/// per KV head (blocked prefill), so every path runs the fp32 arithmetic on the rounded values; the one exception is
/// a blocked prefill with bf16_dot_products where prefill_attention_uses_bf16() (below).
/// A paged cache is read run by run (the positions of one block), as the same arithmetic in the same order per run.
/// Throws UsageError on null pointers or inconsistent sizes (a block table that does not cover the positions read,
/// or names a negative block among them).
void attention(const float* q, int64_t t, int64_t start_pos, const KvRows& cache, const AttentionParams& params,
               float* out);
/// The same over an fp32 cache of [position][KVH · D] rows, cache_row_stride floats apart.
void attention(const float* q, int64_t t, int64_t start_pos, const float* k_cache, const float* v_cache,
               int64_t cache_row_stride, const AttentionParams& params, float* out);

/// Whether attention() runs a blocked prefill (t ≥ kMinBlockedPrefillRows, keys not split) over a cache of
/// `element` with `params` on bf16 dot products here: params.bf16_dot_products, a bf16 cache (fp32 and fp16 rows
/// would be rounded), head_dim a multiple of the panel width (32 floats on AVX-512), the dispatched target has the
/// bf16 micro-kernel (AVX-512, GCC), the CPU has AVX512-BF16 and bf16 dot products are allowed
/// (set_bf16_dot_allowed, linear.h), and not batch-invariant mode. Decode rows and other calls run fp32 products.
bool prefill_attention_uses_bf16(KvElement element, const AttentionParams& params);

/// One row of a batched decode step: a sequence's query at position `pos` over that sequence's own keys.
struct DecodeQuery {
  const float* q;  ///< [H, D] f32
  int64_t pos;     ///< the query's position; keys pos − W + 1 … pos (W: sliding_window, else 0 … pos) are read
  KvRows cache;    ///< the sequence's rows, its own keys/values at `pos` included
  float* out;      ///< [H, D] f32, must not alias any q or cache
};

/// attention() with t = 1 for every row of `rows` (different sequences, positions and block tables) in one
/// parallel region: the work items are (row, KV head) over all rows at once, so a decode step of many sequences
/// costs one fork/join per layer instead of one per sequence, and the threads share out the sequences' keys. When
/// there are fewer items than twice the threads, each item's keys are split into attention_key_splits(rows,
/// KV heads, the most keys a row reads, threads) ranges as in attention(). A row's output is bit for bit that of
/// attention(q, 1, pos, cache, params, out) whenever both split its keys alike (always in batch-invariant mode,
/// where neither splits), and equal to it up to fp32 rounding otherwise. Throws UsageError as attention() per row.
void decode_attention(std::span<const DecodeQuery> rows, const AttentionParams& params);

/// Rows of a call from which attention() runs blocked (unless its keys are split across threads). Packing the
/// keys costs about one row's attention: bench_ops BM_Attention, 9 heads / 3 KV heads / D 64 after 2000 keys, one
/// thread, AVX-512: t = 2 / 4 / 8 row by row 294 / 502 / 1633 µs, blocked 217 / 279 / 402 µs.
inline constexpr int64_t kMinBlockedPrefillRows = 2;

/// Keys per range below which attention() does not split an item's keys further (a range's fixed cost, one
/// partial output of [H/KVH, D] to merge, outweighs reading fewer keys).
inline constexpr int64_t kMinKeysPerSplit = 64;

/// Ranges each (query row, KV head) item's `keys` are split into for `threads` threads: 1 when t·KVH ≥
/// 2·threads, else enough ranges for 2·threads work units, each of ≥ kMinKeysPerSplit keys.
int64_t attention_key_splits(int64_t t, int64_t kv_heads, int64_t keys, int64_t threads);

}  // namespace fp4serve::kernels
