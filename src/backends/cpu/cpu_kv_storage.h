// SPDX-License-Identifier: Apache-2.0
// The CPU backend's KV cache memory (model::KvStorage): per slot, host memory laid out
// [layer][kv_head][position][head_dim] in fp32, bf16 or fp16 elements (kernels::KvElement), so that decode
// attention, which reads one KV head's keys for all positions at a time, reads them contiguously (with
// [position][kv_heads · head_dim] rows it read 1/KVH of each row, and ran at 8 GB/s instead of 13 with 8 KV heads:
// bench_ops BM_AttentionCold). A slot's memory is allocated when the slot is first acquired and kept for reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/attention.h"
#include "model/kv_cache.h"

namespace fp4serve::backends::cpu {

/// The CPU element of a device-neutral KV cache dtype.
kernels::KvElement kv_element_of(model::KvCacheDtype dtype);

class CpuKvStorage final : public model::KvStorage {
 public:
  /// The sizes of the KvCache that owns it (positive: KvCache checks them).
  CpuKvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
               kernels::KvElement element);

  void on_acquire(int slot) override;

  kernels::KvElement element() const { return element_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t num_kv_heads() const { return kv_heads_; }

  /// Key / value of `kv_head` at `position` in `layer` of `slot` (position < max_seq_len, slot acquired):
  /// head_dim elements of element(); the next position's follow.
  void* key_data(int slot, int64_t layer, int64_t kv_head, int64_t position);
  void* value_data(int slot, int64_t layer, int64_t kv_head, int64_t position);
  /// The same of an fp32 cache as floats; throws UsageError when element() is not F32.
  float* key(int slot, int64_t layer, int64_t kv_head, int64_t position);
  float* value(int slot, int64_t layer, int64_t kv_head, int64_t position);
  /// `layer`'s keys and values of `slot` as kernels::attention reads them (positions from 0; row stride head_dim,
  /// head stride max_seq_len · head_dim).
  kernels::KvRows rows(int slot, int64_t layer);

 private:
  struct Slot {
    std::vector<std::byte> keys;
    std::vector<std::byte> values;
  };
  int64_t offset(int64_t layer, int64_t kv_head, int64_t position) const;  // in elements

  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  int64_t max_seq_len_;
  kernels::KvElement element_;
  std::vector<Slot> slots_;
};

/// A KvCache of `max_slots` sequences × `max_seq_len` positions with its keys and values in host memory
/// (CpuKvStorage holding kv_element_of(dtype)): what CpuBackend::make_cache returns, and a host cache for fakes.
/// Throws UsageError on non-positive sizes.
model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                                  int max_slots, model::KvCacheDtype dtype = model::KvCacheDtype::F32);

/// The host keys and values of a cache made by the CPU backend (CpuBackend::make_cache, make_host_kv_cache).
/// Throws UsageError when its storage belongs to another backend (a GPU cache) or to none.
CpuKvStorage& host_kv(model::KvCache& cache);

}  // namespace fp4serve::backends::cpu
