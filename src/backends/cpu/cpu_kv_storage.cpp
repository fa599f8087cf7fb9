// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/cpu_kv_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "fp4serve/error.h"

namespace fp4serve::backends::cpu {

kernels::KvElement kv_element_of(model::KvCacheDtype dtype) {
  switch (dtype) {
    case model::KvCacheDtype::F32: return kernels::KvElement::F32;
    case model::KvCacheDtype::Bf16: return kernels::KvElement::Bf16;
    case model::KvCacheDtype::F16: return kernels::KvElement::F16;
  }
  return kernels::KvElement::F32;
}

CpuKvStorage::CpuKvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                           int max_slots, kernels::KvElement element)
    : layers_(num_layers),
      kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      max_seq_len_(max_seq_len),
      element_(element),
      slots_(static_cast<size_t>(std::max(max_slots, 0))) {}

void CpuKvStorage::on_acquire(int slot) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (!s.keys.empty()) return;
  const auto bytes =
      static_cast<size_t>(layers_ * kv_heads_ * max_seq_len_ * head_dim_ * kernels::kv_element_bytes(element_));
  s.keys.resize(bytes);
  s.values.resize(bytes);
}

namespace {
[[noreturn]] void throw_not_fp32(kernels::KvElement element) {
  throw UsageError(fmt::format("KvCache: key()/value() give fp32 rows but this cache stores {} (use key_data/rows)",
                               kernels::kv_element_name(element)));
}
}  // namespace

int64_t CpuKvStorage::offset(int64_t layer, int64_t kv_head, int64_t position) const {
  return ((layer * kv_heads_ + kv_head) * max_seq_len_ + position) * head_dim_;
}

void* CpuKvStorage::key_data(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  return slots_[static_cast<size_t>(slot)].keys.data() +
         offset(layer, kv_head, position) * kernels::kv_element_bytes(element_);
}

void* CpuKvStorage::value_data(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  return slots_[static_cast<size_t>(slot)].values.data() +
         offset(layer, kv_head, position) * kernels::kv_element_bytes(element_);
}

float* CpuKvStorage::key(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (element_ != kernels::KvElement::F32) throw_not_fp32(element_);
  return static_cast<float*>(key_data(slot, layer, kv_head, position));
}

float* CpuKvStorage::value(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (element_ != kernels::KvElement::F32) throw_not_fp32(element_);
  return static_cast<float*>(value_data(slot, layer, kv_head, position));
}

kernels::KvRows CpuKvStorage::rows(int slot, int64_t layer) {
  return kernels::KvRows{key_data(slot, layer, 0, 0), value_data(slot, layer, 0, 0), head_dim_,
                         max_seq_len_ * head_dim_, element_};
}

model::KvCache make_host_kv_cache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len,
                                  int max_slots, model::KvCacheDtype dtype) {
  // KvCache checks the sizes (the storage allocates nothing before a slot is acquired).
  return model::KvCache(
      num_layers, num_kv_heads, head_dim, max_seq_len, max_slots,
      std::make_unique<CpuKvStorage>(num_layers, num_kv_heads, head_dim, max_seq_len, max_slots, kv_element_of(dtype)),
      dtype);
}

CpuKvStorage& host_kv(model::KvCache& cache) {
  auto* storage = dynamic_cast<CpuKvStorage*>(cache.storage());
  if (storage == nullptr) {
    throw UsageError("KvCache: this cache's keys and values live in a backend's memory (a GPU cache); the CPU "
                     "decoder cannot use it");
  }
  return *storage;
}

}  // namespace fp4serve::backends::cpu
