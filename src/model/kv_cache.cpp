// SPDX-License-Identifier: Apache-2.0
#include "model/kv_cache.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::model {

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
                 kernels::KvElement element)
    : layers_(num_layers),
      kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      element_(element),
      max_seq_len_(max_seq_len) {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_seq_len <= 0 || max_slots <= 0) {
    throw UsageError(fmt::format("KvCache: sizes must be positive (layers {}, kv heads {}, head_dim {}, seq {}, slots {})",
                                 num_layers, num_kv_heads, head_dim, max_seq_len, max_slots));
  }
  slots_.resize(static_cast<size_t>(max_slots));
}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
                 std::unique_ptr<KvStorage> storage, kernels::KvElement element)
    : KvCache(num_layers, num_kv_heads, head_dim, max_seq_len, max_slots, element) {
  if (storage == nullptr) throw UsageError("KvCache: backend storage is null");
  storage_ = std::move(storage);
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
  if (s.keys.empty() && storage_ == nullptr) {
    const auto bytes =
        static_cast<size_t>(layers_ * kv_heads_ * max_seq_len_ * head_dim_ * kernels::kv_element_bytes(element_));
    s.keys.resize(bytes);
    s.values.resize(bytes);
  }
  s.in_use = true;
  return true;
}

void KvCache::release(int slot) {
  if (slot < 0 || slot >= max_slots() || !slots_[static_cast<size_t>(slot)].in_use) {
    throw UsageError(fmt::format("KvCache: slot {} is not in use", slot));
  }
  slots_[static_cast<size_t>(slot)].in_use = false;
}

int KvCache::free_slots() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.in_use ? 0 : 1;
  return n;
}

namespace {
[[noreturn]] void throw_backend_storage() {
  throw UsageError("KvCache: this cache's keys and values live in a backend's memory (a GPU cache); the CPU "
                   "decoder cannot use it");
}
[[noreturn]] void throw_not_fp32(kernels::KvElement element) {
  throw UsageError(fmt::format("KvCache: key()/value() give fp32 rows but this cache stores {} (use key_data/rows)",
                               kernels::kv_element_name(element)));
}
}  // namespace

int64_t KvCache::offset(int64_t layer, int64_t kv_head, int64_t position) const {
  return ((layer * kv_heads_ + kv_head) * max_seq_len_ + position) * head_dim_;
}

void* KvCache::key_data(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (storage_ != nullptr) throw_backend_storage();
  return slots_[static_cast<size_t>(slot)].keys.data() +
         offset(layer, kv_head, position) * kernels::kv_element_bytes(element_);
}

void* KvCache::value_data(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (storage_ != nullptr) throw_backend_storage();
  return slots_[static_cast<size_t>(slot)].values.data() +
         offset(layer, kv_head, position) * kernels::kv_element_bytes(element_);
}

float* KvCache::key(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (element_ != kernels::KvElement::F32) throw_not_fp32(element_);
  return static_cast<float*>(key_data(slot, layer, kv_head, position));
}

float* KvCache::value(int slot, int64_t layer, int64_t kv_head, int64_t position) {
  if (element_ != kernels::KvElement::F32) throw_not_fp32(element_);
  return static_cast<float*>(value_data(slot, layer, kv_head, position));
}

kernels::KvRows KvCache::rows(int slot, int64_t layer) {
  return kernels::KvRows{key_data(slot, layer, 0, 0), value_data(slot, layer, 0, 0), head_dim_,
                         max_seq_len_ * head_dim_, element_};
}

}  // namespace fp4serve::model
