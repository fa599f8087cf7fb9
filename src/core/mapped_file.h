// SPDX-License-Identifier: Apache-2.0
// Read-only memory mapping of a whole file. Checkpoint shards are mapped, never copied: tensor views point
// into the mapping, and pages are read from disk only when touched (so reading headers is cheap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace fp4serve::core {

class MappedFile {
 public:
  /// When the pages enter this process's page tables: on first touch (checkpoints: only the headers may be read),
  /// or all at once while mapping (MADV_POPULATE_READ: a file that is read whole, so the first pass pays no
  /// faults), at a 2 MiB-aligned address and advised MADV_HUGEPAGE: where the page cache holds the file in 2 MiB
  /// folios (ext4 and xfs make large folios; the advice makes a cold read use them) they are mapped as huge pages,
  /// one TLB entry each instead of 512. On Linux 6.18 / ext4 one thread streams a PMD-mapped file at the speed of
  /// huge anonymous pages, and 4 KiB pages at 0.68 of it.
  enum class Pages : uint8_t { OnTouch, Populate };
  /// Maps `path` read-only. Throws IoError (naming the path and the OS error) when it cannot be opened or
  /// mapped. A zero-length file maps to an empty span.
  explicit MappedFile(const std::filesystem::path& path, Pages pages = Pages::OnTouch);
  /// Maps the file open as `fd` (read access; not closed here), named `path` in messages: the file whose header a
  /// caller has just read, not whatever the path names by now.
  MappedFile(int fd, const std::filesystem::path& path, Pages pages);
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
  void map(int fd, Pages pages);
  void release() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp4serve::core
