// SPDX-License-Identifier: Apache-2.0
#include "model/kv_cache.h"

#include <fmt/format.h>

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

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
                 std::unique_ptr<KvStorage> storage, KvCacheDtype element)
    : layers_(num_layers),
      kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      element_(element),
      max_seq_len_(max_seq_len) {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || max_seq_len <= 0 || max_slots <= 0) {
    throw UsageError(fmt::format("KvCache: sizes must be positive (layers {}, kv heads {}, head_dim {}, seq {}, slots {})",
                                 num_layers, num_kv_heads, head_dim, max_seq_len, max_slots));
  }
  if (storage == nullptr) throw UsageError("KvCache: backend storage is null");
  in_use_.resize(static_cast<size_t>(max_slots));
  storage_ = std::move(storage);
}

KvCache::KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
                 KvCacheDtype element)
    : KvCache(num_layers, num_kv_heads, head_dim, max_seq_len, max_slots, std::make_unique<KvStorage>(), element) {}

int KvCache::acquire() {
  for (size_t i = 0; i < in_use_.size(); ++i) {
    if (acquire(static_cast<int>(i))) return static_cast<int>(i);
  }
  return -1;
}

bool KvCache::acquire(int slot) {
  if (slot < 0 || slot >= max_slots()) {
    throw UsageError(fmt::format("KvCache: slot {} is outside [0, {})", slot, max_slots()));
  }
  if (in_use_[static_cast<size_t>(slot)]) return false;
  storage_->on_acquire(slot);
  in_use_[static_cast<size_t>(slot)] = true;
  return true;
}

void KvCache::release(int slot) {
  if (slot < 0 || slot >= max_slots() || !in_use_[static_cast<size_t>(slot)]) {
    throw UsageError(fmt::format("KvCache: slot {} is not in use", slot));
  }
  in_use_[static_cast<size_t>(slot)] = false;
}

int KvCache::free_slots() const {
  int n = 0;
  for (bool used : in_use_) n += used ? 0 : 1;
  return n;
}

}  // namespace fp4serve::model
