// SPDX-License-Identifier: Apache-2.0
// The command line's option values as the library takes them: each `--flag` text is parsed here, once, into the
// enum or struct of the module that uses it (plan::DeviceChoice, plan::ActivationQuant,
// prepare::ActivationPrecision, model::LmHeadDtype, model::KvCacheDtype, text::ContentFormat, server::ToolParser). Below app/ nothing parses an option
// string. Every parse_* throws UsageError naming the flag, the text and the accepted values.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fp4serve/error.h"
#include "model/kv_cache.h"
#include "server/tool_calls.h"
#include "model/planned_weights.h"
#include "plan/device_caps.h"
#include "plan/select.h"
#include "backends/cpu/prepare/prepared_linear.h"
#include "backends/load_model.h"
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
/// The LoadOptions the commands start from: the library's, but the weight cache is auto (the library's default is
/// off, so that tests and embedders opt in).
inline model::LoadOptions cli_load_options() {
  model::LoadOptions options;
  options.weight_cache = model::WeightCacheMode::Auto;
  return options;
}
/// `--weight-cache`: auto | on | off (model::weight_cache_mode_name is the way back).
model::WeightCacheMode parse_weight_cache_mode(std::string_view text);

/// `--kv-cache-dtype`: auto (std::nullopt: the checkpoint's dtype, backends::resolve_kv_cache_dtype) | fp32 | bf16
/// | fp16.
std::optional<model::KvCacheDtype> parse_kv_cache_dtype(std::string_view text);
std::string kv_cache_dtype_text(std::optional<model::KvCacheDtype> dtype);

/// `bench model --batch-invariant`: off | on (a list item; the other commands take the plain flag).
bool parse_batch_invariant(std::string_view text);

/// `serve --tool-call-parser`: auto (std::nullopt: detected from the architecture and chat template) | hermes |
/// llama3_json | mistral | granite | openai (vLLM's names).
struct ToolCallParserChoice {
  bool automatic = true;
  std::optional<server::ToolParser> parser;
};
ToolCallParserChoice parse_tool_call_parser(std::string_view text);
/// `serve --reasoning-parser`: qwen3 | deepseek_r1 | openai_gptoss (vLLM's names).
std::optional<server::ReasoningParser> parse_reasoning_parser(std::string_view text);

/// `serve --chat-template-content-format`: auto (std::nullopt: each template's syntax decides) | string | openai.
std::optional<text::ContentFormat> parse_content_format(std::string_view text);

/// The values a numeric option accepts: min … max, an end excluded where *_open; max = infinity: no upper bound.
struct NumberRange {
  double min = 0;
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
  bool max_open = false;
  const char* note = nullptr;  ///< what special values mean, e.g. "0 = greedy", for the refusal
};
/// "in (0, 1]", "≥ 1", "> 0", "in [-2, 2]".
std::string range_text(const NumberRange& range);
/// `text` as the value of `flag` (e.g. "-n/--max-tokens"): a finite number within `range`, a whole one when
/// `whole`. Throws UsageError naming the flag, the text and the range.
double parse_number(std::string_view flag, std::string_view text, const NumberRange& range, bool whole);
/// The exact value of a whole number parse_number accepted (its double may have rounded).
long long parse_whole(std::string_view text);

/// Ranges shared by the commands that sample (generate, chat), as vLLM's SamplingParams checks them.
namespace ranges {
inline constexpr NumberRange kMaxTokens{1, std::numeric_limits<double>::infinity(), false, false, nullptr};
inline constexpr NumberRange kTemperature{0, std::numeric_limits<double>::infinity(), false, false, "0 = greedy"};
inline constexpr NumberRange kTopP{0, 1, true, false, "1 = off"};
inline constexpr NumberRange kTopK{-1, std::numeric_limits<double>::infinity(), false, false, "-1 or 0 = off"};
inline constexpr NumberRange kMinP{0, 1, false, false, "0 = off"};
inline constexpr NumberRange kRepetitionPenalty{0, std::numeric_limits<double>::infinity(), true, false, "1 = off"};
inline constexpr NumberRange kPresenceFrequencyPenalty{-2, 2, false, false, "0 = off"};
}  // namespace ranges

namespace detail {
template <typename T> struct OptionalValue { using type = T; };
template <typename T> struct OptionalValue<std::optional<T>> { using type = T; };
}  // namespace detail

/// Adds a numeric option (`names` as CLI11 takes them, e.g. "-n,--max-tokens") whose value is checked against
/// `range` as CLI11 reads it: a bad value stops the command line before anything is loaded, with a message that
/// names the flag, the value and the range (CLI11's own "Could not convert" names none of the accepted values).
/// `target` is a number or a std::optional of one (unset: the command's default applies).
template <typename T>
CLI::Option* add_number_option(CLI::App& cmd, const std::string& names, T& target, const NumberRange& range,
                               const std::string& help) {
  using V = typename detail::OptionalValue<T>::type;
  std::string flag = names;
  std::replace(flag.begin(), flag.end(), ',', '/');
  CLI::Option* opt = cmd.add_option_function<std::string>(
      names,
      [&target, flag, range](const std::string& text) {
        const double value = parse_number(flag, text, range, std::is_integral_v<V>);
        if constexpr (std::is_integral_v<V>) {
          // Compared as integers: a double holds 2^63 − 1 as 2^63, which would pass a check in doubles and
          // overflow the cast. The range's "no upper bound" means none short of the type's.
          const long long exact = parse_whole(text);
          if (exact > 0 &&
              static_cast<unsigned long long>(exact) > static_cast<unsigned long long>(std::numeric_limits<V>::max())) {
            throw UsageError(fmt::format("{} {} is too large: at most {}", flag, text, std::numeric_limits<V>::max()));
          }
          target = static_cast<V>(exact);
        } else {
          target = static_cast<V>(value);
        }
      },
      help);
  opt->type_name(std::is_integral_v<V> ? "INT" : "FLOAT");
  if constexpr (std::is_same_v<T, V>) opt->default_str(fmt::format("{}", target));
  return opt;
}

/// --seed: a whole number in [0, 2^64); CLI11 alone would take -1 and wrap it to 2^64 − 1.
inline const CLI::Validator kSeedCheck(
    [](const std::string& text) {
      return text.starts_with('-') ? std::string("'") + text + "' is negative: a seed is a whole number ≥ 0"
                                   : std::string();
    },
    "UINT");

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
