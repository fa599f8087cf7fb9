// SPDX-License-Identifier: Apache-2.0
// Per-sequence key/value cache: the slot bookkeeping, the same for every backend, over keys and values that live in
// a backend's memory (KvStorage, made by Backend::make_cache: the CPU keeps fp32, bf16 or fp16 elements
// [layer][kv_head][position][head_dim] in host memory, backends/cpu/cpu_kv_storage.h; the GPU fp32
// [layer][position][kv_heads · head_dim] rows in device memory). The element type is the device-neutral
// KvCacheDtype (--kv-cache-dtype); each backend maps it to its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace fp4serve::model {

/// Element type of a KV cache (--kv-cache-dtype fp32 | bf16 | fp16). A 16-bit cache differs from an fp32 one only
/// by the rounding of the stored keys and values (to nearest even); attention computes in fp32. Bf16 keeps fp32's
/// range with 8 significant bits; F16 has 11 bits but overflows to ±inf above 65504.
enum class KvCacheDtype : uint8_t { F32, Bf16, F16 };

/// Bytes per element: 4, 2, 2.
int64_t kv_cache_dtype_bytes(KvCacheDtype dtype);
/// "fp32", "bf16", "fp16" (the --kv-cache-dtype spelling).
std::string_view kv_cache_dtype_name(KvCacheDtype dtype);

/// Keys and values kept by a backend; KvCache only owns it. The backend that made it recognises its own type
/// (ForwardModel::forward throws UsageError for a cache made by another backend).
class KvStorage {
 public:
  virtual ~KvStorage() = default;
  /// Called when `slot` is acquired (KvCache::acquire), before it is used: a storage that allocates per slot does
  /// it here (and keeps the memory for reuse). Default: nothing.
  virtual void on_acquire(int /*slot*/) {}
};

class KvCache {
 public:
  /// `max_slots` sequences of up to `max_seq_len` positions each, with the keys and values in `storage`, which
  /// holds `element`s. Throws UsageError on non-positive sizes or a null storage.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
          std::unique_ptr<KvStorage> storage, KvCacheDtype element = KvCacheDtype::F32);
  /// The slot bookkeeping alone: its storage is a plain KvStorage that holds nothing, so no backend runs a step on
  /// it (a fake model's cache, or a wrapper's). Throws UsageError on non-positive sizes.
  KvCache(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t max_seq_len, int max_slots,
          KvCacheDtype element = KvCacheDtype::F32);

  /// A free slot, or −1 when all are in use.
  int acquire();
  /// Takes `slot` itself (its storage told by KvStorage::on_acquire, like acquire) and returns true, or false when
  /// it is already in use: a tensor-parallel rank mirrors the slots rank 0's scheduler chose. Throws UsageError
  /// outside [0, max_slots).
  bool acquire(int slot);
  /// Returns a slot to the pool; its contents become garbage.
  void release(int slot);
  int free_slots() const;
  int max_slots() const { return static_cast<int>(in_use_.size()); }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t num_kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  KvCacheDtype element() const { return element_; }

  int64_t num_layers() const { return layers_; }

  /// The backend storage (never null).
  KvStorage* storage() const { return storage_.get(); }

 private:
  int64_t layers_;
  int64_t kv_heads_;
  int64_t head_dim_;
  KvCacheDtype element_ = KvCacheDtype::F32;
  int64_t max_seq_len_;
  std::vector<bool> in_use_;
  std::unique_ptr<KvStorage> storage_;
};

}  // namespace fp4serve::model
