// SPDX-License-Identifier: Apache-2.0
#include "checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shard name must stay inside the checkpoint folder: a plain file name, never a path.
void check_shard_name(const std::string& shard, const fs::path& index_path) {
  if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
      shard == "." || shard == ".." || shard.find("..") != std::string::npos) {
    throw FormatError(fmt::format("{}: shard name '{}' must be a plain file name inside the checkpoint folder "
                                  "(no path separators, no '..')",
                                  index_path.string(), shard));
  }
}

}  // namespace

json read_json_object_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return json();
  const std::string text = read_text_file(path);
  json parsed;
  try {
    parsed = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond a double
    throw FormatError(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
  if (!parsed.is_object()) {
    throw FormatError(fmt::format("{}: expected a JSON object, found {}", path.string(), parsed.type_name()));
  }
  return parsed;
}

Checkpoint Checkpoint::open(const fs::path& path) {
  Checkpoint ckpt;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw IoError(fmt::format("{}: no such file or folder", path.string()));

  std::vector<std::pair<std::string, std::vector<std::string>>> shard_plan;  // shard file → tensors the index lists
  if (fs::is_regular_file(path, ec)) {
    ckpt.root_ = path.parent_path();
    ckpt.shards_.push_back(std::make_unique<SafetensorsFile>(path));
  } else {
    ckpt.root_ = path;
    const fs::path index_path = path / kIndexName;
    const fs::path single_path = path / kSingleName;
    const bool has_index = fs::exists(index_path, ec);
    const bool has_single = fs::exists(single_path, ec);
    if (has_index && has_single) {
      throw FormatError(fmt::format("{}: holds both {} and {}; remove the stale one", path.string(), kSingleName,
                                    kIndexName));
    }
    if (!has_index && !has_single) {
      throw FormatError(fmt::format("{}: no {} and no {} found", path.string(), kSingleName, kIndexName));
    }
    if (has_single) {
      ckpt.shards_.push_back(std::make_unique<SafetensorsFile>(single_path));
    } else {
      const json index = read_json_object_file(index_path);
      if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
        throw FormatError(fmt::format("{}: expected an object 'weight_map' mapping tensor names to shard files",
                                      index_path.string()));
      }
      std::map<std::string, std::vector<std::string>> by_shard;
      std::vector<std::string> shard_order;
      for (const auto& [tensor, shard_value] : index["weight_map"].items()) {
        if (!shard_value.is_string()) {
          throw FormatError(fmt::format("{}: weight_map['{}'] is {}, expected a shard file name", index_path.string(),
                                        tensor, shard_value.dump()));
        }
        const std::string shard = shard_value.get<std::string>();
        check_shard_name(shard, index_path);
        auto [it, inserted] = by_shard.try_emplace(shard);
        if (inserted) shard_order.push_back(shard);
        it->second.push_back(tensor);
      }
      if (shard_order.empty()) throw FormatError(fmt::format("{}: weight_map is empty", index_path.string()));
      std::sort(shard_order.begin(), shard_order.end());
      for (const std::string& shard : shard_order) {
        const fs::path shard_path = path / shard;
        if (!fs::is_regular_file(shard_path, ec)) {
          throw FormatError(fmt::format("{}: shard '{}' listed in the index does not exist", index_path.string(), shard));
        }
        ckpt.shards_.push_back(std::make_unique<SafetensorsFile>(shard_path));
        shard_plan.emplace_back(shard, std::move(by_shard[shard]));
      }
    }
  }

  for (const auto& shard : ckpt.shards_) {
    for (const TensorEntry& entry : shard->header().tensors) {
      const auto [it, inserted] = ckpt.locations_.try_emplace(entry.name, TensorLocation{shard.get(), &entry});
      if (!inserted) {
        throw FormatError(fmt::format("tensor '{}' appears in two shards: {} and {}", entry.name,
                                      it->second.shard->path().string(), shard->path().string()));
      }
      ckpt.names_.push_back(entry.name);
    }
  }
  // The index and the shards must agree exactly, both ways.
  for (size_t i = 0; i < shard_plan.size(); ++i) {
    const SafetensorsFile& shard = *ckpt.shards_[i];
    const std::set<std::string> listed(shard_plan[i].second.begin(), shard_plan[i].second.end());
    for (const std::string& tensor : listed) {
      if (shard.find(tensor) == nullptr) {
        throw FormatError(fmt::format("{}: the index lists tensor '{}' in this shard, but the shard does not hold it",
                                      shard.path().string(), tensor));
      }
    }
    for (const TensorEntry& entry : shard.header().tensors) {
      if (!listed.contains(entry.name)) {
        throw FormatError(fmt::format("{}: holds tensor '{}', which the index does not list for this shard",
                                      shard.path().string(), entry.name));
      }
    }
  }

  ckpt.config_ = read_json_object_file(ckpt.root_ / "config.json");
  ckpt.hf_quant_config_ = read_json_object_file(ckpt.root_ / "hf_quant_config.json");
  ckpt.generation_config_ = read_json_object_file(ckpt.root_ / "generation_config.json");
  ckpt.tokenizer_config_ = read_json_object_file(ckpt.root_ / "tokenizer_config.json");
  return ckpt;
}

std::optional<TensorLocation> Checkpoint::find(std::string_view name) const {
  const auto it = locations_.find(std::string(name));
  if (it == locations_.end()) return std::nullopt;
  return it->second;
}

core::TensorView Checkpoint::tensor(std::string_view name) const {
  const auto loc = find(name);
  if (!loc) throw FormatError(fmt::format("{}: checkpoint has no tensor '{}'", root_.string(), name));
  return loc->shard->view(*loc->entry);
}

bool Checkpoint::release_pages(std::span<const std::byte> bytes) const noexcept {
  for (const auto& shard : shards_) {
    if (shard->release_pages(bytes)) return true;
  }
  return false;
}

std::optional<fs::path> Checkpoint::tokenizer_json() const {
  const fs::path p = root_ / "tokenizer.json";
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return p;
  return std::nullopt;
}

}  // namespace fp4serve::checkpoint
