// SPDX-License-Identifier: Apache-2.0
// The CPU backend's KV cache memory (model::KvStorage): the blocks of a model::KvCache's pool in host memory,
// laid out [layer][block][kv_head][block position][head_dim] in fp32, bf16 or fp16 elements (kernels::KvElement),
// so that attention, which reads one KV head's keys for all positions at a time, reads a block's run of them
// contiguously (with [position][kv_heads · head_dim] rows it read 1/KVH of each row, and ran at 8 GB/s instead of
// 13 with 8 KV heads: bench_ops BM_AttentionCold). The pool is reserved at once but not touched: the operating
// system commits its pages as blocks are first written (the pool hands out blocks from the front of its free
// queue, so a lightly used pool stays mostly uncommitted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "backends/cpu/kernels/attention.h"
#include "model/kv_cache.h"

namespace fp4serve::backends::cpu {

/// The CPU element of a device-neutral KV cache dtype.
kernels::KvElement kv_element_of(model::KvCacheDtype dtype);

class CpuKvStorage final : public model::KvStorage {
 public:
  /// `num_blocks` blocks of `block_size` positions of `layers_per_block` layers each (KvCache::layers_per_block)
  /// for the KvCache that owns it (sizes positive: KvCache checks them). Throws std::bad_alloc when the address
  /// space cannot be reserved.
  CpuKvStorage(int64_t layers_per_block, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
               int64_t block_size, kernels::KvElement element);

  kernels::KvElement element() const { return element_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t num_kv_heads() const { return kv_heads_; }
  int64_t block_size() const { return block_size_; }

  /// Key / value of `kv_head` at row `offset` (< block_size) of `block` for the layer at `layer_row` of the
  /// block's group (KvCache::row_of_layer): head_dim elements of element(); the block's next row follows.
  void* key_data(int32_t block, int64_t layer_row, int64_t kv_head, int64_t offset);
  void* value_data(int32_t block, int64_t layer_row, int64_t kv_head, int64_t offset);
  /// The keys and values of the layer at `layer_row` of a sequence whose block table (of that layer's group) is
  /// `table`, as kernels::attention reads them (paged).
  kernels::KvRows rows(std::span<const int32_t> table, int64_t layer_row) const;

 private:
  int64_t offset(int32_t block, int64_t layer, int64_t kv_head, int64_t row) const;  // in elements

  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  int64_t num_blocks_;
  int64_t block_size_;
  kernels::KvElement element_;
  // Cache-line aligned, so that a row of 64 bf16 is two whole lines: new[]'s 16-byte offset split every other
  // 32-byte load across two lines (bench_ops BM_DecodeAttentionPaged 1.4–1.6× slower). Not initialized: pages are
  // committed on first write.
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], AlignedDelete> keys_, values_;
};

/// A KvCache with `spec`'s pool and its keys and values in host memory (CpuKvStorage holding kv_element_of(dtype)):
/// what CpuBackend::make_cache returns, and a host cache for fakes. Throws UsageError on non-positive sizes.
model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                  const model::KvCacheSpec& spec, model::KvCacheDtype dtype = model::KvCacheDtype::F32);
/// The same with spec {max_seq_len, max_slots}.
model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                                  int max_slots, model::KvCacheDtype dtype = model::KvCacheDtype::F32);

/// The host keys and values of a cache made by the CPU backend (CpuBackend::make_cache, make_host_kv_cache).
/// Throws UsageError when its storage belongs to another backend (a GPU cache) or to none.
CpuKvStorage& host_kv(model::KvCache& cache);

/// The fp32 key / value of `kv_head` at `position` of `slot` in `layer` of a CPU cache, found through the slot's
/// block table (head_dim floats; the next position of the same block follows). For tests and host tools. Throws
/// UsageError when the cache is not a host one, stores 16-bit elements, or the position has no block.
float* host_key(model::KvCache& cache, int slot, int64_t layer, int64_t kv_head, int64_t position);
float* host_value(model::KvCache& cache, int slot, int64_t layer, int64_t kv_head, int64_t position);

}  // namespace fp4serve::backends::cpu
