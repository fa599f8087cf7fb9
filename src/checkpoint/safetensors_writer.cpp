// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/safetensors_writer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/tensor_view.h"
#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

using core::DType;

// Position of a dtype in safetensors' `Dtype` enum (Rust, declaration order), which the writer sorts by in
// descending order. Checked against safetensors 0.8.0 by writing every torch dtype it supports; the two F6 tags
// (not producible from torch) are placed by bit width between F4 and U8, like the FP8 tags around them.
int dtype_rank(DType d) {
  switch (d) {
    case DType::Bool: return 0;
    case DType::F4: return 1;
    case DType::F6_E2M3: return 2;
    case DType::F6_E3M2: return 3;
    case DType::U8: return 4;
    case DType::I8: return 5;
    case DType::F8_E5M2: return 6;
    case DType::F8_E4M3: return 7;
    case DType::F8_E8M0: return 8;
    case DType::F8_E4M3FNUZ: return 9;
    case DType::F8_E5M2FNUZ: return 10;
    case DType::I16: return 11;
    case DType::U16: return 12;
    case DType::F16: return 13;
    case DType::BF16: return 14;
    case DType::I32: return 15;
    case DType::U32: return 16;
    case DType::F32: return 17;
    case DType::C64: return 18;
    case DType::F64: return 19;
    case DType::I64: return 20;
    case DType::U64: return 21;
  }
  return -1;  // unreachable: every enumerator is listed above (-Wswitch-enum checks it)
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(fmt::format("{}: cannot open for writing: {}", path.string(), std::strerror(errno)));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw IoError(fmt::format("{}: write failed: {}", path.string(), std::strerror(errno)));
}

}  // namespace

uint64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw UsageError(fmt::format("tensor shape {} has a negative dimension", core::shape_to_string(shape)));
    if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / 64 / static_cast<uint64_t>(d)) {
      throw UsageError(fmt::format("tensor shape {} overflows 64 bits", core::shape_to_string(shape)));
    }
    numel *= static_cast<uint64_t>(d);
  }
  return (numel * core::dtype_bits(dtype) + 7) / 8;
}

std::vector<std::byte> serialize_safetensors(std::span<const TensorRecord> tensors,
                                             const std::map<std::string, std::string>& metadata) {
  std::vector<size_t> order(tensors.size());
  std::set<std::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    order[i] = i;
    const TensorRecord& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      throw UsageError(fmt::format("safetensors writer: invalid tensor name \"{}\"", t.name));
    }
    if (!names.insert(t.name).second) throw UsageError(fmt::format("safetensors writer: duplicate tensor {}", t.name));
    const uint64_t expected = tensor_bytes(t.dtype, t.shape);
    if (expected != t.bytes.size()) {
      throw UsageError(fmt::format("safetensors writer: tensor {} ({} {}) has {} bytes where {} were expected", t.name,
                                   core::dtype_name(t.dtype), core::shape_to_string(t.shape), t.bytes.size(),
                                   expected));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ra = dtype_rank(tensors[a].dtype);
    const int rb = dtype_rank(tensors[b].dtype);
    return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
  });

  // The header is built as text because the order of its keys is part of the format we imitate and a JSON
  // object type would re-sort them; nlohmann only escapes the strings.
  std::string header = "{";
  if (!metadata.empty()) header += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorRecord& t = tensors[i];
    if (header.size() > 1) header += ',';
    header += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          nlohmann::json(t.name).dump(), core::dtype_name(t.dtype), fmt::join(t.shape, ","), offset,
                          offset + t.bytes.size());
    offset += t.bytes.size();
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<std::byte> out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<std::byte>((n >> (8 * b)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (size_t i : order) out.insert(out.end(), tensors[i].bytes.begin(), tensors[i].bytes.end());
  return out;
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecord> tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(path, serialize_safetensors(tensors, metadata));
}

std::vector<std::vector<size_t>> plan_shards(std::span<const uint64_t> sizes, uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) throw UsageError("plan_shards: the maximum shard size must be positive");
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + sizes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += sizes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index, count);
}

void write_safetensors_index(const std::filesystem::path& dir, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_bytes) {
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  write_file(dir / "model.safetensors.index.json",
             std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

}  // namespace fp4serve::checkpoint
