// SPDX-License-Identifier: Apache-2.0
// The command line's option values as the library takes them: each `--flag` text is parsed here, once, into the
// enum or struct of the module that uses it (plan::DeviceChoice, plan::ActivationQuant,
// prepare::ActivationPrecision, model::LmHeadDtype, model::KvCacheDtype, text::ContentFormat). Below app/ nothing parses an option
// string. Every parse_* throws UsageError naming the flag, the text and the accepted values.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/kv_cache.h"
#include "model/planned_weights.h"
#include "plan/device_caps.h"
#include "plan/select.h"
#include "prepare/prepared_linear.h"
#include "text/chat_template.h"

namespace fp4serve::app {

/// `--device` of a command that runs the model: auto | cpu | cuda. A dry-run name (smNN) is refused pointing at
/// `explain --device smNN` (it would run the CPU kernels, not that GPU's).
plan::DeviceChoice parse_run_device(std::string_view text);

/// `explain --device`: auto | cpu | cuda (detected), or smNN / smNNN (a dry run for that compute capability,
/// e.g. sm80, sm86, sm89, sm90, sm100, sm120; sm75 and below parse so that the plan refuses them with a reason).
/// Throws UsageError for other text, and for cuda when no GPU is found.
plan::DeviceCaps parse_plan_device(std::string_view text);

/// `--activation-quant`: auto | weight-only | emulate (SCHEMES.md rule 9).
plan::ActivationQuant parse_activation_quant(std::string_view text);

/// `--activation-precision`: auto (std::nullopt: backends::resolve_activation_precision decides) | fp32 | bf16 |
/// int8 | int8-decode.
std::optional<prepare::ActivationPrecision> parse_activation_precision(std::string_view text);
/// The flag's text for `precision` (nullopt: "auto").
std::string activation_precision_text(std::optional<prepare::ActivationPrecision> precision);

/// `--lm-head-dtype`: bf16 | fp8 | int8 (model::lm_head_dtype_name is the way back).
model::LmHeadDtype parse_lm_head_dtype(std::string_view text);

/// `--kv-cache-dtype`: auto (std::nullopt: the checkpoint's dtype, backends::resolve_kv_cache_dtype) | fp32 | bf16
/// | fp16.
std::optional<model::KvCacheDtype> parse_kv_cache_dtype(std::string_view text);
std::string kv_cache_dtype_text(std::optional<model::KvCacheDtype> dtype);

/// `serve --chat-template-content-format`: auto (std::nullopt: each template's syntax decides) | string | openai.
std::optional<text::ContentFormat> parse_content_format(std::string_view text);

/// Adds `--name` to `cmd` as a typed option: the text is parsed by `parse` when CLI11 reads it (a bad value stops
/// the command line with parse's UsageError, before anything is loaded) and stored in `target`. `default_text` is
/// what --help shows as the default.
template <typename T, typename Parse>
CLI::Option* add_parsed_option(CLI::App& cmd, const std::string& name, T& target, Parse parse,
                               const std::string& help, const std::string& default_text) {
  return cmd
      .add_option_function<std::string>(name, [&target, parse](const std::string& text) { target = parse(text); },
                                        help)
      ->default_str(default_text)
      ->type_name("TEXT");
}

/// add_parsed_option for a comma-separated list (bench model runs every model with each value): `target` gets
/// every value parsed, in order.
template <typename T, typename Parse>
CLI::Option* add_parsed_list_option(CLI::App& cmd, const std::string& name, std::vector<T>& target, Parse parse,
                                    const std::string& help, const std::string& default_text) {
  return cmd
      .add_option_function<std::vector<std::string>>(
          name,
          [&target, parse](const std::vector<std::string>& texts) {
            target.clear();
            for (const std::string& text : texts) target.push_back(parse(text));
          },
          help)
      ->delimiter(',')
      ->default_str(default_text)
      ->type_name("TEXT");
}

}  // namespace fp4serve::app
