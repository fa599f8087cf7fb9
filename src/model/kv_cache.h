// SPDX-License-Identifier: Apache-2.0
// Per-sequence key/value cache. A slot holds one sequence's keys and values for every layer, as fp32, bf16 or
// fp16 elements (kernels::KvElement, --kv-cache-dtype), laid out [layer][kv_head][position][head_dim] so that
// decode attention, which reads one KV head's keys for all positions at a time, reads them contiguously (with
// [position][kv_heads · head_dim] rows it read 1/KVH of each row, and ran at 8 GB/s instead of 13 with 8 KV heads:
// bench_ops BM_AttentionCold). The slot bookkeeping is the same for every backend; the storage is host memory
// here, or a backend's own (KvStorage: the GPU keeps fp32 [layer][position][kv_heads · head_dim] rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention.h"

namespace fp4serve::model {

/// Keys and values kept by a backend outside host memory; KvCache only owns it. The backend that made it
/// recognises its own type (ForwardModel::forward throws UsageError for a cache made by another backend).
class KvStorage {
 public:
  virtual ~KvStorage() = default;
};

class KvCache {
 public:
  /// `max_slots` sequences of up to `max_seq_len` positions each, stored as `element`s. Memory is allocated
  /// when a slot is first acquired and kept for reuse. Throws UsageError on non-positive sizes.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
          kernels::KvElement element = kernels::KvElement::F32);
  /// The same bookkeeping with the keys and values in `storage` (non-null) instead of host memory, which holds
  /// `element`s: key(), value() and rows() then throw UsageError.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
          std::unique_ptr<KvStorage> storage, kernels::KvElement element = kernels::KvElement::F32);

  /// A free slot, or −1 when all are in use.
  int acquire();
  /// Takes `slot` itself (allocating its memory like acquire) and returns true, or false when it is already in
  /// use: a tensor-parallel rank mirrors the slots rank 0's scheduler chose. Throws UsageError outside
  /// [0, max_slots).
  bool acquire(int slot);
  /// Returns a slot to the pool; its contents become garbage.
  void release(int slot);
  int free_slots() const;
  int max_slots() const { return static_cast<int>(slots_.size()); }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t num_kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  kernels::KvElement element() const { return element_; }

  int64_t num_layers() const { return layers_; }

  /// Key / value of `kv_head` at `position` in `layer` of `slot` (position < max_seq_len, slot acquired) in host
  /// memory: head_dim() elements of element(); the next position's follow. Throws UsageError when the cache's
  /// storage belongs to a backend (storage() is non-null).
  void* key_data(int slot, int64_t layer, int64_t kv_head, int64_t position);
  void* value_data(int slot, int64_t layer, int64_t kv_head, int64_t position);
  /// The same of an fp32 cache as floats; also throws UsageError when element() is not F32.
  float* key(int slot, int64_t layer, int64_t kv_head, int64_t position);
  float* value(int slot, int64_t layer, int64_t kv_head, int64_t position);
  /// `layer`'s keys and values of `slot` as attention reads them (positions from 0; row stride head_dim, head
  /// stride max_seq_len · head_dim). Throws as key_data.
  kernels::KvRows rows(int slot, int64_t layer);

  /// The backend storage, or nullptr for a host cache.
  KvStorage* storage() const { return storage_.get(); }

 private:
  struct Slot {
    bool in_use = false;
    std::vector<std::byte> keys;
    std::vector<std::byte> values;
  };
  int64_t offset(int64_t layer, int64_t kv_head, int64_t position) const;  // in elements

  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  kernels::KvElement element_ = kernels::KvElement::F32;
  int64_t max_seq_len_;
  std::vector<Slot> slots_;
  std::unique_ptr<KvStorage> storage_;
};

}  // namespace fp4serve::model
