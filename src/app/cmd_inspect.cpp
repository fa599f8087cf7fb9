// SPDX-License-Identifier: Apache-2.0
// `fp4serve inspect`: what a checkpoint holds, from the safetensors headers and config files alone.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_options.h"
#include "checkpoint/checkpoint.h"
#include "quant/producer.h"

namespace fp4serve::app {
namespace {

struct InspectOptions {
  std::string path;
  bool json = false;
};

struct DTypeTotal {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

void run_inspect(const InspectOptions& opts) {
  const auto ckpt = checkpoint::Checkpoint::open(resolve_model_path(opts.path, /*allow_file=*/true));
  const auto producer = quant::detect_producer(ckpt.config(), ckpt.hf_quant_config());
  std::map<std::string, DTypeTotal> totals;
  uint64_t total_bytes = 0;

  nlohmann::json out = nlohmann::json::object();
  out["path"] = opts.path;
  out["producer"] = std::string(quant::producer_name(producer.producer));
  out["quant_method"] = producer.quant_method;
  out["formats"] = producer.formats;
  out["tensors"] = nlohmann::json::array();

  size_t name_width = 4;
  for (const auto& name : ckpt.tensor_names()) name_width = std::max(name_width, name.size());
  if (!opts.json) {
    fmt::print("{:<{}}  {:<11}  {:<22}  {:>12}  {}\n", "name", name_width, "dtype", "shape", "bytes", "shard");
  }
  for (const auto& shard : ckpt.shards()) {
    const std::string shard_name = shard->path().filename().string();
    for (const auto& entry : shard->header().tensors) {
      const uint64_t bytes = entry.end - entry.begin;
      const std::string dtype(core::dtype_name(entry.dtype));
      totals[dtype].tensors += 1;
      totals[dtype].bytes += bytes;
      total_bytes += bytes;
      if (opts.json) {
        out["tensors"].push_back({{"name", entry.name}, {"dtype", dtype}, {"shape", entry.shape}, {"bytes", bytes},
                                  {"shard", shard_name}});
      } else {
        fmt::print("{:<{}}  {:<11}  {:<22}  {:>12}  {}\n", entry.name, name_width, dtype,
                   core::shape_to_string(entry.shape), bytes, shard_name);
      }
    }
  }
  const size_t tensor_count = ckpt.tensor_names().size();
  if (opts.json) {
    out["totals"] = nlohmann::json::object();
    for (const auto& [dtype, t] : totals) out["totals"][dtype] = {{"tensors", t.tensors}, {"bytes", t.bytes}};
    out["total_tensors"] = tensor_count;
    out["total_bytes"] = total_bytes;
    out["shards"] = ckpt.shards().size();
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("\ntotals by dtype:\n");
  for (const auto& [dtype, t] : totals) {
    fmt::print("  {:<11} {:>7} tensors  {:>14} bytes ({:.2f} MiB)\n", dtype, t.tensors, t.bytes,
               static_cast<double>(t.bytes) / (1024.0 * 1024.0));
  }
  fmt::print("  {:<11} {:>7} tensors  {:>14} bytes ({:.2f} MiB) in {} shard(s)\n", "all", tensor_count, total_bytes,
             static_cast<double>(total_bytes) / (1024.0 * 1024.0), ckpt.shards().size());
  fmt::print("producer: {}", quant::producer_name(producer.producer));
  if (!producer.quant_method.empty()) fmt::print(" (quant_method \"{}\")", producer.quant_method);
  if (!producer.formats.empty()) fmt::print(", formats: {}", fmt::join(producer.formats, ", "));
  fmt::print("\n");
}

}  // namespace

void register_inspect(CLI::App& root) {
  auto opts = std::make_shared<InspectOptions>();
  CLI::App* cmd = root.add_subcommand("inspect", "List the tensors of a checkpoint folder or .safetensors file (reads headers only)");
  add_model_path_option(*cmd, opts->path, "checkpoint folder, .safetensors file, or ORG/NAME from the local Hugging Face cache");
  cmd->add_flag("--json", opts->json, "print JSON instead of a table");
  cmd->callback([opts] { run_inspect(*opts); });
}

}  // namespace fp4serve::app
