// SPDX-License-Identifier: Apache-2.0
// The paged key/value cache: the bookkeeping, the same for every backend, over keys and values that live in a
// backend's memory (KvStorage, made by Backend::make_cache). Positions are kept in blocks of block_size() from a
// shared pool (model/block_pool.h); each sequence ("slot") has a block table (its blocks in position order) that
// grows as the sequence does, so memory is taken by the tokens sequences hold rather than by whole
// max_seq_len slots. The CPU keeps fp32, bf16 or fp16 elements [layer][block][kv_head][block position][head_dim]
// in host memory (backends/cpu/cpu_kv_storage.h); the GPU fp32 [block][layer][block position][kv_heads · head_dim]
// rows in device memory. The element type is the device-neutral KvCacheDtype (--kv-cache-dtype).
//
// Automatic prefix caching (set_prefix_caching): every full block a step writes is registered under the chained
// key of its tokens (block_pool.h); match_prefix() on a fresh sequence takes the registered blocks of its longest
// cached prefix by reference, so the model computes only the rest. Shared blocks are never written: a match
// stops at least one token short of the prompt, and positions are only appended after it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "model/block_pool.h"

namespace fp4serve::model {

/// Element type of a KV cache (--kv-cache-dtype fp32 | bf16 | fp16). A 16-bit cache differs from an fp32 one only
/// by the rounding of the stored keys and values (to nearest even); attention computes in fp32. Bf16 keeps fp32's
/// range with 8 significant bits; F16 has 11 bits but overflows to ±inf above 65504.
enum class KvCacheDtype : uint8_t { F32, Bf16, F16 };

/// Bytes per element: 4, 2, 2.
int64_t kv_cache_dtype_bytes(KvCacheDtype dtype);
/// "fp32", "bf16", "fp16" (the --kv-cache-dtype spelling).
std::string_view kv_cache_dtype_name(KvCacheDtype dtype);

/// Positions per KV block (vLLM's default block size on GPUs).
inline constexpr int64_t kDefaultKvBlockSize = 16;

/// The sizes of a cache.
struct KvCacheSpec {
  int64_t max_seq_len = 0;  ///< positions one sequence may hold (the context length)
  int max_slots = 0;        ///< sequences held at once
  /// Blocks in the pool; 0: enough for max_slots sequences of max_seq_len positions each.
  int64_t num_blocks = 0;
  int64_t block_size = kDefaultKvBlockSize;
  /// > 0 when every layer attends only to the last `sliding_window` positions: blocks that fall wholly out of the
  /// window are returned to the pool as a sequence grows. 0 when any layer attends to all positions.
  int64_t sliding_window = 0;
};

/// Blocks of `block_size` positions needed for `positions` positions.
inline int64_t kv_blocks_for(int64_t positions, int64_t block_size) { return (positions + block_size - 1) / block_size; }
/// Bytes of keys and values one block takes for `layers` layers × `kv_heads` × `head_dim` of `element`s.
int64_t kv_block_bytes(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t block_size, KvCacheDtype element);

/// How a KV budget in bytes becomes blocks (what `explain` prints and `serve` allocates): blocks = ⌊budget /
/// bytes_per_block⌋, bytes_per_block = kv_block_bytes(layers, kv_heads, head_dim, block_size, element), tokens =
/// blocks · block_size (positions the pool holds across all sequences; every layer keeps its keys and values in
/// the same block).
struct KvMemoryPlan {
  int64_t budget_bytes = 0;
  int64_t block_size = 0;
  int64_t bytes_per_block = 0;
  int64_t blocks = 0;
  int64_t tokens = 0;
  /// Bytes the blocks take (blocks · bytes_per_block ≤ budget_bytes).
  int64_t pool_bytes() const { return blocks * bytes_per_block; }
};
/// Throws UsageError for a negative budget or non-positive sizes.
KvMemoryPlan kv_memory_plan(int64_t layers, int64_t kv_heads, int64_t head_dim, KvCacheDtype element,
                            int64_t budget_bytes, int64_t block_size = kDefaultKvBlockSize);

/// Keys and values kept by a backend; KvCache only owns it. The backend that made it recognises its own type
/// (ForwardModel::forward throws UsageError for a cache made by another backend).
class KvStorage {
 public:
  virtual ~KvStorage() = default;
};

class KvCache {
 public:
  /// A pool of `spec`'s blocks with the keys and values in `storage`, which holds `element`s. Throws UsageError
  /// on non-positive sizes or a null storage.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, const KvCacheSpec& spec,
          std::unique_ptr<KvStorage> storage, KvCacheDtype element = KvCacheDtype::F32);
  /// The bookkeeping alone: its storage is a plain KvStorage that holds nothing, so no backend runs a step on it
  /// (a fake model's cache, or a wrapper's).
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, const KvCacheSpec& spec,
          KvCacheDtype element = KvCacheDtype::F32);
  /// The same with spec {max_seq_len, max_slots} (a pool that holds every slot at full length).
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
          KvCacheDtype element = KvCacheDtype::F32);

  /// A free sequence slot (no blocks yet), or −1 when all are in use.
  int acquire();
  /// Takes `slot` itself and returns true, or false when it is already in use: a tensor-parallel rank mirrors
  /// the slots rank 0's scheduler chose. Throws UsageError outside [0, max_slots).
  bool acquire(int slot);
  /// Returns a slot and its blocks (last block first, so that a sequence's tail is evicted before its shared
  /// head). Throws UsageError for a slot not in use.
  void release(int slot);
  int free_slots() const;
  /// True when `slot` (any int) is a slot in use.
  bool in_use(int slot) const {
    return slot >= 0 && slot < max_slots() && slots_[static_cast<size_t>(slot)].in_use;
  }
  int max_slots() const { return static_cast<int>(slots_.size()); }
  int64_t max_seq_len() const { return spec_.max_seq_len; }
  int64_t num_kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  KvCacheDtype element() const { return element_; }
  int64_t num_layers() const { return layers_; }
  const KvCacheSpec& spec() const { return spec_; }
  int64_t block_size() const { return spec_.block_size; }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  /// Blocks no sequence references (including evictable cached ones).
  int64_t free_blocks() const { return pool_.free_blocks(); }

  /// `slot`'s block table: entry i holds positions [i·block_size, (i + 1)·block_size), kNoBlock where a sliding
  /// window released it.
  std::span<const int32_t> block_table(int slot) const;
  /// Positions whose keys and values `slot` holds (what steps have written; commit() advances it).
  int64_t num_tokens(int slot) const;
  /// The token ids at those positions (−1 where a step skipped positions).
  std::span<const int32_t> tokens(int slot) const { return slot_at(slot, "tokens").tokens; }

  /// Blocks `slot` still needs so that positions 0 … positions − 1 have one.
  int64_t blocks_needed(int slot, int64_t positions) const;
  /// Gives `slot` blocks for positions 0 … positions − 1 and returns true, or returns false and takes none when
  /// the pool has too few. Throws UsageError when positions > max_seq_len or the slot is not in use.
  bool reserve(int slot, int64_t positions);
  /// Before a step writes `count` positions of `slot` from `start_pos` on: reserves their blocks and, when the
  /// step rewrites positions the slot already holds (a perplexity window restarting at 0), takes the rewritten
  /// blocks out of the prefix cache. Throws UsageError when the pool runs dry ("out of KV-cache blocks"), when
  /// start_pos is past num_tokens(slot), or when a rewritten block is shared with another sequence.
  void prepare(int slot, int64_t start_pos, int64_t count);
  /// After a step wrote `tokens` at start_pos … of `slot`: records them, registers the blocks they filled in the
  /// prefix cache (when on), and releases blocks a sliding window left behind.
  void commit(int slot, int64_t start_pos, std::span<const int32_t> tokens);

  /// Automatic prefix caching (off by default).
  void set_prefix_caching(bool on);
  bool prefix_caching() const { return prefix_caching_; }
  /// On a slot that holds nothing yet: takes the cached blocks of the longest registered prefix of `tokens`,
  /// at most tokens.size() − 1 positions (the last token is always computed, for its logits), and returns the
  /// positions it covers (a multiple of block_size; 0 with prefix caching off). Counts tokens.size() prefix-cache
  /// queries and the returned positions as hits.
  int64_t match_prefix(int slot, std::span<const int32_t> tokens);
  /// Parallel sampling (n > 1): on a slot `dst` that holds nothing yet, shares the longest run of `src`'s full
  /// blocks whose tokens equal `tokens`' first positions, at most tokens.size() − 1 positions (the last token is
  /// always computed, for its logits), taking one more reference on each (no copy, no prefix cache needed: the
  /// blocks are never written again, since both sequences only append after them). Returns the positions shared
  /// (a multiple of block_size), 0 when not one block agrees, or when a sliding window already released a block
  /// that `dst`'s next position still reads. Throws UsageError when a slot is not in use, `dst` holds positions, or either is mirrored.
  int64_t fork(int src, int dst, std::span<const int32_t> tokens);
  /// Tokens queried and found by match_prefix since the cache was made (vLLM's prefix_cache_queries / _hits).
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }
  /// Forgets every cached prefix (blocks in use stay).
  void reset_prefix_cache() { pool_.reset_prefix_cache(); }

  /// Tensor parallelism: sets `slot`'s table (acquiring the slot if needed) to rank 0's, without this pool's
  /// reference counts: a mirror cache's tables are only ever assigned. Throws UsageError for a block outside the
  /// pool or a table longer than max_seq_len needs.
  void assign_table(int slot, std::span<const int32_t> table);

  /// The pool (for tests and metrics).
  const BlockPool& pool() const { return pool_; }

  /// The backend storage (never null).
  KvStorage* storage() const { return storage_.get(); }

 private:
  struct Slot {
    bool in_use = false;
    bool mirrored = false;          // table assigned by assign_table (holds no references)
    std::vector<int32_t> table;     // blocks in position order
    std::vector<int32_t> tokens;    // token ids at positions 0 … num_tokens − 1
    std::vector<PrefixKey> keys;    // prefix key after each full block considered for the cache
    int64_t released_below = 0;     // table entries before this one were released by a sliding window
  };
  Slot& slot_at(int slot, const char* what);
  const Slot& slot_at(int slot, const char* what) const;
  void drop_blocks(Slot& s);

  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  KvCacheDtype element_ = KvCacheDtype::F32;
  KvCacheSpec spec_;
  BlockPool pool_;
  std::vector<Slot> slots_;
  bool prefix_caching_ = false;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  std::unique_ptr<KvStorage> storage_;
};

/// `spec` with num_blocks filled in (0 → max_slots · ⌈max_seq_len / block_size⌉). Throws UsageError on
/// non-positive sizes.
KvCacheSpec resolved_spec(KvCacheSpec spec);

}  // namespace fp4serve::model
