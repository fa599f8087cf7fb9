// SPDX-License-Identifier: Apache-2.0
// A checkpoint as the Hugging Face ecosystem lays it out: config files, tokenizer files and one or more
// safetensors shards (single `model.safetensors` or sharded via `model.safetensors.index.json`).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/tensor_view.h"

namespace fp4serve::checkpoint {

/// Where one tensor lives.
struct TensorLocation {
  const SafetensorsFile* shard = nullptr;
  const TensorEntry* entry = nullptr;
};

class Checkpoint {
 public:
  /// Opens a folder (config.json + shards) or a single .safetensors file. Reads headers only.
  /// Throws FormatError when: the folder has no `model.safetensors` and no `model.safetensors.index.json`
  /// (or both); the index is not valid JSON or lacks a `weight_map` of strings; a shard name is absolute or
  /// contains `..` or a path separator; a listed shard is missing; a tensor listed in the index is absent from
  /// its shard, or a shard holds a tensor the index does not list; the same tensor is in two shards; a
  /// JSON side file (config.json, hf_quant_config.json, generation_config.json, tokenizer_config.json) is not a
  /// JSON object. Throws IoError when a file cannot be read.
  static Checkpoint open(const std::filesystem::path& path);

  const std::filesystem::path& root() const { return root_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

  /// Tensor names in a stable order (shard order, then file order).
  const std::vector<std::string>& tensor_names() const { return names_; }
  std::optional<TensorLocation> find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name).has_value(); }
  /// The tensor named `name`; throws FormatError naming the checkpoint when it is absent.
  core::TensorView tensor(std::string_view name) const;
  /// Drops this process's resident pages of `bytes` (a tensor view, or part of one) from the shard mapping they
  /// lie in, once the weights they hold were repacked (core::MappedFile::release_pages): views stay valid and
  /// fault the bytes in again when read. Bytes outside every shard (owned copies) are left alone; returns
  /// whether a shard held them.
  bool release_pages(std::span<const std::byte> bytes) const noexcept;

  /// Parsed side files; null json when the file is absent (a single .safetensors file has none of them).
  const nlohmann::json& config() const { return config_; }
  const nlohmann::json& hf_quant_config() const { return hf_quant_config_; }
  const nlohmann::json& generation_config() const { return generation_config_; }
  const nlohmann::json& tokenizer_config() const { return tokenizer_config_; }
  /// Path of tokenizer.json when present.
  std::optional<std::filesystem::path> tokenizer_json() const;

 private:
  std::filesystem::path root_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorLocation> locations_;
  nlohmann::json config_;
  nlohmann::json hf_quant_config_;
  nlohmann::json generation_config_;
  nlohmann::json tokenizer_config_;
};

/// Reads a JSON object from `path`; null json when the file does not exist. Throws FormatError when the file
/// is not valid JSON or not an object, IoError when it cannot be read.
nlohmann::json read_json_object_file(const std::filesystem::path& path);

}  // namespace fp4serve::checkpoint
