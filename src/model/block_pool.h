// SPDX-License-Identifier: Apache-2.0
// The KV cache's block pool, device-free: fixed-size blocks of `block_size` positions, reference counts, a free
// queue in least-recently-used order and the automatic prefix cache (full blocks found again by the tokens they
// hold). Only the bookkeeping lives here; each backend keeps the blocks' keys and values in its own memory
// (model::KvStorage) at the block indices handed out here. Modelled on vLLM V1 (v1/core/block_pool.py,
// kv_cache_utils.py): the free queue takes blocks from its head and puts freed ones at its tail, so the block
// evicted first is the one unused longest; a full block's key is a hash of its tokens chained on the key of the
// block before it, so one key stands for the whole prefix up to the block's end.
//
// Unlike a bare hash, a key here cannot be fooled by a collision: every registered block also keeps its tokens
// and the serial number of its parent's entry (serials are never reused), and a lookup accepts a candidate only
// when both match. An evicted parent's children become unreachable (their parent serial names an entry that no
// longer exists) and leave through the free queue like any unused block.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace fp4serve::model {

/// A block table entry with no block: a position never written, or a block a sliding window left behind.
inline constexpr int32_t kNoBlock = -1;

/// hash(parent key's hash, a full block's token ids) → 64 bits. The default, chain_block_hash, mixes every token
/// with splitmix64; tests pass a colliding one to check that collisions are resolved by the tokens.
using BlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);
uint64_t chain_block_hash(uint64_t parent_hash, std::span<const int32_t> tokens);

/// Where a chain of full blocks stands: the hash and the entry serial of its last block (the empty prefix is
/// kRootPrefix).
struct PrefixKey {
  uint64_t hash = 0;
  uint64_t serial = 0;
  bool operator==(const PrefixKey&) const = default;
};
inline constexpr PrefixKey kRootPrefix{0x9e3779b97f4a7c15ULL, 0};

class BlockPool {
 public:
  /// `num_blocks` blocks of `block_size` positions, all free. Throws UsageError on non-positive sizes or more
  /// than INT32_MAX blocks.
  explicit BlockPool(int64_t num_blocks, int64_t block_size, BlockHashFn hash = chain_block_hash);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }
  int64_t block_size() const { return block_size_; }
  /// Blocks with no reference (some may still hold cached prefixes: allocate() evicts them).
  int64_t free_blocks() const { return free_count_; }
  /// Registered (prefix-cached) blocks, referenced or not.
  int64_t cached_blocks() const { return static_cast<int64_t>(entries_by_hash_.size()); }

  /// The free queue's head (the block unused longest) with one reference, its cached prefix (if any) evicted;
  /// kNoBlock when every block is referenced.
  int32_t allocate();
  /// One more reference to `block`; a free cached block leaves the free queue (a prefix hit). Throws UsageError
  /// for a block outside the pool or a free block that holds no cached prefix (its contents are garbage).
  void add_ref(int32_t block);
  /// One reference fewer; at zero the block joins the free queue's tail (a cached prefix stays findable until
  /// the block is allocated again). Throws UsageError for a block outside the pool or one with no reference (a
  /// double free).
  void release(int32_t block);
  int32_t ref_count(int32_t block) const;

  /// The registered block of `group` holding `tokens` (block_size of them) right after the prefix `parent`, with
  /// its key; nullopt when none. Does not change any reference.
  ///
  /// Groups (KvCache's layer groups, kv_cache.h): group 0 chains its blocks, parent = the previous block's key.
  /// Another group's block i holds other layers' keys and values for the same positions; it is registered with
  /// parent = group 0's key of block i, whose serial names the whole prefix exactly, so it is found without its
  /// own predecessors (a sliding window released them). Each group's keys are a hash space of their own.
  struct Hit {
    int32_t block;
    PrefixKey key;
  };
  std::optional<Hit> lookup(const PrefixKey& parent, std::span<const int32_t> tokens, uint32_t group = 0) const;
  /// Registers the full, referenced `block` of `group` as holding `tokens` after `parent` and returns its key.
  /// When another block already holds the same prefix in that group, `block` stays unregistered and that block's
  /// key is returned (one entry per prefix and group). Throws UsageError for a block without references, a
  /// registered one, or a token count other than block_size.
  PrefixKey insert(const PrefixKey& parent, std::span<const int32_t> tokens, int32_t block, uint32_t group = 0);
  /// Forgets `block`'s registration (its contents are about to change); no-op for an unregistered block.
  void forget(int32_t block);
  /// True when `block` is registered.
  bool is_cached(int32_t block) const { return entry_at(block).serial != 0; }
  /// Forgets every registration (blocks and references stay).
  void reset_prefix_cache();

  /// Verifies the pool's invariants (free count and queue agree with the reference counts, every registration
  /// indexed once); throws std::logic_error naming the first broken one. For tests.
  void check_invariants() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t serial = 0;         // 0: not registered
    uint64_t parent_serial = 0;  // the entry before it in its chain (0: the root); group 0's entry of this block
                                 // for another group
    uint32_t group = 0;
  };
  const Entry& entry_at(int32_t block) const;
  void check_block(int32_t block, const char* what) const;
  void unlink(int32_t block);
  void push_tail(int32_t block);
  std::span<const int32_t> tokens_of(int32_t block) const;

  int64_t block_size_;
  BlockHashFn hash_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> prev_, next_;  // free queue links (kNoBlock at the ends)
  int32_t head_ = kNoBlock, tail_ = kNoBlock;
  int64_t free_count_ = 0;
  std::vector<Entry> entries_;
  std::vector<int32_t> tokens_;  // [num_blocks][block_size]: a registered block's tokens
  std::unordered_multimap<uint64_t, int32_t> entries_by_hash_;
  uint64_t next_serial_ = 1;
};

}  // namespace fp4serve::model
