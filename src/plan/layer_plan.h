// SPDX-License-Identifier: Apache-2.0
// The per-layer plan: for every module of the model (architecture.h), its quantization (quant_config.h), the
// chosen scheme with the reason and rejected candidates (select.h), whether it runs inside its fused group, and
// the exact checkpoint tensors it consumes (scheme.h contracts), validated against the safetensors headers
// before any weight is read. This is what `fp4serve explain` prints and what the loader (src/prepare) consumes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint/architecture.h"
#include "checkpoint/checkpoint.h"
#include "core/dtype.h"
#include "plan/device_caps.h"
#include "plan/kernel_catalogue.h"
#include "plan/scheme.h"
#include "plan/select.h"
#include "quant/quant_config.h"

namespace fp4serve::plan {

/// dtype, shape and byte size of one checkpoint tensor, from its safetensors header entry.
struct TensorHeader {
  core::DType dtype = core::DType::U8;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};
using TensorHeaders = std::unordered_map<std::string, TensorHeader>;

/// Every tensor header of `ckpt` (no data page is touched).
TensorHeaders read_headers(const checkpoint::Checkpoint& ckpt);

/// A checkpoint tensor the plan consumes, with its header.
struct TensorUse {
  std::string name;
  TensorRole role = TensorRole::Weight;
  core::DType dtype = core::DType::U8;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  bool dropped = false;  ///< validated, then released (not resident)
  bool shared = false;   ///< also listed by another module (tied lm_head ↔ embedding); counted once
};

/// The plan of one module.
struct ModulePlan {
  checkpoint::ModuleInfo module;
  quant::LayerQuant quant;
  Variant variant = Variant::Unquantized;
  std::optional<SchemeId> scheme;        ///< nullopt: nothing runs it on this device (see reason)
  KernelChoice kernel;                   ///< the device catalogue's kernel for `scheme` (refused when none)
  Reason reason = Reason::NotQuantized;
  std::string reason_text;
  std::vector<RejectedCandidate> rejected;
  std::vector<TensorUse> tensors;        ///< exactly the tensors it consumes, by role
  /// True when the module runs inside its fusion group (q/k/v → qkv_proj, gate/up → gate_up_proj, w1/w3 → w13);
  /// false when it has no group or the shards disagree (SCHEMES.md rule 4). Shards keep their own scales.
  bool run_fused = false;
  std::string run_name;                  ///< fusion group name when run fused, else the module name
  std::optional<quant::GlobalScaleConvention> global_scale;  ///< nullopt: the format has no global scale
  bool has_input_global_scale = false;   ///< the checkpoint carries activation scales (kept or dropped)

  const TensorUse* tensor(TensorRole role) const;
};

/// An online transform on an attention module (compressed-tensors `q_attn` / `k_cache`, FORMATS.md §1.8): the
/// post-RoPE query states (q_attn) or key states before they are written to the KV cache (k_cache) ← value · M̂,
/// block-diagonally over each head. Not a Linear, so it has no scheme; its tensors are validated here.
struct AttentionTransform {
  std::string module;             ///< "model.layers.N.self_attn"
  int64_t layer = 0;
  quant::TransformUse transform;  ///< location is "q_attn" or "k_cache"
  int64_t block = 0;              ///< b: the matrix is [b, b] and b divides head_dim
  std::vector<TensorUse> tensors; ///< TransformMatrix, then TransformPerm when randomized

  const TensorUse* tensor(TensorRole role) const;
};

enum class Severity : uint8_t { Info, Warning };

/// One log line, emitted once per distinct (variant, scheme, reason) with the number of layers it covers.
struct Notice {
  Severity severity = Severity::Info;
  Variant variant = Variant::Unquantized;
  std::optional<SchemeId> scheme;
  std::optional<Reason> reason;  ///< nullopt for notices that are not a scheme reason (fused groups split)
  std::string text;
  size_t layers = 0;
};

struct PlanOptions {
  /// The target device's kernels (backends::catalogue_for): the plan takes only schemes it names a kernel for.
  /// Required: build_plan throws UsageError when it is null. Not owned; used only during build_plan.
  const KernelCatalogue* catalogue = nullptr;
  ActivationQuant activation_quant = ActivationQuant::Auto;
};

struct LayerPlan {
  DeviceCaps device;                ///< the catalogue's device
  std::string backend;              ///< the catalogue's backend label ("cpu-avx512", "cuda-sm90")
  ActivationQuant activation_quant = ActivationQuant::Auto;
  /// The attention kernel of every layer; refused (the plan is then incomplete) when the device has none for the
  /// model's head_dim / heads.
  KernelChoice attention;
  quant::ProducerInfo producer;
  checkpoint::ModelDims dims;
  checkpoint::ExpertNaming expert_naming = checkpoint::ExpertNaming::Native;  ///< from the tensor names (MoE)
  std::vector<ModulePlan> modules;
  std::vector<TensorUse> others;   ///< non-linear tensors: norms, attention sinks, KV-cache scales, rotary buffers
  /// Online q_attn / k_cache transforms of the attention modules, by layer then config order.
  std::vector<AttentionTransform> attention_transforms;
  std::vector<Notice> notices;

  /// True when every module has a scheme and the attention has a kernel.
  bool complete() const;
  /// The plan of module `name` (checkpoint naming), or nullptr.
  const ModulePlan* find(std::string_view name) const;
  /// Notices of severity Warning whose reason is `r`.
  const Notice* warning(Reason r) const;
  /// The attention transform of `layer` at `location` ("q_attn" / "k_cache"), or nullptr.
  const AttentionTransform* attention_transform(int64_t layer, std::string_view location) const;
};

/// Builds the plan from config.json, hf_quant_config.json (null when absent) and the tensor headers.
/// Throws FormatError / UnsupportedError from config parsing, architecture description and classification
/// (rule 1), and one FormatError listing every missing, mis-typed, mis-shaped and unconsumed tensor and every
/// stale config value (e.g. a group_size the scale shapes contradict) — rule 6 — including attention transforms
/// whose matrix is not [b, b] with b dividing head_dim, and transforms at locations an attention module cannot
/// take (input / output / weight_*). Layers that no scheme can run on
/// this device are not an error here: they have scheme = nullopt (see LayerPlan::complete()). Throws UsageError
/// when options.catalogue is null.
LayerPlan build_plan(const nlohmann::json& config, const nlohmann::json& hf_quant_config, const TensorHeaders& headers,
                     const PlanOptions& options);

/// build_plan on an opened checkpoint (headers only).
LayerPlan build_plan(const checkpoint::Checkpoint& ckpt, const PlanOptions& options);

/// Rule 8: reads every scalar global / input scale of the plan (4 bytes each) and throws FormatError naming each
/// tensor that is NaN, ±Inf or negative, or zero where it is a divisor (CT `*_global_scale`). All offenders are
/// listed in one message.
void check_scale_values(const LayerPlan& plan, const checkpoint::Checkpoint& ckpt);

}  // namespace fp4serve::plan
