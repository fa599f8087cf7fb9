// SPDX-License-Identifier: Apache-2.0
// The safetensors container: strict header validation and zero-copy tensor views over a memory-mapped file.
// Rules follow the reference implementation (huggingface/safetensors `safetensors/src/tensor.rs`), see
// docs/FORMATS.md §6.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor_view.h"

namespace fp4serve::checkpoint {

/// Largest header the reference accepts (100 MB, `MAX_HEADER_SIZE` in safetensors).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// One tensor entry of a safetensors header.
struct TensorEntry {
  std::string name;
  core::DType dtype = core::DType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< byte offset of the first byte, relative to the data buffer
  uint64_t end = 0;    ///< one past the last byte, relative to the data buffer
};

/// A validated header.
struct SafetensorsHeader {
  uint64_t header_bytes = 0;  ///< N, the JSON length stored in the 8-byte prefix
  uint64_t data_bytes = 0;    ///< size of the data buffer that follows the header
  std::vector<TensorEntry> tensors;  ///< sorted by data offset (file order)
  std::map<std::string, std::string> metadata;  ///< `__metadata__`, empty when absent

  /// Byte offset of the data buffer inside the file (8 + N).
  uint64_t data_start() const { return 8 + header_bytes; }
};

/// Parses and validates the header of a safetensors file held in `file_bytes` (the whole file; only the
/// first 8 + N bytes are read). `label` names the file in error messages.
/// Throws FormatError when: the file is shorter than 8 bytes; N > 100 MB or runs past the end of the file;
/// the header is not UTF-8, does not start with '{', is not a JSON object or repeats a key; an entry has an
/// unknown dtype, a shape that is not a list of non-negative integers, a numel whose byte size overflows
/// 64 bits, `data_offsets` that are not two non-negative integers with begin ≤ end, a byte count that differs
/// from numel × element size; the regions overlap, leave a gap, or do not cover the data buffer exactly;
/// `__metadata__` is not a map of strings. 0-d and empty tensors are accepted.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes, std::string_view label);

/// A memory-mapped safetensors file with a validated header.
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Throws IoError (cannot open/map) or FormatError (see parse_safetensors_header).
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t file_bytes() const { return file_.bytes().size(); }

  /// The entry named `name`, or nullptr.
  const TensorEntry* find(std::string_view name) const;

  /// A view of `entry`'s bytes (which must belong to this file). Touches no data page.
  core::TensorView view(const TensorEntry& entry) const;

  /// Drops the resident pages of `bytes` when they lie in this file's mapping (core::MappedFile::release_pages);
  /// returns whether they did.
  bool release_pages(std::span<const std::byte> bytes) const noexcept { return file_.release_pages(bytes); }

 private:
  core::MappedFile file_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace fp4serve::checkpoint
