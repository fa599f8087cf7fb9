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

 private:
  void release() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp4serve::core
