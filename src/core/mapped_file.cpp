// SPDX-License-Identifier: Apache-2.0
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "fp4serve/error.h"

namespace fp4serve::core {
namespace {

[[noreturn]] void throw_os_error(const std::filesystem::path& path, const char* what, int err) {
  throw IoError(std::string(path.string()) + ": " + what + " failed: " + std::strerror(err));
}

// The whole file at a 2 MiB-aligned address, populated: a reservation one huge page larger, the file mapped over
// its aligned part, the slack at both ends given back. MAP_FAILED (errno set) on failure.
void* map_aligned(int fd, size_t size) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* reserved = ::mmap(nullptr, size + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  const auto base = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  void* mapping = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    ::munmap(reserved, size + kHuge);
    errno = err;
    return MAP_FAILED;
  }
  if (aligned > base) ::munmap(reserved, aligned - base);
  const uintptr_t end = aligned + size, reserved_end = base + size + kHuge;
  // munmap takes whole pages: the tail starts at the page after the file's last byte.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t tail = (end + page - 1) / page * page;
  if (reserved_end > tail) ::munmap(reinterpret_cast<void*>(tail), reserved_end - tail);
#ifdef MADV_HUGEPAGE
  // Pages the page cache does not hold yet are read in 2 MiB folios (the fault path's huge-page readahead), so a
  // cold file maps as huge pages too; advice only.
  (void)::madvise(mapping, size, MADV_HUGEPAGE);
#endif
  errno = EINVAL;
#ifdef MADV_POPULATE_READ
  if (::madvise(mapping, size, MADV_POPULATE_READ) == 0) return mapping;
#endif
  if (errno != EINVAL) {  // an I/O error, a file that shrank (EFAULT), no memory: a mapping that cannot be read
    const int err = errno;
    ::munmap(mapping, size);
    errno = err;
    return MAP_FAILED;
  }
  // Kernels before 5.14 have no MADV_POPULATE_READ: one read per page faults the pages in.
  volatile const unsigned char* bytes = static_cast<const unsigned char*>(mapping);
  for (size_t i = 0; i < size; i += page) (void)bytes[i];
  return mapping;
}

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path, Pages pages) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error(path, "open", errno);
  try {
    map(fd, pages);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

MappedFile::MappedFile(int fd, const std::filesystem::path& path, Pages pages) : path_(path) { map(fd, pages); }

void MappedFile::map(int fd, Pages pages) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_os_error(path_, "fstat", errno);
  if (!S_ISREG(st.st_mode)) throw IoError(path_.string() + ": not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;
  void* mapping = pages == Pages::Populate ? map_aligned(fd, size_) : ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) throw_os_error(path_, "mmap", errno);
  data_ = static_cast<const std::byte*>(mapping);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

bool MappedFile::release_pages(std::span<const std::byte> range) const noexcept {
  if (range.empty() || data_ == nullptr || range.data() < data_ || range.data() + range.size() > data_ + size_) {
    return false;
  }
  // Whole pages only: the partial pages at either end may hold a neighbouring tensor that is still read.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(range.data()) + page - 1) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(range.data() + range.size()) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  return true;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace fp4serve::core
