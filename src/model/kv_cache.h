// SPDX-License-Identifier: Apache-2.0
// The paged key/value cache: the bookkeeping, the same for every backend, over keys and values that live in a
// backend's memory (KvStorage, made by Backend::make_cache). Positions are kept in blocks of block_size() from a
// shared pool (model/block_pool.h); each sequence ("slot") has a block table (its blocks in position order) that
// grows as the sequence does, so memory is taken by the tokens sequences hold rather than by whole
// max_seq_len slots. Layers of different attention windows keep blocks of their own (KvGroupLayout: one table per
// group, a sliding group's releasing what its window has passed). The CPU keeps fp32, bf16 or fp16 elements
// [layer row][block][kv_head][block position][head_dim] in host memory (backends/cpu/cpu_kv_storage.h); the GPU fp32
// [block][layer row][block position][kv_heads · head_dim] rows in device memory (a layer row: the layer's place in
// its group, row_of_layer). The element type is the device-neutral KvCacheDtype (--kv-cache-dtype).
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
  /// window are returned to the pool as a sequence grows. 0: every layer attends to all positions.
  int64_t sliding_window = 0;
  /// Per layer (num_layers entries), overriding sliding_window when not empty: 0 for a layer that attends to all
  /// positions, else its window. Layers of different windows keep their keys and values in blocks of their own
  /// (KvGroupLayout), so a sliding layer's blocks leave the pool's use as its window passes them.
  std::vector<int64_t> layer_windows = {};
};

/// How a model's layers share the KV blocks (vLLM's KV cache groups). Layers with the same window (0: all
/// positions) form a class; every class is cut, in layer order, into groups of layers_per_block layers (the
/// greatest common divisor of the class sizes, so every group is equally large and one pool of equal blocks
/// serves all of them); a block holds one group's layers for block_size positions, and a sequence has one block
/// table per group. A sliding group's table releases the blocks its window has passed. Group 0 is a group of the
/// widest window (0 counts as the widest): its blocks chain the prefix cache's keys (block_pool.h). One window for
/// every layer (dense Llama, Mistral): one group of all layers, the layout of a cache without groups. GPT-OSS
/// (alternating sliding and full layers, 12 of each in the 20B): two groups of 12 layers.
struct KvGroupLayout {
  int64_t layers_per_block = 0;
  std::vector<int64_t> group_window;    ///< [groups]: 0 for all positions, else the window
  std::vector<int32_t> group_of_layer;  ///< [layers]
  std::vector<int64_t> row_of_layer;    ///< [layers]: the layer's place in its group's blocks, [0, layers_per_block)
  int num_groups() const { return static_cast<int>(group_window.size()); }
  /// Groups whose layers attend to all positions: each position of a sequence takes a block of each of them.
  int64_t full_groups() const;
};
/// The layout of a cache for `num_layers` layers with `spec`'s windows. Throws UsageError when num_layers is not
/// positive, layer_windows is neither empty nor num_layers long, or a window is negative.
KvGroupLayout kv_group_layout(int64_t num_layers, const KvCacheSpec& spec);

/// Blocks of `block_size` positions needed for `positions` positions.
inline int64_t kv_blocks_for(int64_t positions, int64_t block_size) { return (positions + block_size - 1) / block_size; }
/// Bytes of keys and values one block takes for `layers` layers × `kv_heads` × `head_dim` of `element`s.
int64_t kv_block_bytes(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t block_size, KvCacheDtype element);

/// How a KV budget in bytes becomes blocks (what `explain` prints and `serve` allocates): blocks = ⌊budget /
/// bytes_per_block⌋, bytes_per_block = kv_block_bytes(layout.layers_per_block, kv_heads, head_dim, block_size,
/// element), tokens = blocks · block_size / the full groups: the positions the pool holds across all sequences in
/// the layers that attend to all positions. With sliding groups beside them (GPT-OSS) each sequence also holds up
/// to sliding_blocks_per_sequence blocks of those (more while a prefill chunk is written, before its window passes);
/// with sliding layers only, tokens = blocks · block_size / all groups, the positions held at once.
struct KvMemoryPlan {
  int64_t budget_bytes = 0;
  int64_t block_size = 0;
  int64_t layers_per_block = 0;
  int groups = 1;
  int64_t full_groups = 1;
  int64_t bytes_per_block = 0;
  int64_t blocks = 0;
  int64_t tokens = 0;
  /// Blocks one long sequence holds in its sliding groups (Σ over them of ⌈window / block_size⌉ + 1); 0 when the
  /// model has no sliding layers, or sliding layers only.
  int64_t sliding_blocks_per_sequence = 0;
  /// Bytes the blocks take (blocks · bytes_per_block ≤ budget_bytes).
  int64_t pool_bytes() const { return blocks * bytes_per_block; }
};
/// Throws UsageError for a negative budget or non-positive sizes.
KvMemoryPlan kv_memory_plan(const KvGroupLayout& layout, int64_t kv_heads, int64_t head_dim, KvCacheDtype element,
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
  /// Which blocks hold which layers (one group unless the layers' windows differ).
  const KvGroupLayout& layout() const { return layout_; }
  int num_groups() const { return layout_.num_groups(); }
  /// The group holding `layer`'s keys and values and the layer's row in that group's blocks (< layers_per_block).
  int group_of_layer(int64_t layer) const { return layout_.group_of_layer.at(static_cast<size_t>(layer)); }
  int64_t row_of_layer(int64_t layer) const { return layout_.row_of_layer.at(static_cast<size_t>(layer)); }
  /// Layers each block holds (the storage's rows per block).
  int64_t layers_per_block() const { return layout_.layers_per_block; }
  int64_t block_size() const { return spec_.block_size; }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  /// Blocks no sequence references (including evictable cached ones).
  int64_t free_blocks() const { return pool_.free_blocks(); }

  /// `slot`'s block table of `group`: entry i holds positions [i·block_size, (i + 1)·block_size) of the group's
  /// layers, kNoBlock where a sliding window released it. Every group's table of a slot has the same length.
  /// Throws UsageError for a slot not in use or a group outside [0, num_groups()).
  std::span<const int32_t> block_table(int slot, int group = 0) const;
  /// The tables of every group, one after another (num_groups() × the table length): what a tensor-parallel rank
  /// mirrors (assign_table).
  std::vector<int32_t> block_tables(int slot) const;
  /// Positions whose keys and values `slot` holds (what steps have written; commit() advances it).
  int64_t num_tokens(int slot) const;
  /// The token ids at those positions (−1 where a step skipped positions).
  std::span<const int32_t> tokens(int slot) const { return slot_at(slot, "tokens").tokens; }

  /// Blocks `slot` still needs so that positions 0 … positions − 1 have one in every group.
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
  /// Keeps the blocks that position `position` reads in every sliding group (its table entries from the first its
  /// window reads) while the window moves past them, until hold_window(slot, −1) lifts the hold and releases what the
  /// window has passed. For n > 1: the leader computing a request's prompt holds the blocks its choices' first
  /// computed position reads, so that they can fork them (fork refuses a released block). No effect on groups that
  /// attend to all positions. Throws UsageError for a slot not in use.
  void hold_window(int slot, int64_t position);
  /// Tokens queried and found by match_prefix since the cache was made (vLLM's prefix_cache_queries / _hits).
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }
  /// Forgets every cached prefix (blocks in use stay).
  void reset_prefix_cache() { pool_.reset_prefix_cache(); }

  /// Tensor parallelism: sets `slot`'s tables (acquiring the slot if needed) to rank 0's, `tables` as
  /// block_tables() gives them, without this pool's reference counts: a mirror cache's tables are only ever
  /// assigned. Throws UsageError for a block outside the pool, a length that is not a multiple of num_groups(), or
  /// tables longer than max_seq_len needs.
  void assign_table(int slot, std::span<const int32_t> tables);

  /// The pool (for tests and metrics).
  const BlockPool& pool() const { return pool_; }

  /// The backend storage (never null).
  KvStorage* storage() const { return storage_.get(); }

 private:
  struct Slot {
    bool in_use = false;
    bool mirrored = false;                     // tables assigned by assign_table (hold no references)
    std::vector<std::vector<int32_t>> tables;  // [group]: blocks in position order, all of one length
    std::vector<int32_t> tokens;               // token ids at positions 0 … num_tokens − 1
    std::vector<PrefixKey> keys;               // group 0's prefix key after each full block considered for the cache
    std::vector<int64_t> released_below;       // [group]: entries before this one were released by its window
    int64_t hold = -1;                         // hold_window's position (−1: none)
    int64_t table_size() const { return tables.empty() ? 0 : static_cast<int64_t>(tables[0].size()); }
  };
  Slot& slot_at(int slot, const char* what);
  const Slot& slot_at(int slot, const char* what) const;
  void drop_blocks(Slot& s);
  void release_out_of_window(Slot& s);
  // The table entries whose blocks position `next` still reads in group g: [first, ∞).
  int64_t first_read_entry(int group, int64_t next) const;

  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  KvCacheDtype element_ = KvCacheDtype::F32;
  KvCacheSpec spec_;
  KvGroupLayout layout_;
  BlockPool pool_;
  std::vector<Slot> slots_;
  bool prefix_caching_ = false;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  std::unique_ptr<KvStorage> storage_;
};

/// `spec` with num_blocks filled in for `num_layers` layers (0 → max_slots · ⌈max_seq_len / block_size⌉ · the
/// layout's groups: every slot at full length). Throws UsageError on non-positive sizes.
KvCacheSpec resolved_spec(KvCacheSpec spec, int64_t num_layers);

}  // namespace fp4serve::model
