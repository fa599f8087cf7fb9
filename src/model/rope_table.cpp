// SPDX-License-Identifier: Apache-2.0
// RoPE tables on the host (each backend rotates with them: Backend::upload_rope). Formulas re-derived from
// transformers `modeling_rope_utils.py` (v5.17): `_compute_default_rope_parameters`,
// `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`, `_compute_yarn_parameters`, and the
// config standardization in `RotaryEmbeddingConfigMixin`.
#include "model/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fp4serve/error.h"

namespace fp4serve::model {
namespace {

using nlohmann::json;

// The block transformers reads: `rope_scaling` wins when non-null and non-empty (convert_rope_params_to_dict).
const json* rope_block(const json& config) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(key);
    if (it != config.end() && !it->is_null() && !(it->is_object() && it->empty())) {
      if (!it->is_object()) {
        throw FormatError(fmt::format("config.json \"{}\": expected an object, found {}", key, it->type_name()));
      }
      return &*it;
    }
  }
  return nullptr;
}

// A number under `key`, or std::nullopt when absent or null.
std::optional<double> number_at(const json& obj, const char* key, const char* where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    throw FormatError(fmt::format("config.json {}.{}: expected a number, found {}", where, key, it->type_name()));
  }
  return it->get<double>();
}

double required_number(const json& obj, const char* key, const char* type) {
  auto value = number_at(obj, key, "rope_scaling");
  if (!value) {
    throw FormatError(fmt::format("config.json rope_scaling: type \"{}\" requires \"{}\", which is missing", type, key));
  }
  return *value;
}

// transformers: a top-level original_max_position_embeddings overrides the block's (Phi-3 style); else the
// block's; else max_position_embeddings.
double original_max_positions(const json& config, const json& block, const char* type) {
  if (auto top = number_at(config, "original_max_position_embeddings", "(top level)")) return *top;
  if (auto own = number_at(block, "original_max_position_embeddings", "rope_scaling")) return *own;
  if (auto max_pos = number_at(config, "max_position_embeddings", "(top level)")) return *max_pos;
  throw FormatError(fmt::format(
      "config.json rope_scaling: type \"{}\" needs original_max_position_embeddings or max_position_embeddings",
      type));
}

}  // namespace

RopeScaling parse_rope_scaling(const json& config) {
  RopeScaling s;
  const json* block = rope_block(config);
  if (block == nullptr) return s;
  for (const auto& [key, value] : block->items()) {
    if (value.is_object()) {
      throw UnsupportedError(fmt::format(
          "config.json rope parameters: per-layer-type RoPE (\"{}\": {{…}}) is not supported", key));
    }
  }
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = block->find(key);
    if (it != block->end() && !it->is_null()) {
      if (!it->is_string()) throw FormatError(fmt::format("config.json rope_scaling.{}: expected a string", key));
      type = it->get<std::string>();
      break;
    }
  }
  if (type == "default") return s;
  if (type == "linear") {
    s.kind = RopeScaling::Kind::Linear;
    s.factor = required_number(*block, "factor", "linear");
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::Llama3;
    s.factor = required_number(*block, "factor", "llama3");
    s.low_freq_factor = required_number(*block, "low_freq_factor", "llama3");
    s.high_freq_factor = required_number(*block, "high_freq_factor", "llama3");
    s.original_max_position_embeddings = original_max_positions(config, *block, "llama3");
  } else if (type == "yarn") {
    s.kind = RopeScaling::Kind::Yarn;
    s.original_max_position_embeddings = original_max_positions(config, *block, "yarn");
    if (auto f = number_at(*block, "factor", "rope_scaling")) {
      s.factor = *f;
    } else {
      auto max_pos = number_at(config, "max_position_embeddings", "(top level)");
      if (!max_pos) throw FormatError("config.json rope_scaling: yarn without factor needs max_position_embeddings");
      s.factor = *max_pos / s.original_max_position_embeddings;
    }
    // transformers uses `x or default`, so 0 and null both mean the default.
    if (auto v = number_at(*block, "beta_fast", "rope_scaling"); v && *v != 0) s.beta_fast = *v;
    if (auto v = number_at(*block, "beta_slow", "rope_scaling"); v && *v != 0) s.beta_slow = *v;
    if (auto v = number_at(*block, "attention_factor", "rope_scaling")) s.attention_factor = *v;
    auto mscale = number_at(*block, "mscale", "rope_scaling");
    auto mscale_all_dim = number_at(*block, "mscale_all_dim", "rope_scaling");
    // The mscale ratio applies only when both are present and non-zero; otherwise leave mscale_all_dim = 0.
    if (mscale && mscale_all_dim && *mscale != 0 && *mscale_all_dim != 0) {
      s.mscale = *mscale;
      s.mscale_all_dim = *mscale_all_dim;
    }
    auto it = block->find("truncate");
    if (it != block->end() && !it->is_null()) {
      if (!it->is_boolean()) throw FormatError("config.json rope_scaling.truncate: expected a boolean");
      s.truncate = it->get<bool>();
    }
  } else {
    throw UnsupportedError(fmt::format(
        "config.json rope_scaling: rope_type \"{}\" is not supported (supported: default, linear, llama3, yarn)",
        type));
  }
  if (!(s.factor > 0)) {
    throw FormatError(fmt::format("config.json rope_scaling: factor must be > 0, found {}", s.factor));
  }
  return s;
}

double parse_rope_theta(const json& config) {
  if (const json* block = rope_block(config)) {
    if (auto theta = number_at(*block, "rope_theta", "rope_parameters")) return *theta;
  }
  if (auto theta = number_at(config, "rope_theta", "(top level)")) return *theta;
  return 10000.0;
}

std::vector<double> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& s) {
  const int64_t half = rotary_dim / 2;
  const double dim = static_cast<double>(rotary_dim);
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
  switch (s.kind) {
    case RopeScaling::Kind::None:
      break;
    case RopeScaling::Kind::Linear:
      for (double& f : inv) f /= s.factor;
      break;
    case RopeScaling::Kind::Llama3: {
      // Wavelengths above the low-frequency bound are slowed by `factor`, below the high-frequency bound kept,
      // and in between blended by a smooth factor linear in context/wavelength.
      const double old_ctx = s.original_max_position_embeddings;
      const double low_wavelen = old_ctx / s.low_freq_factor;
      const double high_wavelen = old_ctx / s.high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::Kind::Yarn: {
      // Dimension index at which a frequency completes `rotations` turns over the original context.
      auto correction_dim = [&](double rotations) {
        return dim * std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
               (2 * std::log(theta));
      };
      double low = correction_dim(s.beta_fast);
      double high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // weight of the unscaled frequency
        const double base = inv[i];
        inv[i] = (base / s.factor) * (1 - extrapolation) + base * extrapolation;
      }
      break;
    }
  }
  return inv;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.kind != RopeScaling::Kind::Yarn) return 1.0;
  if (s.attention_factor != 0) return s.attention_factor;
  auto get_mscale = [&](double mscale) { return s.factor <= 1 ? 1.0 : 0.1 * mscale * std::log(s.factor) + 1.0; };
  if (s.mscale != 0 && s.mscale_all_dim != 0) return get_mscale(s.mscale) / get_mscale(s.mscale_all_dim);
  return get_mscale(1.0);
}

RopeCache::RopeCache(int64_t rotary_dim, double theta, const RopeScaling& scaling, int64_t max_positions)
    : rotary_dim_(rotary_dim), max_positions_(max_positions) {
  if (rotary_dim < 2 || rotary_dim % 2 != 0) {
    throw UsageError(fmt::format("RopeCache: rotary_dim must be even and >= 2, found {}", rotary_dim));
  }
  if (!(theta > 0) || max_positions < 1) {
    throw UsageError(fmt::format("RopeCache: need theta > 0 and max_positions >= 1, found theta {} and {} positions",
                                 theta, max_positions));
  }
  const std::vector<double> inv = rope_inv_freq(rotary_dim, theta, scaling);
  const double factor = rope_attention_factor(scaling);
  attention_factor_ = static_cast<float>(factor);
  const int64_t half = rotary_dim / 2;
  cos_.resize(static_cast<size_t>(max_positions * half));
  sin_.resize(cos_.size());
  std::vector<float> inv_f32(inv.begin(), inv.end());
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // A float times an integer below 2^53 is exact in double, so this is fp32's correctly rounded product.
      const float angle = static_cast<float>(static_cast<double>(inv_f32[i]) * static_cast<double>(p));
      cos_[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)) * factor);
      sin_[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)) * factor);
    }
  }
}

const float* RopeCache::cos(int64_t pos) const {
  if (pos < 0 || pos >= max_positions_) {
    throw UsageError(fmt::format("RopeCache: position {} outside [0, {})", pos, max_positions_));
  }
  return cos_.data() + pos * (rotary_dim_ / 2);
}

const float* RopeCache::sin(int64_t pos) const {
  if (pos < 0 || pos >= max_positions_) {
    throw UsageError(fmt::format("RopeCache: position {} outside [0, {})", pos, max_positions_));
  }
  return sin_.data() + pos * (rotary_dim_ / 2);
}

}  // namespace fp4serve::model
