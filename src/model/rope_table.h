// SPDX-License-Identifier: Apache-2.0
// Rotary position embeddings as transformers computes them (`modeling_rope_utils.py`, v5.x): the config.json
// parser and the frequency table for default / linear / llama3 / yarn scaling, built once on the host from
// ModelConfig. Device-neutral: every backend rotates with this table (Backend::upload_rope; the CPU rotation is
// the CPU backend's, the CUDA backend uploads the same rows).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fp4serve::model {

/// The "rope_scaling" / "rope_parameters" block of config.json. Field names and defaults follow transformers.
struct RopeScaling {
  enum class Kind { None, Linear, Llama3, Yarn } kind = Kind::None;
  double factor = 1;                            ///< linear, llama3, yarn
  double low_freq_factor = 1;                   ///< llama3
  double high_freq_factor = 4;                  ///< llama3
  double original_max_position_embeddings = 0;  ///< llama3, yarn: pretraining context length
  double beta_fast = 32;                        ///< yarn ramp bounds, in rotations
  double beta_slow = 1;
  double mscale = 1;          ///< yarn (DeepSeek): used with mscale_all_dim when both are non-zero
  double mscale_all_dim = 0;  ///< yarn; 0 = absent
  double attention_factor = 0;  ///< yarn cos/sin multiplier; 0 = derive from factor/mscale as transformers does
  bool truncate = true;         ///< yarn: floor/ceil the correction range (GPT-OSS sets false)
};

/// Reads the RoPE scaling block of a parsed config.json the way transformers' `standardize_rope_params` does:
/// "rope_scaling" when present and non-null, else "rope_parameters"; the type from "rope_type" or the legacy
/// "type"; "default" or no block → Kind::None. For llama3 and yarn, original_max_position_embeddings comes from a
/// top-level "original_max_position_embeddings" if present, else the block, else "max_position_embeddings";
/// a yarn "factor" of null becomes max_position_embeddings / original_max_position_embeddings.
/// Throws UnsupportedError for other types (dynamic, longrope, per-layer-type blocks, …) and FormatError for a
/// missing or non-numeric required key (naming it).
RopeScaling parse_rope_scaling(const nlohmann::json& config);

/// rope_theta of a parsed config.json: "rope_parameters"/"rope_scaling".rope_theta, else top-level
/// "rope_theta", else transformers' default 10000. Throws FormatError when present but not a number.
double parse_rope_theta(const nlohmann::json& config);

/// Inverse frequencies inv_freq[i] (radians per position), i < rotary_dim/2, computed in float64 by the
/// transformers formula for `scaling` (the "dim" of those formulas is rotary_dim = int(head_dim · partial
/// rotary factor)). Exposed for tests and for backends that build their own tables.
std::vector<double> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& scaling);

/// The yarn attention factor transformers multiplies into cos and sin (1 for the other kinds):
/// attention_factor if given, else (0.1·mscale·ln f + 1)/(0.1·mscale_all_dim·ln f + 1) when both are non-zero,
/// else 0.1·ln f + 1 (1 when f ≤ 1).
double rope_attention_factor(const RopeScaling& scaling);

/// cos/sin table for positions [0, max_positions). Follows transformers' fp32 pipeline: inv_freq rounded to
/// fp32, angle = fp32(inv_freq · position) (one rounding, as torch's fp32 matmul with K = 1 does), then cos and
/// sin of that angle, times the attention factor, rounded to fp32. So the table matches HF to ~1 ulp of the
/// angle even at large positions, where a float64 angle would differ by up to ~pos·2^−24 radians.
class RopeCache {
 public:
  /// rotary_dim: even, ≥ 2; theta > 0; max_positions ≥ 1. Throws UsageError otherwise.
  RopeCache(int64_t rotary_dim, double theta, const RopeScaling& scaling, int64_t max_positions);

  /// [rotary_dim/2] f32 values for frequency i at `pos`, the attention factor already applied (like HF's
  /// cos·attention_scaling). Throws UsageError when pos is outside [0, max_positions). The rows of all positions
  /// are contiguous: cos(0) is the whole [max_positions, rotary_dim/2] table.
  const float* cos(int64_t pos) const;
  const float* sin(int64_t pos) const;

  /// The factor already folded into cos/sin (yarn) — informational; do not apply it again.
  float attention_factor() const { return attention_factor_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  int64_t max_positions() const { return max_positions_; }

 private:
  int64_t rotary_dim_;
  int64_t max_positions_;
  float attention_factor_;
  std::vector<float> cos_;  // [max_positions, rotary_dim/2]
  std::vector<float> sin_;
};

}  // namespace fp4serve::model
