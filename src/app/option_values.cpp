// SPDX-License-Identifier: Apache-2.0
#include "app/option_values.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "fp4serve/error.h"

namespace fp4serve::app {
namespace {

// "smNN" / "smNNN" → NN(N); std::nullopt for anything else.
std::optional<int> dry_run_capability(std::string_view text) {
  if (text.size() < 4 || !text.starts_with("sm")) return std::nullopt;
  const std::string_view digits = text.substr(2);
  int sm = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), sm);
  if (ec != std::errc() || end != digits.data() + digits.size() || sm < 10 || sm > 199) return std::nullopt;
  return sm;
}

std::optional<plan::DeviceChoice> device_choice(std::string_view text) {
  for (plan::DeviceChoice c : {plan::DeviceChoice::Auto, plan::DeviceChoice::Cpu, plan::DeviceChoice::Cuda}) {
    if (text == plan::device_choice_name(c)) return c;
  }
  return std::nullopt;
}

}  // namespace

plan::DeviceChoice parse_run_device(std::string_view text) {
  if (const auto choice = device_choice(text)) return *choice;
  if (dry_run_capability(text)) {
    throw UsageError(fmt::format("--device {}: a dry-run device: use `explain --device {}` to see its plan; "
                                 "to run the model use --device cpu or --device cuda", text, text));
  }
  throw UsageError(fmt::format("--device '{}' is not one of auto, cpu, cuda", text));
}

plan::DeviceCaps parse_plan_device(std::string_view text) {
  if (const auto choice = device_choice(text)) return plan::resolve_device(*choice);
  if (const auto sm = dry_run_capability(text)) return plan::dry_run_device(*sm);
  throw UsageError(fmt::format("--device '{}' is not one of auto, cpu, cuda, sm80, sm86, sm89, sm90, sm100, sm120 "
                               "(any smNN is accepted)", text));
}

plan::ActivationQuant parse_activation_quant(std::string_view text) {
  for (plan::ActivationQuant a : {plan::ActivationQuant::Auto, plan::ActivationQuant::WeightOnly,
                                  plan::ActivationQuant::Emulate}) {
    if (text == plan::activation_quant_name(a)) return a;
  }
  throw UsageError(fmt::format("--activation-quant '{}' is not one of auto, weight-only, emulate", text));
}

std::optional<prepare::ActivationPrecision> parse_activation_precision(std::string_view text) {
  using prepare::ActivationPrecision;
  if (text == "auto") return std::nullopt;
  for (ActivationPrecision p : {ActivationPrecision::Fp32, ActivationPrecision::Bf16, ActivationPrecision::Int8,
                                ActivationPrecision::Int8Decode, ActivationPrecision::Bf16DecodeInt8}) {
    if (text == prepare::activation_precision_name(p)) return p;
  }
  throw UsageError(fmt::format("--activation-precision '{}' is not one of auto, fp32, bf16, int8, int8-decode, "
                               "bf16-decode-int8", text));
}

std::string activation_precision_text(std::optional<prepare::ActivationPrecision> precision) {
  return precision ? std::string(prepare::activation_precision_name(*precision)) : "auto";
}

model::LmHeadDtype parse_lm_head_dtype(std::string_view text) {
  for (model::LmHeadDtype d : {model::LmHeadDtype::Bf16, model::LmHeadDtype::Fp8, model::LmHeadDtype::Int8}) {
    if (text == model::lm_head_dtype_name(d)) return d;
  }
  throw UsageError(fmt::format("--lm-head-dtype '{}' is not one of bf16, fp8, int8", text));
}

model::WeightCacheMode parse_weight_cache_mode(std::string_view text) {
  for (model::WeightCacheMode m : {model::WeightCacheMode::Auto, model::WeightCacheMode::On, model::WeightCacheMode::Off}) {
    if (text == model::weight_cache_mode_name(m)) return m;
  }
  throw UsageError(fmt::format("--weight-cache '{}' is not one of auto, on, off", text));
}

std::optional<model::KvCacheDtype> parse_kv_cache_dtype(std::string_view text) {
  if (text == "auto") return std::nullopt;
  for (model::KvCacheDtype d : {model::KvCacheDtype::F32, model::KvCacheDtype::Bf16, model::KvCacheDtype::F16}) {
    if (text == model::kv_cache_dtype_name(d)) return d;
  }
  throw UsageError(fmt::format("--kv-cache-dtype '{}' is not one of auto, fp32, bf16, fp16", text));
}

std::string kv_cache_dtype_text(std::optional<model::KvCacheDtype> dtype) {
  return dtype ? std::string(model::kv_cache_dtype_name(*dtype)) : "auto";
}

bool parse_batch_invariant(std::string_view text) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw UsageError(fmt::format("--batch-invariant '{}' is not one of off, on", text));
}

std::string range_text(const NumberRange& r) {
  if (std::isinf(r.max)) return fmt::format("{} {}", r.min_open ? ">" : "≥", r.min);
  return fmt::format("in {}{}, {}{}", r.min_open ? "(" : "[", r.min, r.max, r.max_open ? ")" : "]");
}

double parse_number(std::string_view flag, std::string_view text, const NumberRange& range, bool whole) {
  const std::string_view kind = whole ? "a whole number" : "a number";
  const std::string note = range.note != nullptr ? fmt::format(" ({})", range.note) : "";
  // from_chars takes no leading '+'; 1e3 is a whole number written as a float, refused for counts.
  const std::string_view digits = text.starts_with('+') ? text.substr(1) : text;
  double value = 0;
  bool ok = false;
  if (whole) {
    long long v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    ok = ec == std::errc() && end == digits.data() + digits.size() && !digits.empty();
    value = static_cast<double>(v);
  } else {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    ok = ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && std::isfinite(value);
  }
  if (!ok) throw UsageError(fmt::format("{} '{}': expected {} {}{}", flag, text, kind, range_text(range), note));
  const bool above_min = range.min_open ? value > range.min : value >= range.min;
  const bool below_max = range.max_open ? value < range.max : value <= range.max;
  if (!above_min || !below_max) {
    throw UsageError(fmt::format("{} {} is out of range: expected {} {}{}", flag, text, kind, range_text(range), note));
  }
  return value;
}

long long parse_whole(std::string_view text) {
  const std::string_view digits = text.starts_with('+') ? text.substr(1) : text;
  long long v = 0;
  (void)std::from_chars(digits.data(), digits.data() + digits.size(), v);
  return v;
}

ToolCallParserChoice parse_tool_call_parser(std::string_view text) {
  if (text == "auto") return {};
  if (const auto p = server::tool_parser_from_name(text)) return {false, p};
  if (text == "none") return {false, std::nullopt};
  throw UsageError(fmt::format("--tool-call-parser '{}' is not one of auto, none, hermes, llama3_json, mistral, "
                               "granite, openai", text));
}

std::optional<server::ReasoningParser> parse_reasoning_parser(std::string_view text) {
  if (const auto p = server::reasoning_parser_from_name(text)) return p;
  throw UsageError(fmt::format("--reasoning-parser '{}' is not one of qwen3, deepseek_r1, openai_gptoss", text));
}

std::optional<text::ContentFormat> parse_content_format(std::string_view text) {
  if (text == "auto") return std::nullopt;
  for (text::ContentFormat f : {text::ContentFormat::kString, text::ContentFormat::kOpenAI}) {
    if (text == text::content_format_name(f)) return f;
  }
  throw UsageError(fmt::format("--chat-template-content-format '{}' is not one of auto, string, openai", text));
}

}  // namespace fp4serve::app
