// SPDX-License-Identifier: Apache-2.0
// Human- and machine-readable rendering of a LayerPlan for `fp4serve explain`: one row per group of identical
// decisions (layer pattern, count, checkpoint variant, scheme, kernel, reason), the notices, and byte totals.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/layer_plan.h"

namespace fp4serve::plan {

/// One row of the explain table: modules (or fused groups) that got the same decision.
struct ExplainRow {
  std::string pattern;   ///< run name with layer/expert indices as `*`, e.g. "model.layers.*.self_attn.qkv_proj"
  size_t count = 0;      ///< number of runs (a fused group counts once)
  std::string variant;
  std::string scheme;    ///< "-" when no scheme
  std::string backend;   ///< "cpu-avx2", "cuda-sm90", "-" when no scheme
  std::string kernel;    ///< the device catalogue's kernel ("-" when no scheme)
  bool hardware_verified = true;  ///< false: compiled, never run by the project on this kind of device
  std::string reason;    ///< reason text
  std::string reason_code;
  /// Online transforms of the row, e.g. "input v hadamard b128 fwht"; "" when none (online_transform_summary).
  std::string transform;
};

/// The module's online transforms as "<location> <group> <type> b<block> <kernel>", joined by ", "; "" when none.
/// block = the stored matrix size; kernel = "fwht" for a non-randomized `hadamard` of power-of-two size (the load
/// verifies the stored matrix is Sylvester and otherwise runs it dense), else "dense" (block-diagonal rotation).
/// Offline locations (weight_input / weight_output, already folded into the stored weight) are not listed.
std::string online_transform_summary(const ModulePlan& module);
/// The same text for an attention-module transform, e.g. "q_attn R3 hadamard b32 fwht".
std::string attention_transform_summary(const AttentionTransform& transform);

/// Bytes per scheme, from the headers.
struct SchemeTotal {
  std::string scheme;
  size_t modules = 0;
  uint64_t checkpoint_bytes = 0;  ///< every consumed tensor (dropped ones included)
  uint64_t resident_bytes = 0;    ///< tensors kept after loading
};

std::vector<ExplainRow> explain_rows(const LayerPlan& plan);
std::vector<SchemeTotal> scheme_totals(const LayerPlan& plan);
/// Resident weight bytes: kept module tensors (shared ones once) plus non-linear tensors that are not dropped and
/// attention-transform matrices (tied copies once).
uint64_t resident_bytes(const LayerPlan& plan);

/// The explain report as text (table with the kernel of each row, the attention kernel, notices, totals, status
/// line). `source` names the checkpoint. `verbose` adds each row's rejected candidates and marks kernels that are
/// compiled but have never run on this kind of device.
std::string render_explain_text(const LayerPlan& plan, const std::string& source, bool verbose = false);
/// The same as JSON, plus every module with its tensors and rejected candidates.
nlohmann::json render_explain_json(const LayerPlan& plan, const std::string& source);

}  // namespace fp4serve::plan
