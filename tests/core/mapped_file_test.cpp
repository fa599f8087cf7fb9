// SPDX-License-Identifier: Apache-2.0
#include "core/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "core/memory_stats.h"
#include "fp4serve/error.h"

namespace fp4serve::core {
namespace {

TEST(MappedFile, MapsBytesExactly) {
  const auto path = std::filesystem::temp_directory_path() / "fp4serve_mapped_file_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 1000; ++i) out.put(static_cast<char>(i * 7 + 3));
  }
  const MappedFile file(path);
  ASSERT_EQ(file.bytes().size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(static_cast<uint8_t>(file.bytes()[i]), static_cast<uint8_t>(i * 7 + 3));
  std::filesystem::remove(path);
}

// Populate maps at a 2 MiB boundary (huge pages for large page-cache folios) and returns the slack of the
// reservation: the bytes are the file's, to its last byte (a size that is no whole number of pages), from a path or
// from an open descriptor, and the mapping outlives that descriptor.
TEST(MappedFile, PopulateMapsAtAHugePageBoundary) {
  const auto path = std::filesystem::temp_directory_path() / "fp4serve_mapped_file_populate_test.bin";
  const size_t size = (size_t{3} << 20) + 123;
  {
    std::ofstream out(path, std::ios::binary);
    for (size_t i = 0; i < size; ++i) out.put(static_cast<char>((i * 131 + 7) % 251));
  }
  const auto check = [&](const MappedFile& file) {
    ASSERT_EQ(file.bytes().size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(file.bytes().data()) % (uintptr_t{2} << 20), 0u);
    for (size_t i = 0; i < size; i += 4093) {
      ASSERT_EQ(static_cast<uint8_t>(file.bytes()[i]), (i * 131 + 7) % 251) << i;
    }
    EXPECT_EQ(static_cast<uint8_t>(file.bytes()[size - 1]), ((size - 1) * 131 + 7) % 251);
  };
  check(MappedFile(path, MappedFile::Pages::Populate));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const MappedFile from_fd(fd, path, MappedFile::Pages::Populate);
  ::close(fd);
  std::filesystem::remove(path);
  check(from_fd);
}

TEST(MappedFile, MissingFileAndFolderThrowIoErrorNamingThePath) {
  try {
    MappedFile file("/nonexistent/fp4serve/x.safetensors");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/fp4serve/x.safetensors"), std::string::npos);
  }
  EXPECT_THROW(MappedFile(std::filesystem::temp_directory_path()), IoError);
}

TEST(MappedFile, ReleasePagesDropsResidentPagesAndKeepsTheBytes) {
  const auto path = std::filesystem::temp_directory_path() / "fp4serve_release_pages_test.bin";
  constexpr size_t kBytes = size_t{32} << 20;
  {
    std::ofstream out(path, std::ios::binary);
    for (size_t i = 0; i < kBytes; ++i) out.put(static_cast<char>(i * 13 + 5));
  }
  const MappedFile file(path);
  const auto bytes = file.bytes();
  const int64_t before = process_memory().file;
  uint64_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += static_cast<uint8_t>(bytes[i]);  // fault every page in
  const int64_t touched = process_memory().file;
  EXPECT_GE(touched - before, static_cast<int64_t>(kBytes) * 3 / 4) << "sum " << sum;
  EXPECT_TRUE(file.release_pages(bytes));
  const int64_t released = process_memory().file;
  EXPECT_LE(released, touched - static_cast<int64_t>(kBytes) * 3 / 4);
  // The view stays valid: the bytes fault in again from the file.
  for (size_t i = 0; i < kBytes; i += 4099) ASSERT_EQ(static_cast<uint8_t>(bytes[i]), static_cast<uint8_t>(i * 13 + 5));
  // Bytes outside the mapping (a heap buffer) are refused and left alone.
  std::vector<std::byte> heap(8192, std::byte{7});
  EXPECT_FALSE(file.release_pages(heap));
  EXPECT_EQ(heap[100], std::byte{7});
  EXPECT_FALSE(file.release_pages(std::span<const std::byte>(bytes.data() + kBytes - 10, 20)));  // runs past the end
  std::filesystem::remove(path);
}

TEST(MemoryStats, ParsesProcFieldsInKibibytes) {
  const std::string status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t1024 kB\nRssAnon:\t 12 kB\nThreads:\t3\n";
  EXPECT_EQ(proc_field_bytes(status, "VmHWM"), 2048 * 1024);
  EXPECT_EQ(proc_field_bytes(status, "VmRSS"), 1024 * 1024);
  EXPECT_EQ(proc_field_bytes(status, "RssAnon"), 12 * 1024);
  EXPECT_EQ(proc_field_bytes(status, "Threads"), 3);
  EXPECT_EQ(proc_field_bytes(status, "RssFile"), 0);  // absent
  EXPECT_EQ(proc_field_bytes(status, "Vm"), 0);       // a prefix of a key is not the key
  const ProcessMemory m = process_memory();
  EXPECT_GT(m.rss, 0);
  EXPECT_GE(m.peak_rss, m.rss);
  EXPECT_GT(system_memory().total, 0);
  // A peak reset brings VmHWM down to the resident memory after a large buffer is freed.
  {
    std::vector<char> big(size_t{256} << 20, 1);
    EXPECT_EQ(std::count(big.begin(), big.end(), 1), static_cast<std::ptrdiff_t>(big.size()));
    EXPECT_GE(process_memory().peak_rss, static_cast<int64_t>(big.size()));
  }
  if (reset_peak_rss()) {
    EXPECT_LT(process_memory().peak_rss, m.peak_rss + (int64_t{128} << 20));
  }
}

}  // namespace
}  // namespace fp4serve::core
