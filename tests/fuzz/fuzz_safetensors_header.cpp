// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes as a safetensors file. The parser must either return a header whose
// entries lie inside the data buffer or throw FormatError; anything else (crash, sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto header = fp4serve::checkpoint::parse_safetensors_header(bytes, "fuzz-input");
    for (const auto& t : header.tensors) {
      if (t.end > header.data_bytes || t.begin > t.end) __builtin_trap();
    }
  } catch (const fp4serve::FormatError&) {
  }
  return 0;
}
