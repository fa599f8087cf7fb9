// SPDX-License-Identifier: Apache-2.0
#include "model/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "fp4serve/error.h"

namespace fp4serve::model {

int64_t kv_cache_dtype_bytes(KvCacheDtype dtype) { return dtype == KvCacheDtype::F32 ? 4 : 2; }

std::string_view kv_cache_dtype_name(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::F32: return "fp32";
    case KvCacheDtype::Bf16: return "bf16";
    case KvCacheDtype::F16: return "fp16";
  }
  return "?";
}

int64_t kv_block_bytes(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t block_size, KvCacheDtype element) {
  return 2 * layers * kv_heads * head_dim * block_size * kv_cache_dtype_bytes(element);
}

KvMemoryPlan kv_memory_plan(int64_t layers, int64_t kv_heads, int64_t head_dim, KvCacheDtype element,
                            int64_t budget_bytes, int64_t block_size) {
  if (layers <= 0 || kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || budget_bytes < 0) {
    throw UsageError(fmt::format("kv_memory_plan: {} layers, {} KV heads, head_dim {}, block size {} must be positive "
                                 "and the budget {} not negative",
                                 layers, kv_heads, head_dim, block_size, budget_bytes));
  }
  KvMemoryPlan plan;
  plan.budget_bytes = budget_bytes;
  plan.block_size = block_size;
  plan.bytes_per_block = kv_block_bytes(layers, kv_heads, head_dim, block_size, element);
  plan.blocks = budget_bytes / plan.bytes_per_block;
  plan.tokens = plan.blocks * block_size;
  return plan;
}

KvCacheSpec resolved_spec(KvCacheSpec spec) {
  if (spec.max_seq_len <= 0 || spec.max_slots <= 0 || spec.block_size <= 0 || spec.num_blocks < 0 ||
      spec.sliding_window < 0) {
    throw UsageError(fmt::format("KvCache: max_seq_len {}, max_slots {} and block_size {} must be positive, num_blocks {} "
                                 "and sliding_window {} not negative",
                                 spec.max_seq_len, spec.max_slots, spec.block_size, spec.num_blocks,
                                 spec.sliding_window));
  }
  if (spec.num_blocks == 0) spec.num_blocks = spec.max_slots * kv_blocks_for(spec.max_seq_len, spec.block_size);
  if (spec.num_blocks > std::numeric_limits<int32_t>::max()) {
    throw UsageError(fmt::format("KvCache: {} blocks exceed the block table's int32 range", spec.num_blocks));
  }
  return spec;
}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, const KvCacheSpec& spec,
                 std::unique_ptr<KvStorage> storage, KvCacheDtype element)
    : layers_(num_layers),
      kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      element_(element),
      spec_(resolved_spec(spec)),
      pool_(spec_.num_blocks, spec_.block_size) {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0) {
    throw UsageError(fmt::format("KvCache: sizes must be positive (layers {}, kv heads {}, head_dim {})", num_layers,
                                 num_kv_heads, head_dim));
  }
  if (storage == nullptr) throw UsageError("KvCache: backend storage is null");
  slots_.resize(static_cast<size_t>(spec_.max_slots));
  storage_ = std::move(storage);
}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, const KvCacheSpec& spec,
                 KvCacheDtype element)
    : KvCache(num_layers, num_kv_heads, head_dim, spec, std::make_unique<KvStorage>(), element) {}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
                 KvCacheDtype element)
    : KvCache(num_layers, num_kv_heads, head_dim, KvCacheSpec{max_seq_len, max_slots}, element) {}

KvCache::Slot& KvCache::slot_at(int slot, const char* what) {
  return const_cast<Slot&>(static_cast<const KvCache*>(this)->slot_at(slot, what));
}

const KvCache::Slot& KvCache::slot_at(int slot, const char* what) const {
  if (slot < 0 || slot >= max_slots() || !slots_[static_cast<size_t>(slot)].in_use) {
    throw UsageError(fmt::format("KvCache::{}: slot {} is not in use (slots [0, {}))", what, slot, max_slots()));
  }
  return slots_[static_cast<size_t>(slot)];
}

int KvCache::acquire() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (acquire(static_cast<int>(i))) return static_cast<int>(i);
  }
  return -1;
}

bool KvCache::acquire(int slot) {
  if (slot < 0 || slot >= max_slots()) {
    throw UsageError(fmt::format("KvCache: slot {} is outside [0, {})", slot, max_slots()));
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.in_use) return false;
  s = Slot{};
  s.in_use = true;
  return true;
}

void KvCache::drop_blocks(Slot& s) {
  if (!s.mirrored) {
    for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) {
      if (*it != kNoBlock) pool_.release(*it);
    }
  }
  s.table.clear();
  s.tokens.clear();
  s.keys.clear();
  s.released_below = 0;
  s.mirrored = false;
}

void KvCache::release(int slot) {
  Slot& s = slot_at(slot, "release");
  drop_blocks(s);
  s.in_use = false;
}

int KvCache::free_slots() const {
  return static_cast<int>(std::ranges::count_if(slots_, [](const Slot& s) { return !s.in_use; }));
}

std::span<const int32_t> KvCache::block_table(int slot) const { return slot_at(slot, "block_table").table; }

int64_t KvCache::num_tokens(int slot) const {
  return static_cast<int64_t>(slot_at(slot, "num_tokens").tokens.size());
}

int64_t KvCache::blocks_needed(int slot, int64_t positions) const {
  const Slot& s = slot_at(slot, "blocks_needed");
  return std::max<int64_t>(0, kv_blocks_for(positions, block_size()) - static_cast<int64_t>(s.table.size()));
}

bool KvCache::reserve(int slot, int64_t positions) {
  Slot& s = slot_at(slot, "reserve");
  if (positions < 0 || positions > max_seq_len()) {
    throw UsageError(fmt::format("KvCache::reserve: {} positions exceed the cache length {}", positions, max_seq_len()));
  }
  const int64_t need = blocks_needed(slot, positions);
  if (need == 0) return true;
  if (s.mirrored || need > pool_.free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) s.table.push_back(pool_.allocate());
  return true;
}

void KvCache::prepare(int slot, int64_t start_pos, int64_t count) {
  Slot& s = slot_at(slot, "prepare");
  const auto held = static_cast<int64_t>(s.tokens.size());
  if (!s.mirrored && start_pos < held) {
    // A rewrite (a perplexity window restarting at 0): the rewritten blocks leave the prefix cache first.
    if (s.released_below > 0) {
      if (start_pos != 0) {
        throw UsageError(fmt::format("KvCache::prepare: slot {} restarts at position {}, but its sliding window already "
                                     "released the blocks before it",
                                     slot, start_pos));
      }
      drop_blocks(s);
    } else {
      for (auto i = static_cast<size_t>(start_pos / block_size()); i < s.table.size(); ++i) {
        if (pool_.ref_count(s.table[i]) > 1) {
          throw UsageError(fmt::format("KvCache::prepare: slot {} rewrites position {} of a block shared with another "
                                       "sequence (a prefix-cache hit)",
                                       slot, start_pos));
        }
        pool_.forget(s.table[i]);
      }
      s.tokens.resize(static_cast<size_t>(start_pos));
      s.keys.resize(std::min(s.keys.size(), static_cast<size_t>(start_pos / block_size())));
    }
  }
  const int64_t end = start_pos + count;
  if (s.mirrored) {
    if (kv_blocks_for(end, block_size()) > static_cast<int64_t>(s.table.size())) {
      throw UsageError(fmt::format("KvCache::prepare: slot {}'s mirrored block table covers {} positions, the step "
                                   "writes up to {}",
                                   slot, static_cast<int64_t>(s.table.size()) * block_size(), end));
    }
    return;
  }
  if (!reserve(slot, end)) {
    throw UsageError(fmt::format("out of KV-cache blocks: slot {} needs {} more blocks of {} positions for position {}, "
                                 "{} of {} are free (raise --kv-cache-memory or run fewer sequences)",
                                 slot, blocks_needed(slot, end), block_size(), end - 1, pool_.free_blocks(),
                                 num_blocks()));
  }
}

void KvCache::commit(int slot, int64_t start_pos, std::span<const int32_t> tokens) {
  Slot& s = slot_at(slot, "commit");
  if (s.mirrored) return;
  // Positions the caller skipped (never written by a step) hold no known token: -1 keeps them out of the cache.
  s.tokens.resize(static_cast<size_t>(start_pos), -1);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  const int64_t bs = block_size();
  const auto full = static_cast<size_t>(static_cast<int64_t>(s.tokens.size()) / bs);
  if (prefix_caching_) {
    for (size_t i = s.keys.size(); i < full && i < s.table.size(); ++i) {
      const std::span<const int32_t> block_tokens(s.tokens.data() + i * static_cast<size_t>(bs), static_cast<size_t>(bs));
      const int32_t block = s.table[i];
      if (block == kNoBlock || std::ranges::find(block_tokens, -1) != block_tokens.end() || pool_.is_cached(block)) {
        break;
      }
      s.keys.push_back(pool_.insert(s.keys.empty() ? kRootPrefix : s.keys.back(), block_tokens, block));
    }
  }
  if (spec_.sliding_window > 0) {
    // The next position p reads keys p − W + 1 … p: blocks wholly before p − W + 1 are never read again.
    const int64_t first_read = static_cast<int64_t>(s.tokens.size()) - spec_.sliding_window + 1;
    const int64_t dead = std::min<int64_t>(first_read > 0 ? first_read / bs : 0, static_cast<int64_t>(s.table.size()));
    for (int64_t i = s.released_below; i < dead; ++i) {
      int32_t& b = s.table[static_cast<size_t>(i)];
      if (b != kNoBlock) pool_.release(b);
      b = kNoBlock;
    }
    s.released_below = std::max(s.released_below, dead);
  }
}

void KvCache::set_prefix_caching(bool on) {
  prefix_caching_ = on;
  if (!on) pool_.reset_prefix_cache();
}

int64_t KvCache::match_prefix(int slot, std::span<const int32_t> tokens) {
  Slot& s = slot_at(slot, "match_prefix");
  if (!s.table.empty() || !s.tokens.empty() || s.mirrored) {
    throw UsageError(fmt::format("KvCache::match_prefix: slot {} already holds positions", slot));
  }
  if (!prefix_caching_ || tokens.empty()) return 0;
  prefix_queries_ += static_cast<int64_t>(tokens.size());
  const int64_t bs = block_size();
  const int64_t max_blocks = std::min<int64_t>((static_cast<int64_t>(tokens.size()) - 1) / bs,
                                               max_seq_len() / bs);
  PrefixKey parent = kRootPrefix;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto hit = pool_.lookup(parent, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)));
    if (!hit) break;
    pool_.add_ref(hit->block);
    s.table.push_back(hit->block);
    s.keys.push_back(hit->key);
    parent = hit->key;
  }
  const int64_t matched = static_cast<int64_t>(s.table.size()) * bs;
  s.tokens.assign(tokens.begin(), tokens.begin() + matched);
  prefix_hits_ += matched;
  return matched;
}

int64_t KvCache::fork(int src, int dst, std::span<const int32_t> tokens) {
  const Slot& from = slot_at(src, "fork");
  Slot& to = slot_at(dst, "fork");
  if (src == dst || !to.table.empty() || !to.tokens.empty() || to.mirrored || from.mirrored) {
    throw UsageError(fmt::format("KvCache::fork: slot {} cannot take slot {}'s blocks (it holds positions, is the same "
                                 "slot or a mirror)",
                                 dst, src));
  }
  if (tokens.empty()) return 0;
  const int64_t bs = block_size();
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(from.tokens.size()), static_cast<int64_t>(from.table.size()) * bs);
  // The longest run of whole blocks whose tokens agree (choices share their prompt, not what they generated).
  const int64_t max_blocks = std::min(held, static_cast<int64_t>(tokens.size()) - 1) / bs;
  int64_t blocks = 0;
  while (blocks < max_blocks && std::equal(tokens.begin() + blocks * bs, tokens.begin() + (blocks + 1) * bs,
                                           from.tokens.begin() + blocks * bs)) {
    ++blocks;
  }
  const int64_t shared = blocks * bs;
  if (blocks == 0) return 0;
  // The next position dst computes (shared) reads keys from shared − W + 1 on: those blocks must still be there.
  if (spec_.sliding_window > 0 && from.released_below > std::max<int64_t>(0, shared - spec_.sliding_window + 1) / bs) {
    return 0;
  }
  to.table.assign(from.table.begin(), from.table.begin() + blocks);
  for (const int32_t b : to.table) {
    if (b != kNoBlock) pool_.add_ref(b);
  }
  to.tokens.assign(tokens.begin(), tokens.begin() + shared);
  to.keys.assign(from.keys.begin(), from.keys.begin() + std::min<int64_t>(blocks, static_cast<int64_t>(from.keys.size())));
  to.released_below = std::min(from.released_below, blocks);
  return shared;
}

void KvCache::assign_table(int slot, std::span<const int32_t> table) {
  if (slot < 0 || slot >= max_slots()) {
    throw UsageError(fmt::format("KvCache::assign_table: slot {} is outside [0, {})", slot, max_slots()));
  }
  if (static_cast<int64_t>(table.size()) > kv_blocks_for(max_seq_len(), block_size())) {
    throw UsageError(fmt::format("KvCache::assign_table: {} blocks exceed the {} of a {}-position sequence",
                                 table.size(), kv_blocks_for(max_seq_len(), block_size()), max_seq_len()));
  }
  for (const int32_t b : table) {
    if (b != kNoBlock && (b < 0 || b >= num_blocks())) {
      throw UsageError(fmt::format("KvCache::assign_table: block {} is outside the pool's [0, {})", b, num_blocks()));
    }
  }
  acquire(slot);
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.mirrored) drop_blocks(s);
  s.mirrored = true;
  s.table.assign(table.begin(), table.end());
}

}  // namespace fp4serve::model
