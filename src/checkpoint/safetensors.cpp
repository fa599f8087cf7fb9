// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

using nlohmann::json;

[[noreturn]] void fail(std::string_view label, const std::string& what) {
  throw FormatError(fmt::format("{}: invalid safetensors file: {}", label, what));
}

// Returns the offset of the first byte that breaks UTF-8 (RFC 3629: no overlongs, no surrogates, ≤ U+10FFFF),
// or npos when the whole text is valid.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    size_t len = 0;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// Rejects a key that appears twice in one JSON object: the reference's serde map would keep only one of them,
// silently dropping a tensor. nlohmann keeps the last, so duplicates are caught during parsing.
json parse_rejecting_duplicate_keys(std::string_view text, std::string_view label) {
  std::vector<std::set<std::string>> keys_per_depth;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<size_t>(depth);
    switch (event) {
      case json::parse_event_t::object_start:
        if (keys_per_depth.size() <= d) keys_per_depth.resize(d + 1);
        keys_per_depth[d].clear();
        break;
      case json::parse_event_t::key: {
        // A key event is reported at the depth of the object's members.
        const size_t level = d == 0 ? 0 : d - 1;
        if (keys_per_depth.size() <= level) keys_per_depth.resize(level + 1);
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys_per_depth[level].insert(key).second) {
          fail(label, fmt::format("header repeats the key '{}'", key));
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_start:
      case json::parse_event_t::array_end:
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond a double
    fail(label, fmt::format("header is not valid JSON ({})", e.what()));
  }
}

uint64_t read_u64_le(std::span<const std::byte> bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  return v;
}

std::vector<int64_t> parse_shape(const json& shape, std::string_view label, const std::string& name) {
  if (!shape.is_array()) fail(label, fmt::format("tensor '{}': shape is {}, expected a list of integers", name, shape.dump()));
  std::vector<int64_t> dims;
  dims.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& d = shape[i];
    if (!d.is_number_unsigned()) {
      fail(label, fmt::format("tensor '{}': shape[{}] is {}, expected a non-negative integer", name, i, d.dump()));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(label, fmt::format("tensor '{}': shape[{}] = {} overflows a 64-bit size", name, i, v));
    }
    dims.push_back(static_cast<int64_t>(v));
  }
  return dims;
}

// numel × bits / 8 with overflow checks; the byte count must be whole (sub-byte dtypes pack densely).
uint64_t expected_bytes(const std::vector<int64_t>& shape, core::DType dtype, std::string_view label,
                        const std::string& name) {
  bool has_zero = false;
  for (int64_t d : shape) has_zero = has_zero || d == 0;
  if (has_zero) return 0;
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      fail(label, fmt::format("tensor '{}': shape {} has more elements than fit in 64 bits", name,
                              core::shape_to_string(shape)));
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, uint64_t{core::dtype_bits(dtype)}, &bits)) {
    fail(label, fmt::format("tensor '{}': shape {} of {} needs more bytes than fit in 64 bits", name,
                            core::shape_to_string(shape), core::dtype_name(dtype)));
  }
  if (bits % 8 != 0) {
    fail(label, fmt::format("tensor '{}': {} elements of {} ({} bits each) do not fill whole bytes", name, numel,
                            core::dtype_name(dtype), core::dtype_bits(dtype)));
  }
  return bits / 8;
}

TensorEntry parse_entry(const std::string& name, const json& info, std::string_view label) {
  if (!info.is_object()) fail(label, fmt::format("tensor '{}': entry is {}, expected an object", name, info.type_name()));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(key)) fail(label, fmt::format("tensor '{}': entry has no '{}'", name, key));
  }
  TensorEntry entry;
  entry.name = name;
  const json& dtype = info["dtype"];
  if (!dtype.is_string()) fail(label, fmt::format("tensor '{}': dtype is {}, expected a string", name, dtype.dump()));
  const auto parsed = core::parse_dtype(dtype.get_ref<const std::string&>());
  if (!parsed) fail(label, fmt::format("tensor '{}': unknown dtype '{}'", name, dtype.get_ref<const std::string&>()));
  entry.dtype = *parsed;
  entry.shape = parse_shape(info["shape"], label, name);
  const json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(label, fmt::format("tensor '{}': data_offsets is {}, expected [begin, end] of non-negative integers", name,
                            offsets.dump()));
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.end < entry.begin) {
    fail(label, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name, entry.begin, entry.end));
  }
  const uint64_t want = expected_bytes(entry.shape, entry.dtype, label, name);
  if (entry.end - entry.begin != want) {
    fail(label, fmt::format("tensor '{}': data_offsets [{}, {}] span {} bytes, but {} {} needs {} bytes", name,
                            entry.begin, entry.end, entry.end - entry.begin, core::dtype_name(entry.dtype),
                            core::shape_to_string(entry.shape), want));
  }
  return entry;
}

std::map<std::string, std::string> parse_metadata(const json& meta, std::string_view label) {
  std::map<std::string, std::string> out;
  if (meta.is_null()) return out;
  if (!meta.is_object()) fail(label, fmt::format("__metadata__ is {}, expected a map of strings", meta.type_name()));
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      fail(label, fmt::format("__metadata__['{}'] is {}, expected a string", key, value.dump()));
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes, std::string_view label) {
  if (file_bytes.size() < 8) {
    fail(label, fmt::format("file is {} bytes, shorter than the 8-byte header length prefix", file_bytes.size()));
  }
  SafetensorsHeader header;
  header.header_bytes = read_u64_le(file_bytes.first(8));
  if (header.header_bytes > kMaxSafetensorsHeaderBytes) {
    fail(label, fmt::format("header length {} exceeds the limit of {} bytes", header.header_bytes,
                            kMaxSafetensorsHeaderBytes));
  }
  if (header.header_bytes > file_bytes.size() - 8) {
    fail(label, fmt::format("header length {} runs past the end of the file ({} bytes after the prefix)",
                            header.header_bytes, file_bytes.size() - 8));
  }
  header.data_bytes = file_bytes.size() - 8 - header.header_bytes;
  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8, header.header_bytes);
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    fail(label, fmt::format("header is not valid UTF-8 (bad byte 0x{:02x} at header offset {})",
                            static_cast<unsigned char>(text[bad]), bad));
  }
  if (text.empty() || text.front() != '{') fail(label, "header does not start with '{'");
  const json root = parse_rejecting_duplicate_keys(text, label);
  if (!root.is_object()) fail(label, fmt::format("header is a JSON {}, expected an object", root.type_name()));

  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      header.metadata = parse_metadata(value, label);
    } else {
      header.tensors.push_back(parse_entry(key, value, label));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : header.tensors) {
    if (t.begin < cursor) {
      fail(label, fmt::format("tensor '{}' at bytes [{}, {}) overlaps tensor '{}' that ends at {}", t.name, t.begin,
                              t.end, previous->name, cursor));
    }
    if (t.begin > cursor) {
      fail(label, fmt::format("tensor '{}' starts at byte {}, leaving a gap after byte {}", t.name, t.begin, cursor));
    }
    cursor = t.end;
    previous = &t;
  }
  if (cursor != header.data_bytes) {
    fail(label, fmt::format("tensors cover {} bytes of the data buffer, but the file holds {} bytes after the header",
                            cursor, header.data_bytes));
  }
  return header;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(path), header_(parse_safetensors_header(file_.bytes(), path.string())) {
  index_.reserve(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

core::TensorView SafetensorsFile::view(const TensorEntry& entry) const {
  core::TensorView v;
  v.dtype = entry.dtype;
  v.shape = entry.shape;
  v.bytes = file_.bytes().subspan(header_.data_start() + entry.begin, entry.end - entry.begin);
  return v;
}

}  // namespace fp4serve::checkpoint
