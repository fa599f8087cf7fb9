// SPDX-License-Identifier: Apache-2.0
// `fp4serve quantize`: an unquantized Hugging Face folder in, a compressed-tensors folder out (quant/
// quantize_checkpoint.h does the work; this file parses options, wires calibration and draws the progress bar).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "app/calibration.h"
#include "app/commands.h"
#include "app/log.h"
#include "app/model_options.h"
#include "app/option_values.h"
#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "quant/quantize_checkpoint.h"

namespace fp4serve::app {
namespace {
namespace fs = std::filesystem;

struct QuantizeCliOptions {
  std::string model;
  std::string out;
  std::string scheme;
  std::string method = "rtn";
  int64_t group_size = 0;
  int64_t hadamard = 0;
  plan::DeviceChoice device = plan::DeviceChoice::Cpu;  // where calibration runs the source model
  std::vector<std::string> ignore;
  std::string calibration;
  int64_t calibration_tokens = 512;
};

// One line redrawn in place on a terminal; a line per 10% otherwise (logs stay short). Hidden by -q.
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(fileno(stderr)) != 0) {}
  void update(std::string_view label, size_t done, size_t total, std::string_view name) {
    if (!log_enabled(LogLevel::Info)) return;
    if (label != label_) {
      label_ = std::string(label);
      last_decile_ = 0;
    }
    constexpr int kWidth = 30;
    const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
    const size_t decile = total == 0 ? 10 : 10 * done / total;
    if (!tty_ && decile == last_decile_ && done != total) return;
    last_decile_ = decile;
    fmt::print(stderr, "{}{} [{}{}] {}/{} {}{}", tty_ ? "\r\033[K" : "", label, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done, total, name, tty_ && done != total ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool tty_;
  std::string label_;
  size_t last_decile_ = 0;
};

// SIGINT/SIGTERM during quantize only set this flag; the progress callbacks throw on it, so the partial output is
// removed on the same path as any other failure.
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }

void check_stop() {
  if (g_stop != 0) throw UsageError("interrupted; the partial output was removed");
}

// Writes go to OUT.tmp, a sibling of OUT (same file system, so the final rename is atomic); any failure, a full
// disk or Ctrl-C included, removes it, and a leftover from a killed run is cleared before starting.
class StagedOutput {
 public:
  explicit StagedOutput(fs::path out) : out_(std::move(out)), tmp_(out_.string() + ".tmp") {
    std::error_code ec;
    if (fs::exists(tmp_, ec)) {
      log_info("quantize: removing {} (left by an earlier run that did not finish)\n", tmp_.string());
      fs::remove_all(tmp_, ec);
      if (ec) throw IoError(fmt::format("{}: cannot remove: {}", tmp_.string(), ec.message()));
    }
  }
  ~StagedOutput() {
    if (committed_) return;
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  const fs::path& path() const { return tmp_; }

  // OUT missing or empty: one rename of the folder. OUT holding other files (no model*.safetensors, which
  // quantize refuses up front): the new files are renamed into it one by one.
  void commit() {
    std::error_code ec;
    if (!fs::exists(out_, ec) || fs::is_empty(out_, ec)) {
      if (fs::exists(out_, ec)) fs::remove(out_, ec);
      fs::rename(tmp_, out_, ec);
      if (ec) throw IoError(fmt::format("{}: cannot rename to {}: {}", tmp_.string(), out_.string(), ec.message()));
    } else {
      for (const auto& e : fs::directory_iterator(tmp_)) {
        fs::rename(e.path(), out_ / e.path().filename(), ec);
        if (ec) throw IoError(fmt::format("{}: cannot move into {}: {}", e.path().string(), out_.string(), ec.message()));
      }
      fs::remove(tmp_, ec);
    }
    committed_ = true;
  }

 private:
  fs::path out_, tmp_;
  bool committed_ = false;
};

// Up-front checks of OUT, so a doomed run fails before calibration and quantization.
void check_output_folder(const fs::path& out, const checkpoint::Checkpoint& source) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec)) throw UsageError(fmt::format("-o {}: exists and is not a folder", out.string()));
  if (fs::equivalent(out, source.root(), ec)) {
    throw UsageError(fmt::format("-o {}: the output folder is the source folder", out.string()));
  }
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string f = e.path().filename().string();
    if (f.starts_with("model") && f.find(".safetensors") != std::string::npos) {
      throw UsageError(fmt::format("-o {}: already holds {}; choose an empty output folder", out.string(), f));
    }
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

void run_quantize(const QuantizeCliOptions& cli) {
  // llm-compressor's preset names (NVFP4, NVFP4A16, MXFP4, MXFP4A16, W4A16) are these names in capitals.
  const std::string scheme_name = lower(cli.scheme);
  const auto scheme = quant::parse_quant_scheme(scheme_name);
  if (!scheme) {
    throw UsageError(fmt::format("--scheme {}: expected nvfp4, nvfp4a16, mxfp4, mxfp4a16 or w4a16 (any case, as "
                                 "llm-compressor spells its presets: NVFP4, NVFP4A16, MXFP4, W4A16)", cli.scheme));
  }
  const auto method = quant::parse_quant_method(cli.method);
  if (!method) throw UsageError(fmt::format("--method {}: expected rtn or gptq", cli.method));
  const bool gptq = *method == quant::QuantMethod::Gptq;
  const bool w4a4_nvfp4 = *scheme == quant::QuantScheme::Nvfp4;
  if (!w4a4_nvfp4 && !gptq && !cli.calibration.empty()) {
    throw UsageError(fmt::format("--calibration: scheme {} quantizes weights only and needs no calibration text",
                                 scheme_name));
  }
  if (w4a4_nvfp4 && cli.calibration.empty()) {
    throw UsageError("--scheme nvfp4 (W4A4) needs --calibration FILE, a text file to observe activations on; "
                     "--scheme nvfp4a16 quantizes the weights alone and needs none");
  }
  const auto source = checkpoint::Checkpoint::open(resolve_model_path(cli.model));
  check_output_folder(cli.out, source);
  quant::QuantizeOptions options;
  options.scheme = *scheme;
  options.group_size = cli.group_size;
  options.hadamard = cli.hadamard;
  if (!cli.ignore.empty()) options.ignore = cli.ignore;
  options.method = *method;

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ProgressBar bar;
  if (w4a4_nvfp4 || gptq) {
    // Plan once without activations to learn which layers need calibrating, then calibrate (see calibration.h).
    quant::QuantizeOptions weights_only = options;
    weights_only.method = quant::QuantMethod::Rtn;
    if (w4a4_nvfp4) weights_only.scheme = quant::QuantScheme::Nvfp4A16;
    std::vector<std::string> modules;
    for (const auto& lin : quant::plan_quantization(source, weights_only).linears) {
      if (lin.quantized) modules.push_back(lin.module);
    }
    if (cli.calibration.empty()) throw UsageError("--method gptq needs --calibration FILE (a text file)");
    CalibrationStats stats = observe_inputs(source, modules, cli.calibration, cli.calibration_tokens, cli.hadamard, gptq,
                                            cli.device, [&bar](int64_t done, int64_t total) {
                                              check_stop();
                                              bar.update("calibrate", static_cast<size_t>(done),
                                                         static_cast<size_t>(total), "layer passes");
                                            });
    options.input_amax = std::move(stats.input_amax);
    options.hessians = std::move(stats.hessians);
  }
  const quant::QuantizePlan plan = quant::plan_quantization(source, options);
  size_t quantized = 0;
  for (const auto& lin : plan.linears) quantized += lin.quantized ? 1 : 0;
  log_info("quantize: {} of {} linear layers to {} (group {}, {}), {} kept unquantized\n", quantized,
           plan.linears.size(), scheme_name, plan.group_size, cli.method, plan.linears.size() - quantized);
  StagedOutput staged(cli.out);
  quant::quantize_checkpoint(source, plan, staged.path(), options.max_shard_bytes,
                             [&bar](size_t done, size_t total, std::string_view name) {
                               check_stop();
                               bar.update("quantize", done, total, name);
                             });
  check_stop();
  staged.commit();
  fmt::print("wrote {}\n", cli.out);
}

}  // namespace

void register_quantize(CLI::App& root) {
  auto opts = std::make_shared<QuantizeCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "quantize", "Quantize an unquantized HF safetensors folder (F32/F16/BF16) into a compressed-tensors folder");
  add_model_path_option(*cmd, opts->model, "source model folder (F32/F16/BF16 safetensors), or ORG/NAME from the local Hugging Face cache");
  cmd->add_option("-o,--out", opts->out, "output folder (written as OUT.tmp and renamed when complete; must not already hold model*.safetensors)")
      ->required();
  cmd->add_option("--scheme", opts->scheme, "nvfp4 | nvfp4a16 | mxfp4 | mxfp4a16 | w4a16 (any case: NVFP4A16 as llm-compressor names it)")->required();
  cmd->add_option("--method", opts->method,
                  "rtn (round to nearest, default) | gptq (GPTQ on the --calibration text's Hessians, llm-compressor "
                  "GPTQModifier defaults: block 128, dampening 0.01, activation order)")
      ->check(CLI::IsMember({"rtn", "gptq"}));
  cmd->add_option("--group-size", opts->group_size, "int4 group size for w4a16 (default 128)");
  add_parsed_option(*cmd, "--device", opts->device, parse_run_device,
                    "where W4A4 calibration runs the source model: cpu, cuda or auto", "cpu");
  cmd->add_option("--hadamard", opts->hadamard,
                  "QuIP-style Hadamard block (16|32|64|128): rotate weights offline, declare the online input transform");
  cmd->add_option("--ignore", opts->ignore,
                  "linear modules to keep unquantized: exact names or re:REGEX, comma-separated; replaces the "
                  "default (lm_head and MoE routers)")
      ->delimiter(',');
  cmd->add_option("--calibration", opts->calibration,
                  "text file for W4A4 activation calibration (--scheme nvfp4) and GPTQ Hessians (--method gptq)");
  cmd->add_option("--calibration-tokens", opts->calibration_tokens, "calibration tokens to use (default 512)");
  cmd->callback([opts] { run_quantize(*opts); });
}

}  // namespace fp4serve::app
