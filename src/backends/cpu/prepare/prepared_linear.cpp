// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/prepare/prepared_linear.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "backends/cpu/prepare/repack_util.h"
#include "quant/formats.h"

namespace fp4serve::prepare {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc requires a multiple of the alignment
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_.reset(p);
}

AlignedBuffer::AlignedBuffer(const AlignedBuffer& other) : AlignedBuffer(other.size_) {
  if (size_ > 0) std::memcpy(data_.get(), other.data_.get(), size_);
}

AlignedBuffer& AlignedBuffer::operator=(const AlignedBuffer& other) {
  if (this != &other) *this = AlignedBuffer(other);
  return *this;
}

void AlignedBuffer::Free::operator()(std::byte* p) const {
  if (chunk == nullptr) std::free(p);
}

AlignedBuffer AlignedBuffer::copy_into(HugePageArena& arena, const AlignedBuffer& source) {
  AlignedBuffer out;
  if (source.size_ == 0) return out;
  const size_t rounded = (source.size_ + 63) / 64 * 64;
  std::shared_ptr<void> chunk;
  std::byte* p = arena.allocate(rounded, chunk);
  std::memcpy(p, source.data_.get(), source.size_);
  std::memset(p + source.size_, 0, rounded - source.size_);  // as zero-initialised as the source's padding
  out.data_ = std::unique_ptr<std::byte[], Free>(p, Free{std::move(chunk)});
  out.size_ = source.size_;
  return out;
}

AlignedBuffer AlignedBuffer::zeroed_in(HugePageArena& arena, size_t bytes) {
  AlignedBuffer out;
  if (bytes == 0) return out;
  std::shared_ptr<void> chunk;
  std::byte* p = arena.allocate(bytes, chunk);
  out.data_ = std::unique_ptr<std::byte[], Free>(p, Free{std::move(chunk)});
  out.size_ = bytes;
  return out;
}

AlignedBuffer AlignedBuffer::view(std::shared_ptr<const void> owner, const std::byte* data, size_t bytes) {
  if (owner == nullptr) throw UsageError("AlignedBuffer::view: a view needs the owner of its bytes");
  if (reinterpret_cast<uintptr_t>(data) % 64 != 0) {
    throw UsageError(fmt::format("AlignedBuffer::view: {} bytes at an address that is not 64-byte aligned", bytes));
  }
  AlignedBuffer out;
  if (bytes == 0) return out;
  out.data_ = std::unique_ptr<std::byte[], Free>(const_cast<std::byte*>(data),
                                                 Free{std::const_pointer_cast<void>(std::move(owner))});
  out.size_ = bytes;
  return out;
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
thread_local HugePageArena* t_weight_arena = nullptr;
}  // namespace

ScopedWeightArena::ScopedWeightArena(HugePageArena* arena) : previous_(t_weight_arena) { t_weight_arena = arena; }
ScopedWeightArena::~ScopedWeightArena() { t_weight_arena = previous_; }
HugePageArena* ScopedWeightArena::current() { return t_weight_arena; }

struct HugePageArena::State {
  mutable std::mutex mutex;
  size_t chunk_bytes;
  std::shared_ptr<void> chunk;  // the chunk being filled
  std::byte* base = nullptr;
  size_t capacity = 0, used = 0, handed_out = 0;
};

HugePageArena::HugePageArena(size_t chunk_bytes) : state_(std::make_shared<State>()) {
  state_->chunk_bytes = (std::max(chunk_bytes, kHugePage) + kHugePage - 1) / kHugePage * kHugePage;
}

std::byte* HugePageArena::allocate(size_t bytes, std::shared_ptr<void>& chunk) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  const std::lock_guard lock(state_->mutex);
  State& s = *state_;
  if (s.chunk == nullptr || s.used + rounded > s.capacity) {
    const size_t size = std::max(s.chunk_bytes, (rounded + kHugePage - 1) / kHugePage * kHugePage);
    // A fresh anonymous mapping (zero-filled by the kernel, which zeroed_in relies on), 2 MiB aligned inside a
    // mapping one huge page larger.
    void* raw = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    auto* p = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) / kHugePage * kHugePage);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages the memory works the same
#endif
    s.chunk = std::shared_ptr<void>(raw, [size](void* q) { ::munmap(q, size + kHugePage); });
    s.base = p;
    s.capacity = size;
    s.used = 0;
  }
  std::byte* out = s.base + s.used;
  s.used += rounded;
  s.handed_out += rounded;
  chunk = s.chunk;
  return out;
}

size_t HugePageArena::used_bytes() const {
  const std::lock_guard lock(state_->mutex);
  return state_->handed_out;
}

void move_weights_into(PreparedLinear& w, HugePageArena& arena) {
  for (AlignedBuffer* buffer : {&w.codes, &w.scales, &w.offsets}) *buffer = AlignedBuffer::copy_into(arena, *buffer);
}

size_t weight_bytes(const PreparedLinear& w) {
  return w.codes.size() + w.scales.size() + w.offsets.size() + w.global_scale.size() * sizeof(float);
}

const char* layout_name(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::Fp4: return "Fp4";
    case WeightLayout::Int4: return "Int4";
    case WeightLayout::Fp8: return "Fp8";
    case WeightLayout::Int8: return "Int8";
    case WeightLayout::Dense: return "Dense";
  }
  return "?";
}

std::string_view format_label(const PreparedLinear& w) {
  return w.layout == WeightLayout::Fp4 ? quant::block_format_name(w.block_format) : layout_name(w.layout);
}

namespace detail {

void init_tiles(PreparedLinear& w, WeightLayout layout, int64_t n, int64_t k, int64_t group_size,
                size_t code_bytes_per_tile, size_t scale_bytes_per_tile, size_t offset_bytes_per_tile) {
  w.layout = layout;
  w.out_features = n;
  w.in_features = k;
  w.group_size = group_size;
  const int64_t row_multiple = layout == WeightLayout::Fp4 || layout == WeightLayout::Int4 ? kPairedTiles * kTileRows : kTileRows;
  w.padded_rows = (n + row_multiple - 1) / row_multiple * row_multiple;
  const auto tiles = static_cast<size_t>(w.tiles());
  HugePageArena* arena = ScopedWeightArena::current();
  const auto buffer = [arena](size_t bytes) {
    return arena != nullptr ? AlignedBuffer::zeroed_in(*arena, bytes) : AlignedBuffer(bytes);
  };
  w.codes = buffer(tiles * code_bytes_per_tile);
  w.scales = buffer(tiles * scale_bytes_per_tile);
  w.offsets = buffer(tiles * offset_bytes_per_tile);
}

}  // namespace detail
std::string_view activation_precision_name(ActivationPrecision precision) {
  switch (precision) {
    case ActivationPrecision::Fp32: return "fp32";
    case ActivationPrecision::Bf16: return "bf16";
    case ActivationPrecision::Int8: return "int8";
    case ActivationPrecision::Int8Decode: return "int8-decode";
    case ActivationPrecision::Bf16DecodeInt8: return "bf16-decode-int8";
  }
  return "?";
}

}  // namespace fp4serve::prepare
