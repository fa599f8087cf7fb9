// SPDX-License-Identifier: Apache-2.0
#include "app/model_options.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/log.h"
#include "app/option_values.h"
#include "app/suggest.h"
#include "fp4serve/error.h"

namespace fp4serve::app {
namespace fs = std::filesystem;
namespace {

constexpr const char* kKvCacheDtypeHelp =
    "auto (the checkpoint's dtype: bf16 for a bfloat16 model; fp32 on the GPU), fp32, bf16 or fp16: what the CPU "
    "KV cache stores (16-bit: half the memory and of the bytes attention reads; keys and values rounded to nearest "
    "even)";

bool has_safetensors(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "model.safetensors", ec) || fs::is_regular_file(dir / "model.safetensors.index.json", ec);
}

// The first bytes of a file (fewer when it is shorter).
std::string file_head(const fs::path& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  head.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return head;
}

// The hub cache folder as huggingface_hub computes it: HF_HUB_CACHE, else HF_HOME/hub, else
// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
fs::path hub_cache() {
  if (const char* v = std::getenv("HF_HUB_CACHE"); v != nullptr && *v != '\0') return v;
  if (const char* v = std::getenv("HF_HOME"); v != nullptr && *v != '\0') return fs::path(v) / "hub";
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && *v != '\0') return fs::path(v) / "huggingface" / "hub";
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "") / ".cache" / "huggingface" / "hub";
}

// ORG/NAME with the characters the Hub allows in each part and exactly one slash.
bool looks_like_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos) {
    return false;
  }
  if (s.starts_with('.')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.' || c == '/';
  });
}

// models--ORG--NAME/snapshots/<commit in refs/main>/, else the only snapshot; empty when not cached.
fs::path cached_snapshot(const fs::path& repo_dir, std::string& detail) {
  std::error_code ec;
  if (!fs::is_directory(repo_dir, ec)) return {};
  std::ifstream ref(repo_dir / "refs" / "main");
  std::string commit;
  if (ref && std::getline(ref, commit)) {
    const fs::path snap = repo_dir / "snapshots" / commit;
    if (fs::is_directory(snap, ec)) return snap;
    detail = fmt::format("refs/main names {}, which is not in snapshots/", commit);
    return {};
  }
  std::vector<fs::path> snapshots;
  for (const auto& e : fs::directory_iterator(repo_dir / "snapshots", ec)) {
    if (e.is_directory(ec)) snapshots.push_back(e.path());
  }
  if (snapshots.size() == 1) return snapshots.front();
  detail = snapshots.empty() ? "no snapshot" : fmt::format("{} snapshots and no refs/main", snapshots.size());
  return {};
}

// The existing entry next to `path` whose name is closest to its last part (closest_match), as the user would
// type it (parent/name); empty when the parent folder does not exist or nothing is close.
std::string close_local_path(const fs::path& written) {
  const fs::path path = written.has_filename() ? written : written.parent_path();  // models/name/ → models/name
  const fs::path parent = path.parent_path();
  const std::string name = path.filename().string();
  if (name.empty()) return {};
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(parent.empty() ? fs::path(".") : parent, ec)) {
    names.push_back(e.path().filename().string());
  }
  const auto match = closest_match(name, names);
  return match ? (parent / *match).string() : std::string();
}

}  // namespace

CLI::Option* add_model_path_option(CLI::App& cmd, std::string& model, const std::string& help) {
  return cmd.add_option("-m,--model,MODEL", model, help)->required();
}

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("-t,--threads", threads,
                 "CPU threads (0 = one per online CPU; OpenMP threads wait passively unless OMP_WAIT_POLICY is set)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
}

void add_tensor_parallel_options(CLI::App& cmd, plan::ParallelConfig& parallel) {
  cmd.add_option("--tensor-parallel-size", parallel.tensor_parallel_size,
                 "ranks (-tp N): one process per device, launched by `mpirun -np N` or srun; rank 0 prints and serves")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd.add_flag("--expert-parallel", parallel.expert_parallel,
               "MoE layers: whole experts per rank instead of split experts");
}

void add_weight_cache_option(CLI::App& cmd, model::WeightCacheMode& mode) {
  add_parsed_option(cmd, "--weight-cache", mode, parse_weight_cache_mode,
                    "auto (on for checkpoints of 256 MiB of weights or more), on or off: the CPU's first load of a "
                    "checkpoint writes its repacked weights to one file in $FP4SERVE_CACHE_DIR/weights (default "
                    "~/.cache/fp4serve/weights) and later loads map that file instead of repacking; rewritten when "
                    "the checkpoint, the build or --lm-head-dtype / --activation-quant change",
                    std::string(model::weight_cache_mode_name(mode)));
}

void add_model_options(CLI::App& cmd, ModelOptions& opts, bool context_option) {
  add_model_path_option(cmd, opts.model,
                        "checkpoint folder (config.json + safetensors), or ORG/NAME from the local Hugging Face cache");
  model::LoadOptions& load = opts.load;
  add_parsed_option(cmd, "--device", load.device, parse_run_device,
                    "cpu, or cuda (run on the GPU found), or auto (the GPU when one is found); smNN names are for "
                    "`explain --device smNN`",
                    std::string(plan::device_choice_name(load.device)));
  add_parsed_option(cmd, "--activation-quant", load.activation_quant, parse_activation_quant,
                    "auto (follow the scheme table), weight-only, or emulate (W4A4 emulation, the numerical reference)",
                    std::string(plan::activation_quant_name(load.activation_quant)));
  add_parsed_option(cmd, "--activation-precision", load.activation_precision, parse_activation_precision,
                    "auto (for a bfloat16 checkpoint on a CPU with AVX512-BF16: bf16, or bf16-decode-int8 where a "
                    "short probe at load measures int8 clearly faster for prefill; else fp32; int4 linears: int8 on "
                    "x86 with AVX2 or AVX-512); fp32; bf16: "
                    "NVFP4/MXFP4 and int4 linears (and FP8 ones and the lm_head above 4 rows) round their input to bf16 (bf16 "
                    "dot products where the CPU has them, also in a prefill's attention over a bf16 KV cache); int8: "
                    "they and int4 linears quantize it to int8 per block and use integer dot products; int8-decode: int8 for "
                    "decode steps, fp32 for prefill; bf16-decode-int8: bf16 for decode steps, int8 for prefill",
                    activation_precision_text(load.activation_precision));
  add_parsed_option(cmd, "--lm-head-dtype", load.lm_head_dtype, parse_lm_head_dtype,
                    "bf16 (as stored), fp8 or int8 (per-row scaled copy in memory): how an unquantized lm_head / tied "
                    "embedding is served",
                    std::string(model::lm_head_dtype_name(load.lm_head_dtype)));
  add_parsed_option(cmd, "--kv-cache-dtype", load.kv_cache_dtype, parse_kv_cache_dtype, kKvCacheDtypeHelp,
                    kv_cache_dtype_text(load.kv_cache_dtype));
  add_weight_cache_option(cmd, load.weight_cache);
  cmd.add_flag("--batch-invariant", load.batch_invariant,
               "batch-invariant CPU kernels: each sequence's logits do not depend on the other sequences of its "
               "step, its prompt's chunking or the thread count, so greedy tokens and logprobs are the same alone and "
               "batched (slower prefill and batched decode: docs/performance.md)");
  add_threads_option(cmd, load.threads);
  if (!context_option) return;
  cmd.add_option("-c,--ctx-size,--max-model-len", opts.max_model_len,
                 "context length: prompt + generated tokens (0 = the model's max_position_embeddings, also the maximum)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
}

fs::path resolve_model_path(const std::string& arg, bool allow_file) {
  std::error_code ec;
  const fs::path path(arg);
  if (fs::is_regular_file(path, ec)) {
    const std::string head = file_head(path, 4);
    if (head == "GGUF") {
      throw UsageError(fmt::format("{}: this is a GGUF file; fp4serve reads Hugging Face safetensors folders "
                                   "(config.json + *.safetensors, e.g. as `huggingface-cli download` fetches them)",
                                   arg));
    }
    if (path.filename() == "config.json") {
      throw UsageError(fmt::format("{}: this is a config.json file; pass the folder that holds it and the "
                                   "safetensors files: -m {}", arg, path.parent_path().empty() ? "." : path.parent_path().string()));
    }
    if (!allow_file) {
      throw UsageError(fmt::format("{}: a single file; this command needs the checkpoint folder (config.json + "
                                   "safetensors): -m {}", arg,
                                   path.parent_path().empty() ? "." : path.parent_path().string()));
    }
    return path;
  }
  if (fs::is_directory(path, ec)) {
    if (!has_safetensors(path)) {
      std::vector<std::string> gguf;
      for (const auto& e : fs::directory_iterator(path, ec)) {
        if (e.path().extension() == ".gguf") gguf.push_back(e.path().filename().string());
      }
      throw UsageError(fmt::format("{}: no model.safetensors or model.safetensors.index.json in this folder{}", arg,
                                   gguf.empty() ? ""
                                                : fmt::format(" (it holds {}: GGUF files, which fp4serve does not "
                                                              "read; it reads Hugging Face safetensors folders)",
                                                              fmt::join(gguf, ", "))));
    }
    if (!fs::is_regular_file(path / "config.json", ec) && !allow_file) {
      throw UsageError(fmt::format("{}: no config.json in this folder (a Hugging Face checkpoint folder has "
                                   "config.json next to its safetensors)", arg));
    }
    return path;
  }
  const std::string near = close_local_path(path);
  if (!looks_like_repo_id(arg)) {
    throw UsageError(fmt::format("{}: no such file or folder{}", arg, near.empty() ? "" : fmt::format("; did you mean {}?", near)));
  }
  const fs::path cache = hub_cache();
  std::string repo_folder = "models--" + arg;
  repo_folder.replace(repo_folder.find('/'), 1, "--");
  const fs::path repo_dir = cache / repo_folder;
  std::string detail;
  const fs::path snapshot = cached_snapshot(repo_dir, detail);
  // A typo of a local folder (models/default-nvfp) also looks like ORG/NAME: the folder that exists is the better
  // answer than a download command for a repository that is probably not on the Hub.
  if (snapshot.empty() && !near.empty()) {
    throw UsageError(fmt::format("{}: no such file or folder; did you mean {}? (nor is it in the local Hugging Face "
                                 "cache: looked in {})", arg, near, repo_dir.string()));
  }
  if (snapshot.empty()) {
    throw UsageError(fmt::format("{}: no such folder, and not in the local Hugging Face cache (looked in {}{}; the "
                                 "cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). "
                                 "Download it with `huggingface-cli download {}`, or pass a folder",
                                 arg, repo_dir.string(), detail.empty() ? "" : ": " + detail, arg));
  }
  if (!has_safetensors(snapshot)) {
    throw UsageError(fmt::format("{}: the cached snapshot {} holds no model.safetensors or "
                                 "model.safetensors.index.json (fp4serve reads safetensors checkpoints)",
                                 arg, snapshot.string()));
  }
  log_debug("fp4serve: {} resolved to {}\n", arg, snapshot.string());
  return snapshot;
}

ContextLimit context_limit(const model::ModelConfig& config) {
  ContextLimit limit{config.max_position_embeddings, fmt::format("max_position_embeddings {}", config.max_position_embeddings)};
  using Kind = model::RopeScaling::Kind;
  const auto& rs = config.rope_scaling;
  // vLLM's derived length: yarn from original_max_position_embeddings × factor, linear from
  // max_position_embeddings × factor; llama3 configs already state the extended length.
  double scaled = 0;
  switch (rs.kind) {
    case Kind::Yarn: scaled = rs.original_max_position_embeddings * rs.factor; break;
    case Kind::Linear: scaled = static_cast<double>(config.max_position_embeddings) * rs.factor; break;
    case Kind::Llama3:
    case Kind::None: break;
  }
  if (scaled > static_cast<double>(config.max_position_embeddings)) {
    limit.source += fmt::format(" (rope_scaling factor {} would reach {:.0f} positions; fp4serve's RoPE table stops at "
                                "max_position_embeddings)", rs.factor, scaled);
  }
  return limit;
}

int64_t effective_max_model_len(const ModelOptions& opts, const model::ModelConfig& config) {
  const ContextLimit limit = context_limit(config);
  if (opts.max_model_len > limit.tokens) {
    throw UsageError(fmt::format("--max-model-len {} is above this model's maximum context length of {} tokens ({})",
                                 opts.max_model_len, limit.tokens, limit.source));
  }
  return opts.max_model_len > 0 ? opts.max_model_len : limit.tokens;
}

namespace {

// "loading [=====     ] 42%  120/210 tensors  30.1/71.6 MiB", redrawn in place; a newline after the last report.
void draw_load_bar(const model::LoadProgressReport& r) {
  const int percent = r.total_bytes == 0 ? 100 : static_cast<int>(std::min<uint64_t>(100, r.bytes * 100 / r.total_bytes));
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  std::fprintf(stderr, "\rloading [%.*s%*s] %3d%%  %llu/%llu tensors  %.1f/%.1f MiB%s", filled,
               "==============================", kWidth - filled, "", percent,
               static_cast<unsigned long long>(r.tensors), static_cast<unsigned long long>(r.total_tensors),
               static_cast<double>(r.bytes) / 1048576.0, static_cast<double>(r.total_bytes) / 1048576.0,
               r.done ? "\n" : "");
  std::fflush(stderr);
}

void report_weight_cache(const prepare::WeightCacheReport& r) {
  const auto gib = [](uint64_t bytes) { return static_cast<double>(bytes) / (1u << 30); };
  if (r.layers_prepared == 0) {
    log_info("weight cache: mapped {} layers ({:.2f} GiB) from {}\n", r.layers_mapped, gib(r.bytes_mapped), r.file.string());
    return;
  }
  const std::string why = r.not_used.empty() || r.not_used == "no file yet" ? "" : fmt::format(" ({})", r.not_used);
  if (r.written) {
    log_info("weight cache: wrote {:.2f} GiB to {} in {:.1f} s{}; later loads map it (--weight-cache off: neither)\n",
             gib(r.bytes_written), r.file.string(), r.write_seconds, why);
  } else {
    log_warning("weight cache: not written ({}); this load repacked {} layers{}", r.not_written, r.layers_prepared, why);
  }
}

}  // namespace

model::LoadedModel load_model_for(const ModelOptions& opts) {
  const fs::path dir = resolve_model_path(opts.model);
  // --max-model-len against the model's limit, from config.json alone: refused before any weight is read. A
  // config.json that cannot be read here is left to load_model, which names what is wrong with it.
  if (opts.max_model_len > 0) {
    std::ifstream in(dir / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_object()) {
      std::optional<model::ModelConfig> parsed;
      try {
        parsed = model::parse_model_config(config);
      } catch (const Error&) {
      }
      if (parsed) (void)effective_max_model_len(opts, *parsed);
    }
  }
  model::LoadOptions load = opts.load;
  // A bar redrawn with carriage returns only helps a person watching a terminal; logs get none.
  if (!load.progress && log_enabled(LogLevel::Info) && ::isatty(STDERR_FILENO) == 1) load.progress = draw_load_bar;
  model::LoadedModel loaded = model::load_model(dir, load);
  for (const std::string& w : loaded.warnings) log_warning("{}", w);
  if (loaded.weight_cache) report_weight_cache(*loaded.weight_cache);
  return loaded;
}

}  // namespace fp4serve::app
