// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/cpu_kv_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <new>

#include "fp4serve/error.h"

namespace fp4serve::backends::cpu {
namespace {
constexpr std::align_val_t kRowAlignment{64};  // a cache line
}  // namespace

kernels::KvElement kv_element_of(model::KvCacheDtype dtype) {
  switch (dtype) {
    case model::KvCacheDtype::F32: return kernels::KvElement::F32;
    case model::KvCacheDtype::Bf16: return kernels::KvElement::Bf16;
    case model::KvCacheDtype::F16: return kernels::KvElement::F16;
  }
  return kernels::KvElement::F32;
}

CpuKvStorage::CpuKvStorage(int64_t layers_per_block, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                           int64_t block_size, kernels::KvElement element)
    : layers_(layers_per_block),
      kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      num_blocks_(num_blocks),
      block_size_(block_size),
      element_(element) {
  const auto bytes = static_cast<size_t>(layers_ * num_blocks_ * kv_heads_ * block_size_ * head_dim_ *
                                         kernels::kv_element_bytes(element_));
  // operator new[] leaves the bytes uninitialized: nothing is touched (committed) before a block is written.
  const auto allocate = [&] {
    return static_cast<std::byte*>(::operator new[](std::max<size_t>(bytes, 1), kRowAlignment));
  };
  keys_.reset(allocate());
  values_.reset(allocate());
}

void CpuKvStorage::AlignedDelete::operator()(std::byte* p) const { ::operator delete[](p, kRowAlignment); }

int64_t CpuKvStorage::offset(int32_t block, int64_t layer, int64_t kv_head, int64_t row) const {
  return (((layer * num_blocks_ + block) * kv_heads_ + kv_head) * block_size_ + row) * head_dim_;
}

void* CpuKvStorage::key_data(int32_t block, int64_t layer, int64_t kv_head, int64_t row) {
  return keys_.get() + offset(block, layer, kv_head, row) * kernels::kv_element_bytes(element_);
}

void* CpuKvStorage::value_data(int32_t block, int64_t layer, int64_t kv_head, int64_t row) {
  return values_.get() + offset(block, layer, kv_head, row) * kernels::kv_element_bytes(element_);
}

kernels::KvRows CpuKvStorage::rows(std::span<const int32_t> table, int64_t layer) const {
  const int64_t layer_bytes = offset(0, layer, 0, 0) * kernels::kv_element_bytes(element_);
  kernels::KvRows r{keys_.get() + layer_bytes, values_.get() + layer_bytes, head_dim_, block_size_ * head_dim_, element_};
  r.block_table = table.data();
  r.block_table_size = static_cast<int64_t>(table.size());
  r.block_size = block_size_;
  r.block_stride = kv_heads_ * block_size_ * head_dim_;
  return r;
}

model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                  const model::KvCacheSpec& spec, model::KvCacheDtype dtype) {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0) {
    throw UsageError(fmt::format("KvCache: sizes must be positive (layers {}, kv heads {}, head_dim {})", num_layers,
                                 num_kv_heads, head_dim));
  }
  // Checks the sizes and windows before any memory is reserved.
  const model::KvCacheSpec s = model::resolved_spec(spec, num_layers);
  const int64_t layers_per_block = model::kv_group_layout(num_layers, s).layers_per_block;
  return model::KvCache(num_layers, num_kv_heads, head_dim, s,
                        std::make_unique<CpuKvStorage>(layers_per_block, num_kv_heads, head_dim, s.num_blocks,
                                                       s.block_size, kv_element_of(dtype)),
                        dtype);
}

model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                                  int max_slots, model::KvCacheDtype dtype) {
  return make_host_kv_cache(num_layers, num_kv_heads, head_dim, model::KvCacheSpec{max_seq_len, max_slots}, dtype);
}

CpuKvStorage& host_kv(model::KvCache& cache) {
  auto* storage = dynamic_cast<CpuKvStorage*>(cache.storage());
  if (storage == nullptr) {
    throw UsageError("KvCache: this cache's keys and values live in a backend's memory (a GPU cache); the CPU "
                     "decoder cannot use it");
  }
  return *storage;
}

namespace {
void* host_row(model::KvCache& cache, int slot, int64_t layer, int64_t kv_head, int64_t position, bool key) {
  CpuKvStorage& kv = host_kv(cache);
  if (kv.element() != kernels::KvElement::F32) {
    throw UsageError(fmt::format("KvCache: host_key / host_value give fp32 rows but this cache stores {}",
                                 kernels::kv_element_name(kv.element())));
  }
  const int64_t bs = cache.block_size();
  if (layer < 0 || layer >= cache.num_layers()) {
    throw UsageError(fmt::format("KvCache: layer {} is outside [0, {})", layer, cache.num_layers()));
  }
  const std::span<const int32_t> table = cache.block_table(slot, cache.group_of_layer(layer));
  if (position < 0 || kv_head < 0 || kv_head >= cache.num_kv_heads() ||
      position / bs >= static_cast<int64_t>(table.size()) || table[static_cast<size_t>(position / bs)] < 0) {
    throw UsageError(fmt::format("KvCache: slot {} has no block for layer {}, KV head {}, position {}", slot, layer,
                                 kv_head, position));
  }
  const int32_t block = table[static_cast<size_t>(position / bs)];
  const int64_t row = cache.row_of_layer(layer);
  return key ? kv.key_data(block, row, kv_head, position % bs) : kv.value_data(block, row, kv_head, position % bs);
}
}  // namespace

float* host_key(model::KvCache& cache, int slot, int64_t layer, int64_t kv_head, int64_t position) {
  return static_cast<float*>(host_row(cache, slot, layer, kv_head, position, true));
}

float* host_value(model::KvCache& cache, int slot, int64_t layer, int64_t kv_head, int64_t position) {
  return static_cast<float*>(host_row(cache, slot, layer, kv_head, position, false));
}

}  // namespace fp4serve::backends::cpu
