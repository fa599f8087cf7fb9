// SPDX-License-Identifier: Apache-2.0
#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <fstream>

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

TEST(MappedFile, MissingFileAndFolderThrowIoErrorNamingThePath) {
  try {
    MappedFile file("/nonexistent/fp4serve/x.safetensors");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/fp4serve/x.safetensors"), std::string::npos);
  }
  EXPECT_THROW(MappedFile(std::filesystem::temp_directory_path()), IoError);
}

}  // namespace
}  // namespace fp4serve::core
