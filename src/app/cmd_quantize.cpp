// SPDX-License-Identifier: Apache-2.0
// `fp4serve quantize`: an unquantized Hugging Face folder in, a compressed-tensors folder out (quant/
// quantize_checkpoint.h does the work; this file parses options, wires calibration and draws the progress bar).
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "app/calibration.h"
#include "app/commands.h"
#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "quant/quantize_checkpoint.h"

namespace fp4serve::app {
namespace {

struct QuantizeCliOptions {
  std::string model;
  std::string out;
  std::string scheme;
  std::string method = "rtn";
  int64_t group_size = 0;
  int64_t hadamard = 0;
  std::vector<std::string> ignore;
  std::string calibration;
  int64_t calibration_tokens = 512;
};

// One line redrawn in place on a terminal; a line per 10% otherwise (logs stay short).
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(fileno(stderr)) != 0) {}
  void update(size_t done, size_t total, std::string_view name) {
    constexpr int kWidth = 30;
    const int filled = total == 0 ? kWidth : static_cast<int>(kWidth * done / total);
    const size_t decile = total == 0 ? 10 : 10 * done / total;
    if (!tty_ && decile == last_decile_ && done != total) return;
    last_decile_ = decile;
    fmt::print(stderr, "{}quantize [{}{}] {}/{} {}{}", tty_ ? "\r\033[K" : "", std::string(filled, '#'),
               std::string(kWidth - filled, '.'), done, total, name, tty_ && done != total ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool tty_;
  size_t last_decile_ = 0;
};

void run_quantize(const QuantizeCliOptions& cli) {
  const auto scheme = quant::parse_quant_scheme(cli.scheme);
  if (!scheme) {
    throw UsageError(fmt::format("--scheme {}: expected nvfp4, nvfp4a16, mxfp4, mxfp4a16 or w4a16", cli.scheme));
  }
  const auto method = quant::parse_quant_method(cli.method);
  if (!method) throw UsageError(fmt::format("--method {}: expected rtn or gptq", cli.method));
  const bool gptq = *method == quant::QuantMethod::Gptq;
  const bool w4a4_nvfp4 = *scheme == quant::QuantScheme::Nvfp4;
  if (!w4a4_nvfp4 && !gptq && !cli.calibration.empty()) {
    throw UsageError(fmt::format("--calibration: scheme {} quantizes weights only and needs no calibration text",
                                 cli.scheme));
  }
  const auto source = checkpoint::Checkpoint::open(cli.model);
  quant::QuantizeOptions options;
  options.scheme = *scheme;
  options.group_size = cli.group_size;
  options.hadamard = cli.hadamard;
  if (!cli.ignore.empty()) options.ignore = cli.ignore;
  options.method = *method;
  if (w4a4_nvfp4 || gptq) {
    // Plan once without activations to learn which layers need calibrating, then calibrate (see calibration.h).
    quant::QuantizeOptions weights_only = options;
    weights_only.method = quant::QuantMethod::Rtn;
    if (w4a4_nvfp4) weights_only.scheme = quant::QuantScheme::Nvfp4A16;
    std::vector<std::string> modules;
    for (const auto& lin : quant::plan_quantization(source, weights_only).linears) {
      if (lin.quantized) modules.push_back(lin.module);
    }
    if (cli.calibration.empty()) {
      throw UsageError(gptq ? "--method gptq needs --calibration FILE (a text file)"
                            : "--scheme nvfp4 needs --calibration FILE (a text file)");
    }
    CalibrationStats stats = observe_inputs(source, modules, cli.calibration, cli.calibration_tokens, cli.hadamard, gptq);
    options.input_amax = std::move(stats.input_amax);
    options.hessians = std::move(stats.hessians);
  }
  const quant::QuantizePlan plan = quant::plan_quantization(source, options);
  size_t quantized = 0;
  for (const auto& lin : plan.linears) quantized += lin.quantized ? 1 : 0;
  fmt::print(stderr, "quantize: {} of {} linear layers to {} (group {}, {}), {} kept unquantized\n", quantized,
             plan.linears.size(), cli.scheme, plan.group_size, cli.method, plan.linears.size() - quantized);
  ProgressBar bar;
  quant::quantize_checkpoint(source, plan, cli.out, options.max_shard_bytes,
                             [&bar](size_t done, size_t total, std::string_view name) { bar.update(done, total, name); });
  fmt::print("wrote {}\n", cli.out);
}

}  // namespace

void register_quantize(CLI::App& root) {
  auto opts = std::make_shared<QuantizeCliOptions>();
  CLI::App* cmd = root.add_subcommand(
      "quantize", "Quantize an unquantized HF safetensors folder (F32/F16/BF16) into a compressed-tensors folder");
  cmd->add_option("-m,--model", opts->model, "source model folder")->required();
  cmd->add_option("-o,--out", opts->out, "output folder (created; must not already hold model*.safetensors)")
      ->required();
  cmd->add_option("--scheme", opts->scheme, "nvfp4 | nvfp4a16 | mxfp4 | mxfp4a16 | w4a16")->required();
  cmd->add_option("--method", opts->method,
                  "rtn (round to nearest, default) | gptq (GPTQ on the --calibration text's Hessians, llm-compressor "
                  "GPTQModifier defaults: block 128, dampening 0.01, activation order)")
      ->check(CLI::IsMember({"rtn", "gptq"}));
  cmd->add_option("--group-size", opts->group_size, "int4 group size for w4a16 (default 128)");
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
