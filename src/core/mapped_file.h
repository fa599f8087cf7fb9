// SPDX-License-Identifier: Apache-2.0
// Read-only memory mapping of a whole file. Checkpoint shards are mapped, never copied: tensor views point
// into the mapping, and pages are read from disk only when touched (so reading headers is cheap).
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace fp4serve::core {

class MappedFile {
 public:
  /// Maps `path` read-only. Throws IoError (naming the path and the OS error) when it cannot be opened or
  /// mapped. A zero-length file maps to an empty span.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

  /// Drops this process's resident pages of the whole pages inside `range` (madvise MADV_DONTNEED): for weights
  /// that were repacked into the device's own copy, so that the checkpoint does not stay resident beside it.
  /// Views stay valid: a later read faults the bytes in again from the file (the mapping is private and
  /// read-only, so nothing is lost). Returns false, and does nothing, when `range` is not inside this mapping.
  bool release_pages(std::span<const std::byte> range) const noexcept;

 private:
  void release() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp4serve::core
