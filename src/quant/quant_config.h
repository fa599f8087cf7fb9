// SPDX-License-Identifier: Apache-2.0
// Quantization configs of every supported producer, parsed into one producer-neutral description per module
// (`LayerQuant`). Sources: compressed-tensors `quantization_config` (docs/FORMATS.md §1), ModelOpt
// `hf_quant_config.json` / `quant_method: "modelopt"` (§3), GPT-OSS native `quant_method: "mxfp4"` (§5).
// Which execution scheme runs a layer is decided later, in src/plan; nothing here looks at tensors.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "quant/name_match.h"
#include "quant/producer.h"

namespace fp4serve::quant {

enum class QuantType : uint8_t { Int, Float };
/// compressed-tensors `QuantizationStrategy`.
enum class Strategy : uint8_t { Tensor, Channel, Group, TensorGroup, Block, Token, AttnHead };
/// `dynamic`: false = scales stored; true = computed at run time; "local" (tensor_group only) = only the
/// global scale is stored, per-group scales are computed at run time.
enum class Dynamic : uint8_t { Static, Dynamic, Local };
/// `actorder`; only Group changes storage (adds `weight_g_idx`). Aliases: "dynamic"/true → Group,
/// "static" → Weight.
enum class ActOrder : uint8_t { None, Group, Weight };
/// Element type of stored scales (`scale_dtype`); Unspecified when the config does not say.
enum class ScaleDtype : uint8_t { Unspecified, E4M3, E8M0, BF16, F16, F32 };

std::string_view quant_type_name(QuantType t);
std::string_view strategy_name(Strategy s);
std::string_view dynamic_name(Dynamic d);
std::string_view actorder_name(ActOrder a);
std::string_view scale_dtype_name(ScaleDtype s);

/// compressed-tensors `QuantizationArgs` after validation and strategy inference (FORMATS.md §1.3).
struct QuantArgs {
  int num_bits = 8;
  QuantType type = QuantType::Int;
  bool symmetric = true;
  Strategy strategy = Strategy::Tensor;
  std::optional<int64_t> group_size;              ///< elements per group along K; −1 is mapped to Channel
  std::optional<std::array<int64_t, 2>> block;    ///< [rows, cols] for Strategy::Block
  Dynamic dynamic = Dynamic::Static;
  ActOrder actorder = ActOrder::None;
  ScaleDtype scale_dtype = ScaleDtype::Unspecified;

  bool operator==(const QuantArgs&) const = default;
  /// "float4 tensor_group g16 sym dynamic=local scale=E4M3" — every field that distinguishes formats.
  std::string describe() const;
};

/// Parses one QuantizationArgs object. `where` names it in errors ("config.json: quantization_config.
/// config_groups.group_0.weights"). Throws FormatError on a wrong type, an unknown strategy/actorder/scale
/// dtype, `group` strategy without a positive group_size, `block` without a 2-element block_structure, or
/// `dynamic: "local"` with a strategy other than tensor_group.
QuantArgs parse_quant_args(const nlohmann::json& args, std::string_view where);

/// How the weights of a module are stored, i.e. which tensors exist (FORMATS.md §1.5, §2, §3, §5).
enum class StorageFormat : uint8_t {
  Dense,           ///< float weights (`dense`, or an unquantized module)
  Nvfp4Packed,     ///< FP4 nibbles in U8 + E4M3 group-16 scales + F32 global scale
  Mxfp4Packed,     ///< FP4 nibbles in U8 + E8M0 group-32 scales
  IntPacked,       ///< CT `pack-quantized`: int in I32 words
  Fp8,             ///< F8_E4M3 weights (`float-quantized`, `naive-quantized`, ModelOpt FP8 variants)
  Mxfp8,           ///< F8_E4M3 + E8M0 group-32 scales (parsed; no scheme runs it)
  Int8,            ///< I8 weights (`int-quantized`; parsed; no scheme runs it)
  GptOssMxfp4Blocks,  ///< GPT-OSS `_blocks` [E, N, K/32, 16] + `_scales` [E, N, K/32]
};
std::string_view storage_format_name(StorageFormat f);

/// One transform that applies to a module (compressed-tensors `transform_config`, FORMATS.md §1.8).
struct TransformUse {
  std::string group;     ///< transform group name, e.g. "v"
  std::string type;      ///< hadamard | random-hadamard | random-matrix
  std::string location;  ///< weight_input | weight_output | input | output | q_attn | k_cache
  bool online = false;   ///< input/output/q_attn/k_cache: must run at inference time (weight_* are fused offline)
  bool inverse = false;
  bool randomize = false;   ///< a `.perm` tensor is stored next to the matrix
  std::optional<int64_t> head_dim;
};

/// Why a module ended up with the quantization it has.
enum class MatchOrigin : uint8_t {
  NotQuantized,     ///< plain checkpoint: no quantization config at all
  Group,            ///< matched a config group / algorithm (see `LayerQuant::source`)
  Ignored,          ///< on the CT `ignore` list (beats targets)
  Excluded,         ///< matched a ModelOpt `exclude_modules` / GPT-OSS `modules_to_not_convert` pattern
  NotTargeted,      ///< no target matched
  NotListed,        ///< ModelOpt MIXED_PRECISION: not in `quantized_layers`, hence unquantized
};
std::string_view match_origin_name(MatchOrigin o);

/// Producer-neutral quantization of one module (a Linear, a router, lm_head, an embedding, fused 3-D experts).
struct LayerQuant {
  Producer producer = Producer::Unquantized;
  MatchOrigin origin = MatchOrigin::NotQuantized;
  /// Group name ("group_0"), ModelOpt algorithm ("NVFP4"), or the matching ignore/exclude entry.
  std::string source;
  std::optional<MatchKind> match_kind;   ///< how the CT target or ignore entry matched
  StorageFormat format = StorageFormat::Dense;
  std::string format_name;               ///< as written: "nvfp4-pack-quantized", "NVFP4", "mxfp4", "dense"
  std::optional<QuantArgs> weights;      ///< null: not quantized
  std::optional<QuantArgs> input;        ///< null: weight-only
  bool has_output_quant = false;         ///< output_activations set (no scheme supports it)
  std::vector<TransformUse> transforms;

  bool quantized() const { return weights.has_value(); }
};

/// A compressed-tensors config group after preset expansion.
struct QuantGroup {
  std::string name;
  std::vector<CtTarget> targets;
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input;
  bool has_output_quant = false;
  std::string format;  ///< per-group format, else the global one
};

/// One transform group of `transform_config`.
struct TransformGroup {
  std::string name;
  std::string type;
  bool randomize = false;
  std::optional<int64_t> head_dim;
  struct Apply {
    std::vector<CtTarget> targets;
    std::vector<CtTarget> ignore;
    std::string location;
    bool inverse = false;
  };
  std::vector<Apply> apply;
};

/// The parsed quantization config of a checkpoint.
struct QuantConfig {
  ProducerInfo producer;
  std::string version;              ///< CT `version` (int 3/5/6/7-bit layout depends on it)
  std::string global_format;        ///< CT global `format`
  std::string quantization_status;  ///< CT `quantization_status`
  std::vector<QuantGroup> groups;   ///< CT config_groups (ModelOpt single-algorithm configs become one group)
  std::vector<CtTarget> ignore;     ///< CT `ignore`
  std::vector<std::string> exclude; ///< ModelOpt `exclude_modules` / GPT-OSS `modules_to_not_convert` (fnmatch)
  bool mixed_precision = false;     ///< ModelOpt MIXED_PRECISION: `quantized_layers` decides
  std::map<std::string, LayerQuant, std::less<>> quantized_layers;  ///< ModelOpt MIXED_PRECISION, by module
  std::optional<QuantArgs> kv_cache;  ///< CT kv_cache_scheme / ModelOpt kv_cache_quant_algo
  std::string kv_cache_algo;          ///< ModelOpt kv_cache_quant_algo as written ("FP8"), "" otherwise
  std::vector<TransformGroup> transforms;
};

/// Parses `config` (config.json, may be null for a bare .safetensors file) and `hf_quant_config` (ModelOpt side
/// file, null when absent). A plain unquantized checkpoint gives a QuantConfig with no groups.
/// Throws FormatError for malformed configs (wrong JSON types, a bad regex, a preset that is not a list);
/// UnsupportedError, naming the algorithm or format, for: sparse formats (sparsity_config with a format and
/// targets, or a `marlin-24` / `sparse-*` group format), ModelOpt AWQ and W4A8 algorithms and any ModelOpt
/// algorithm outside NVFP4 / W4A16_NVFP4 / FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO / MIXED_PRECISION,
/// an unknown compressed-tensors preset, and quant methods other than compressed-tensors / modelopt / mxfp4.
QuantConfig parse_quant_config(const nlohmann::json& config, const nlohmann::json& hf_quant_config);

/// A module as the producers see it when they match names.
struct ModuleRef {
  std::string_view name;                         ///< checkpoint module name, e.g. "model.layers.0.mlp.gate"
  std::span<const std::string_view> class_names; ///< class hierarchy, most-derived first, e.g. {"Linear"}
};

/// The quantization of one module: ignore beats targets; among groups, exact-name targets beat regexes beat
/// class names, and the first group wins within a kind (CT `match_targets`). ModelOpt: exclude_modules are
/// fnmatch patterns; MIXED_PRECISION modules not listed are unquantized. GPT-OSS: only `GptOssExperts` modules
/// not listed in modules_to_not_convert are MXFP4. Online and offline transforms whose targets match are
/// attached. Never throws.
LayerQuant resolve_layer_quant(const QuantConfig& config, const ModuleRef& module);

}  // namespace fp4serve::quant
