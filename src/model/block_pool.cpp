// SPDX-License-Identifier: Apache-2.0
#include "model/block_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "fp4serve/error.h"

namespace fp4serve::model {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t chain_block_hash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = splitmix64(parent_hash ^ static_cast<uint64_t>(tokens.size()));
  for (const int32_t t : tokens) h = splitmix64(h ^ static_cast<uint32_t>(t));
  return h;
}

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size, BlockHashFn hash)
    : block_size_(block_size), hash_(hash) {
  if (num_blocks <= 0 || block_size <= 0 || num_blocks > std::numeric_limits<int32_t>::max() || hash == nullptr) {
    throw UsageError(fmt::format("BlockPool: {} blocks of {} positions (both must be positive, blocks at most 2^31 − 1)",
                                 num_blocks, block_size));
  }
  const auto n = static_cast<size_t>(num_blocks);
  refs_.assign(n, 0);
  prev_.assign(n, kNoBlock);
  next_.assign(n, kNoBlock);
  entries_.assign(n, Entry{});
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks); ++b) push_tail(b);
}

void BlockPool::check_block(int32_t block, const char* what) const {
  if (block < 0 || block >= num_blocks()) {
    throw UsageError(fmt::format("BlockPool::{}: block {} is outside [0, {})", what, block, num_blocks()));
  }
}

const BlockPool::Entry& BlockPool::entry_at(int32_t block) const {
  check_block(block, "entry");
  return entries_[static_cast<size_t>(block)];
}

std::span<const int32_t> BlockPool::tokens_of(int32_t block) const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(block) * static_cast<size_t>(block_size_),
                                                   static_cast<size_t>(block_size_));
}

void BlockPool::unlink(int32_t b) {
  const int32_t p = prev_[static_cast<size_t>(b)], n = next_[static_cast<size_t>(b)];
  (p == kNoBlock ? head_ : next_[static_cast<size_t>(p)]) = n;
  (n == kNoBlock ? tail_ : prev_[static_cast<size_t>(n)]) = p;
  prev_[static_cast<size_t>(b)] = next_[static_cast<size_t>(b)] = kNoBlock;
  --free_count_;
}

void BlockPool::push_tail(int32_t b) {
  prev_[static_cast<size_t>(b)] = tail_;
  next_[static_cast<size_t>(b)] = kNoBlock;
  (tail_ == kNoBlock ? head_ : next_[static_cast<size_t>(tail_)]) = b;
  tail_ = b;
  ++free_count_;
}

int32_t BlockPool::allocate() {
  if (head_ == kNoBlock) return kNoBlock;
  const int32_t b = head_;
  unlink(b);
  forget(b);  // evicted: its contents are about to be overwritten
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::add_ref(int32_t block) {
  check_block(block, "add_ref");
  int32_t& r = refs_[static_cast<size_t>(block)];
  if (r == 0) {
    if (!is_cached(block)) {
      throw UsageError(fmt::format("BlockPool::add_ref: block {} is free and holds no cached prefix", block));
    }
    unlink(block);
  }
  ++r;
}

void BlockPool::release(int32_t block) {
  check_block(block, "release");
  int32_t& r = refs_[static_cast<size_t>(block)];
  if (r <= 0) throw UsageError(fmt::format("BlockPool::release: block {} has no reference (double free)", block));
  if (--r == 0) push_tail(block);
}

int32_t BlockPool::ref_count(int32_t block) const {
  check_block(block, "ref_count");
  return refs_[static_cast<size_t>(block)];
}

namespace {
// Group g's keys live in their own hash space: the parent's hash is salted with the group (group 0 unchanged).
uint64_t group_salted(uint64_t parent_hash, uint32_t group) {
  return group == 0 ? parent_hash : parent_hash ^ (0xbf58476d1ce4e5b9ULL * group);
}
}  // namespace

std::optional<BlockPool::Hit> BlockPool::lookup(const PrefixKey& parent, std::span<const int32_t> tokens,
                                                uint32_t group) const {
  if (static_cast<int64_t>(tokens.size()) != block_size_) return std::nullopt;
  const uint64_t h = hash_(group_salted(parent.hash, group), tokens);
  const auto [lo, hi] = entries_by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    const Entry& e = entries_[static_cast<size_t>(it->second)];
    if (e.parent_serial == parent.serial && e.group == group && std::ranges::equal(tokens_of(it->second), tokens)) {
      return Hit{it->second, PrefixKey{e.hash, e.serial}};
    }
  }
  return std::nullopt;
}

PrefixKey BlockPool::insert(const PrefixKey& parent, std::span<const int32_t> tokens, int32_t block, uint32_t group) {
  check_block(block, "insert");
  if (static_cast<int64_t>(tokens.size()) != block_size_) {
    throw UsageError(fmt::format("BlockPool::insert: {} tokens for a block of {}", tokens.size(), block_size_));
  }
  if (refs_[static_cast<size_t>(block)] == 0 || is_cached(block)) {
    throw UsageError(fmt::format("BlockPool::insert: block {} is free or already registered", block));
  }
  if (const auto hit = lookup(parent, tokens, group)) return hit->key;
  Entry& e = entries_[static_cast<size_t>(block)];
  e = Entry{hash_(group_salted(parent.hash, group), tokens), next_serial_++, parent.serial, group};
  std::ranges::copy(tokens, tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  entries_by_hash_.emplace(e.hash, block);
  return PrefixKey{e.hash, e.serial};
}

void BlockPool::forget(int32_t block) {
  Entry& e = entries_[static_cast<size_t>(block)];
  if (e.serial == 0) return;
  const auto [lo, hi] = entries_by_hash_.equal_range(e.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == block) {
      entries_by_hash_.erase(it);
      break;
    }
  }
  e = Entry{};
}

void BlockPool::reset_prefix_cache() {
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks()); ++b) forget(b);
}

void BlockPool::check_invariants() const {
  int64_t zero_refs = 0;
  for (const int32_t r : refs_) {
    if (r < 0) throw std::logic_error("BlockPool: negative reference count");
    zero_refs += r == 0 ? 1 : 0;
  }
  int64_t queued = 0;
  std::vector<bool> seen(refs_.size());
  for (int32_t b = head_, p = kNoBlock; b != kNoBlock; p = b, b = next_[static_cast<size_t>(b)]) {
    if (seen[static_cast<size_t>(b)]) throw std::logic_error("BlockPool: free queue has a cycle");
    seen[static_cast<size_t>(b)] = true;
    if (prev_[static_cast<size_t>(b)] != p) throw std::logic_error("BlockPool: free queue links disagree");
    if (refs_[static_cast<size_t>(b)] != 0) throw std::logic_error("BlockPool: a referenced block is in the free queue");
    ++queued;
  }
  if (queued != zero_refs || queued != free_count_) {
    throw std::logic_error(fmt::format("BlockPool: {} blocks queued, {} unreferenced, free count {}", queued,
                                       zero_refs, free_count_));
  }
  int64_t registered = 0;
  for (int32_t b = 0; b < static_cast<int32_t>(num_blocks()); ++b) {
    const Entry& e = entries_[static_cast<size_t>(b)];
    if (e.serial == 0) continue;
    ++registered;
    const auto [lo, hi] = entries_by_hash_.equal_range(e.hash);
    if (std::count_if(lo, hi, [&](const auto& kv) { return kv.second == b; }) != 1) {
      throw std::logic_error(fmt::format("BlockPool: block {} is not indexed exactly once", b));
    }
  }
  if (registered != cached_blocks()) throw std::logic_error("BlockPool: index holds entries of unregistered blocks");
}

}  // namespace fp4serve::model
