// SPDX-License-Identifier: Apache-2.0
#include "model/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

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

int64_t KvGroupLayout::full_groups() const {
  return static_cast<int64_t>(std::ranges::count(group_window, int64_t{0}));
}

KvGroupLayout kv_group_layout(int64_t num_layers, const KvCacheSpec& spec) {
  if (num_layers <= 0) throw UsageError(fmt::format("KvCache: {} layers (must be positive)", num_layers));
  std::vector<int64_t> windows = spec.layer_windows;
  if (windows.empty()) windows.assign(static_cast<size_t>(num_layers), spec.sliding_window);
  if (static_cast<int64_t>(windows.size()) != num_layers) {
    throw UsageError(fmt::format("KvCache: layer_windows has {} entries for {} layers", windows.size(), num_layers));
  }
  if (std::ranges::any_of(windows, [](int64_t w) { return w < 0; })) {
    throw UsageError("KvCache: a layer's sliding window is negative");
  }
  // Classes of equal windows, widest first (0 = all positions), each in layer order.
  std::vector<int64_t> order = windows;
  std::ranges::sort(order, [](int64_t a, int64_t b) { return (a == 0 ? INT64_MAX : a) > (b == 0 ? INT64_MAX : b); });
  const auto [first, last] = std::ranges::unique(order);
  order.erase(first, last);
  int64_t per_block = 0;
  for (const int64_t w : order) per_block = std::gcd(per_block, static_cast<int64_t>(std::ranges::count(windows, w)));
  KvGroupLayout layout;
  layout.layers_per_block = per_block;
  layout.group_of_layer.assign(windows.size(), 0);
  layout.row_of_layer.assign(windows.size(), 0);
  for (const int64_t w : order) {
    int64_t placed = 0;
    for (size_t l = 0; l < windows.size(); ++l) {
      if (windows[l] != w) continue;
      if (placed % per_block == 0) layout.group_window.push_back(w);
      layout.group_of_layer[l] = layout.num_groups() - 1;
      layout.row_of_layer[l] = placed % per_block;
      ++placed;
    }
  }
  return layout;
}

KvMemoryPlan kv_memory_plan(const KvGroupLayout& layout, int64_t kv_heads, int64_t head_dim, KvCacheDtype element,
                            int64_t budget_bytes, int64_t block_size) {
  if (layout.layers_per_block <= 0 || kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || budget_bytes < 0) {
    throw UsageError(fmt::format("kv_memory_plan: {} layers per block, {} KV heads, head_dim {}, block size {} must be "
                                 "positive and the budget {} not negative",
                                 layout.layers_per_block, kv_heads, head_dim, block_size, budget_bytes));
  }
  KvMemoryPlan plan;
  plan.budget_bytes = budget_bytes;
  plan.block_size = block_size;
  plan.layers_per_block = layout.layers_per_block;
  plan.groups = layout.num_groups();
  plan.full_groups = layout.full_groups();
  plan.bytes_per_block = kv_block_bytes(layout.layers_per_block, kv_heads, head_dim, block_size, element);
  plan.blocks = budget_bytes / plan.bytes_per_block;
  // A held position takes a block of every full group; with sliding layers only, of every group while held.
  plan.tokens = plan.blocks * block_size / (plan.full_groups > 0 ? plan.full_groups : plan.groups);
  if (plan.full_groups > 0) {
    for (const int64_t w : layout.group_window) {
      if (w > 0) plan.sliding_blocks_per_sequence += kv_blocks_for(w, block_size) + 1;
    }
  }
  return plan;
}

KvCacheSpec resolved_spec(KvCacheSpec spec, int64_t num_layers) {
  if (spec.max_seq_len <= 0 || spec.max_slots <= 0 || spec.block_size <= 0 || spec.num_blocks < 0 ||
      spec.sliding_window < 0) {
    throw UsageError(fmt::format("KvCache: max_seq_len {}, max_slots {} and block_size {} must be positive, num_blocks {} "
                                 "and sliding_window {} not negative",
                                 spec.max_seq_len, spec.max_slots, spec.block_size, spec.num_blocks,
                                 spec.sliding_window));
  }
  const KvGroupLayout layout = kv_group_layout(num_layers, spec);
  if (spec.num_blocks == 0) {
    spec.num_blocks = spec.max_slots * kv_blocks_for(spec.max_seq_len, spec.block_size) * layout.num_groups();
  }
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
      spec_(resolved_spec(spec, num_layers)),
      layout_(kv_group_layout(num_layers, spec_)),
      pool_(spec_.num_blocks, spec_.block_size) {
  if (num_kv_heads <= 0 || head_dim <= 0) {
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
  s.tables.resize(static_cast<size_t>(num_groups()));
  s.released_below.assign(static_cast<size_t>(num_groups()), 0);
  return true;
}

void KvCache::drop_blocks(Slot& s) {
  if (!s.mirrored) {
    // Last position first, every group's block of it together: a sequence's tail is evicted before its head.
    for (int64_t i = s.table_size() - 1; i >= 0; --i) {
      for (const auto& table : s.tables) {
        if (table[static_cast<size_t>(i)] != kNoBlock) pool_.release(table[static_cast<size_t>(i)]);
      }
    }
  }
  for (auto& table : s.tables) table.clear();
  s.tokens.clear();
  s.keys.clear();
  std::ranges::fill(s.released_below, 0);
  s.hold = -1;
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

std::span<const int32_t> KvCache::block_table(int slot, int group) const {
  const Slot& s = slot_at(slot, "block_table");
  if (group < 0 || group >= num_groups()) {
    throw UsageError(fmt::format("KvCache::block_table: group {} is outside [0, {})", group, num_groups()));
  }
  return s.tables[static_cast<size_t>(group)];
}

std::vector<int32_t> KvCache::block_tables(int slot) const {
  const Slot& s = slot_at(slot, "block_tables");
  std::vector<int32_t> all;
  all.reserve(static_cast<size_t>(s.table_size() * num_groups()));
  for (const auto& table : s.tables) all.insert(all.end(), table.begin(), table.end());
  return all;
}

int64_t KvCache::num_tokens(int slot) const {
  return static_cast<int64_t>(slot_at(slot, "num_tokens").tokens.size());
}

int64_t KvCache::blocks_needed(int slot, int64_t positions) const {
  const Slot& s = slot_at(slot, "blocks_needed");
  return std::max<int64_t>(0, kv_blocks_for(positions, block_size()) - s.table_size()) * num_groups();
}

bool KvCache::reserve(int slot, int64_t positions) {
  Slot& s = slot_at(slot, "reserve");
  if (positions < 0 || positions > max_seq_len()) {
    throw UsageError(fmt::format("KvCache::reserve: {} positions exceed the cache length {}", positions, max_seq_len()));
  }
  const int64_t need = blocks_needed(slot, positions);
  if (need == 0) return true;
  if (s.mirrored || need > pool_.free_blocks()) return false;
  const int64_t entries = kv_blocks_for(positions, block_size());
  for (auto& table : s.tables) {
    while (static_cast<int64_t>(table.size()) < entries) table.push_back(pool_.allocate());
  }
  return true;
}

int64_t KvCache::first_read_entry(int group, int64_t next) const {
  const int64_t window = layout_.group_window[static_cast<size_t>(group)];
  if (window == 0) return 0;
  // Position `next` reads keys next − W + 1 … next: the blocks wholly before next − W + 1 are never read again.
  return std::max<int64_t>(0, next - window + 1) / block_size();
}

void KvCache::prepare(int slot, int64_t start_pos, int64_t count) {
  Slot& s = slot_at(slot, "prepare");
  const auto held = static_cast<int64_t>(s.tokens.size());
  if (!s.mirrored && start_pos < held) {
    // A rewrite (a perplexity window restarting at 0): the rewritten blocks leave the prefix cache first.
    if (std::ranges::any_of(s.released_below, [](int64_t r) { return r > 0; })) {
      if (start_pos != 0) {
        throw UsageError(fmt::format("KvCache::prepare: slot {} restarts at position {}, but its sliding window already "
                                     "released the blocks before it",
                                     slot, start_pos));
      }
      drop_blocks(s);
    } else {
      for (const auto& table : s.tables) {
        for (auto i = static_cast<size_t>(start_pos / block_size()); i < table.size(); ++i) {
          if (pool_.ref_count(table[i]) > 1) {
            throw UsageError(fmt::format("KvCache::prepare: slot {} rewrites position {} of a block shared with "
                                         "another sequence (a prefix-cache hit)",
                                         slot, start_pos));
          }
        }
      }
      for (const auto& table : s.tables) {
        for (auto i = static_cast<size_t>(start_pos / block_size()); i < table.size(); ++i) pool_.forget(table[i]);
      }
      s.tokens.resize(static_cast<size_t>(start_pos));
      s.keys.resize(std::min(s.keys.size(), static_cast<size_t>(start_pos / block_size())));
    }
  }
  const int64_t end = start_pos + count;
  if (s.mirrored) {
    if (kv_blocks_for(end, block_size()) > s.table_size()) {
      throw UsageError(fmt::format("KvCache::prepare: slot {}'s mirrored block table covers {} positions, the step "
                                   "writes up to {}",
                                   slot, s.table_size() * block_size(), end));
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

void KvCache::release_out_of_window(Slot& s) {
  const auto next = static_cast<int64_t>(s.tokens.size());
  for (int g = 0; g < num_groups(); ++g) {
    auto& table = s.tables[static_cast<size_t>(g)];
    int64_t& below = s.released_below[static_cast<size_t>(g)];
    int64_t dead = std::min<int64_t>(first_read_entry(g, next), static_cast<int64_t>(table.size()));
    if (s.hold >= 0) dead = std::min(dead, first_read_entry(g, s.hold));
    for (int64_t i = below; i < dead; ++i) {
      int32_t& b = table[static_cast<size_t>(i)];
      if (b != kNoBlock) pool_.release(b);
      b = kNoBlock;
    }
    below = std::max(below, dead);
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
    const auto& primary = s.tables[0];
    for (size_t i = s.keys.size(); i < full && i < primary.size(); ++i) {
      const std::span<const int32_t> block_tokens(s.tokens.data() + i * static_cast<size_t>(bs), static_cast<size_t>(bs));
      const int32_t block = primary[i];
      if (block == kNoBlock || std::ranges::find(block_tokens, -1) != block_tokens.end() || pool_.is_cached(block)) {
        break;
      }
      const PrefixKey key = pool_.insert(s.keys.empty() ? kRootPrefix : s.keys.back(), block_tokens, block);
      s.keys.push_back(key);
      // The other groups' blocks of the same positions, found again through group 0's key of this block.
      for (int g = 1; g < num_groups(); ++g) {
        const int32_t other = s.tables[static_cast<size_t>(g)][i];
        if (other != kNoBlock && !pool_.is_cached(other)) pool_.insert(key, block_tokens, other, static_cast<uint32_t>(g));
      }
    }
  }
  release_out_of_window(s);
}

void KvCache::hold_window(int slot, int64_t position) {
  Slot& s = slot_at(slot, "hold_window");
  s.hold = std::max<int64_t>(position, -1);
  if (s.hold < 0 && !s.mirrored) release_out_of_window(s);
}

void KvCache::set_prefix_caching(bool on) {
  prefix_caching_ = on;
  if (!on) pool_.reset_prefix_cache();
}

int64_t KvCache::match_prefix(int slot, std::span<const int32_t> tokens) {
  Slot& s = slot_at(slot, "match_prefix");
  if (s.table_size() != 0 || !s.tokens.empty() || s.mirrored) {
    throw UsageError(fmt::format("KvCache::match_prefix: slot {} already holds positions", slot));
  }
  if (!prefix_caching_ || tokens.empty()) return 0;
  prefix_queries_ += static_cast<int64_t>(tokens.size());
  const int64_t bs = block_size();
  const int64_t max_blocks = std::min<int64_t>((static_cast<int64_t>(tokens.size()) - 1) / bs,
                                               max_seq_len() / bs);
  const auto block_tokens = [&](int64_t i) { return tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)); };
  // Group 0's chain: the longest run of cached blocks from the start.
  std::vector<BlockPool::Hit> chain;
  PrefixKey parent = kRootPrefix;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto hit = pool_.lookup(parent, block_tokens(i));
    if (!hit) break;
    chain.push_back(*hit);
    parent = hit->key;
  }
  // Every other group needs its blocks from the first its window still reads up to the hit's end: the longest
  // prefix all groups can serve (vLLM's hybrid cache hit). found[g][i]: group g's block i, or kNoBlock.
  const auto n = static_cast<int64_t>(chain.size());
  std::vector<std::vector<int32_t>> found(static_cast<size_t>(num_groups()));
  for (int g = 1; g < num_groups(); ++g) {
    auto& f = found[static_cast<size_t>(g)];
    f.assign(static_cast<size_t>(n), kNoBlock);
    for (int64_t i = 0; i < n; ++i) {
      if (const auto hit = pool_.lookup(chain[static_cast<size_t>(i)].key, block_tokens(i), static_cast<uint32_t>(g))) {
        f[static_cast<size_t>(i)] = hit->block;
      }
    }
  }
  // missing[g][i]: the last block before i that group g lacks (−1: none), so each candidate is checked in O(1).
  std::vector<std::vector<int64_t>> missing(static_cast<size_t>(num_groups()));
  for (int g = 1; g < num_groups(); ++g) {
    auto& m = missing[static_cast<size_t>(g)];
    m.assign(static_cast<size_t>(n) + 1, -1);
    for (int64_t i = 0; i < n; ++i) {
      m[static_cast<size_t>(i) + 1] = found[static_cast<size_t>(g)][static_cast<size_t>(i)] == kNoBlock ? i : m[static_cast<size_t>(i)];
    }
  }
  int64_t blocks = n;
  for (; blocks > 0; --blocks) {
    bool served = true;
    for (int g = 1; g < num_groups() && served; ++g) {
      served = missing[static_cast<size_t>(g)][static_cast<size_t>(blocks)] < first_read_entry(g, blocks * bs);
    }
    if (served) break;
  }
  for (int64_t i = 0; i < blocks; ++i) {
    const BlockPool::Hit& hit = chain[static_cast<size_t>(i)];
    pool_.add_ref(hit.block);
    s.tables[0].push_back(hit.block);
    s.keys.push_back(hit.key);
  }
  for (int g = 1; g < num_groups(); ++g) {
    auto& table = s.tables[static_cast<size_t>(g)];
    const int64_t first = first_read_entry(g, blocks * bs);
    table.assign(static_cast<size_t>(blocks), kNoBlock);
    for (int64_t i = first; i < blocks; ++i) {
      table[static_cast<size_t>(i)] = found[static_cast<size_t>(g)][static_cast<size_t>(i)];
      pool_.add_ref(table[static_cast<size_t>(i)]);
    }
    s.released_below[static_cast<size_t>(g)] = std::min(first, blocks);
  }
  const int64_t matched = blocks * bs;
  s.tokens.assign(tokens.begin(), tokens.begin() + matched);
  prefix_hits_ += matched;
  return matched;
}

int64_t KvCache::fork(int src, int dst, std::span<const int32_t> tokens) {
  const Slot& from = slot_at(src, "fork");
  Slot& to = slot_at(dst, "fork");
  if (src == dst || to.table_size() != 0 || !to.tokens.empty() || to.mirrored || from.mirrored) {
    throw UsageError(fmt::format("KvCache::fork: slot {} cannot take slot {}'s blocks (it holds positions, is the same "
                                 "slot or a mirror)",
                                 dst, src));
  }
  if (tokens.empty()) return 0;
  const int64_t bs = block_size();
  const int64_t held = std::min<int64_t>(static_cast<int64_t>(from.tokens.size()), from.table_size() * bs);
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
  for (int g = 0; g < num_groups(); ++g) {
    if (from.released_below[static_cast<size_t>(g)] > first_read_entry(g, shared)) return 0;
  }
  for (int g = 0; g < num_groups(); ++g) {
    const auto& src_table = from.tables[static_cast<size_t>(g)];
    auto& table = to.tables[static_cast<size_t>(g)];
    table.assign(src_table.begin(), src_table.begin() + blocks);
    for (const int32_t b : table) {
      if (b != kNoBlock) pool_.add_ref(b);
    }
    to.released_below[static_cast<size_t>(g)] = std::min(from.released_below[static_cast<size_t>(g)], blocks);
  }
  to.tokens.assign(tokens.begin(), tokens.begin() + shared);
  to.keys.assign(from.keys.begin(), from.keys.begin() + std::min<int64_t>(blocks, static_cast<int64_t>(from.keys.size())));
  return shared;
}

void KvCache::assign_table(int slot, std::span<const int32_t> tables) {
  if (slot < 0 || slot >= max_slots()) {
    throw UsageError(fmt::format("KvCache::assign_table: slot {} is outside [0, {})", slot, max_slots()));
  }
  const auto groups = static_cast<size_t>(num_groups());
  if (tables.size() % groups != 0) {
    throw UsageError(fmt::format("KvCache::assign_table: {} entries are not {} groups' tables of one length",
                                 tables.size(), groups));
  }
  const size_t length = tables.size() / groups;
  if (static_cast<int64_t>(length) > kv_blocks_for(max_seq_len(), block_size())) {
    throw UsageError(fmt::format("KvCache::assign_table: {} blocks exceed the {} of a {}-position sequence", length,
                                 kv_blocks_for(max_seq_len(), block_size()), max_seq_len()));
  }
  for (const int32_t b : tables) {
    if (b != kNoBlock && (b < 0 || b >= num_blocks())) {
      throw UsageError(fmt::format("KvCache::assign_table: block {} is outside the pool's [0, {})", b, num_blocks()));
    }
  }
  acquire(slot);
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.mirrored) drop_blocks(s);
  s.mirrored = true;
  for (size_t g = 0; g < groups; ++g) {
    s.tables[g].assign(tables.begin() + static_cast<ptrdiff_t>(g * length),
                       tables.begin() + static_cast<ptrdiff_t>((g + 1) * length));
  }
}

}  // namespace fp4serve::model
