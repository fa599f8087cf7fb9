// SPDX-License-Identifier: Apache-2.0
// Per-architecture facts: which modules and non-linear tensors a model has, their shapes, fusion groups and
// expert layout, all derived from config.json's `architectures[0]` and dimensions — never inferred from which
// tensors exist. The scheme plan (src/plan) and, later, the model builder (src/model) both read this table.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::checkpoint {

/// Dimensions read from config.json. Shapes below use N = out_features, K = in_features.
struct ModelDims {
  std::string architecture;              ///< architectures[0]
  int64_t hidden_size = 0;               ///< H
  int64_t intermediate_size = 0;         ///< dense MLP width (Mixtral/GraniteMoe/GPT-OSS: the expert width)
  int64_t moe_intermediate_size = 0;     ///< expert width I (= intermediate_size where the config has no own key)
  int64_t shared_expert_intermediate_size = 0;  ///< Qwen2-MoE shared expert width, 0 when none
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;       ///< defaults to num_attention_heads
  int64_t head_dim = 0;                  ///< defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t num_experts = 0;               ///< num_experts or num_local_experts; 0 for dense models
  int64_t num_experts_per_tok = 0;
  int64_t decoder_sparse_step = 1;       ///< Qwen-MoE: every step-th layer is sparse
  std::vector<int64_t> mlp_only_layers;  ///< Qwen-MoE: layers that keep a dense MLP
  bool tie_word_embeddings = false;
  bool attention_bias = false;           ///< q/k/v/o carry biases (Qwen2 families: q/k/v always)
  bool mlp_bias = false;

  /// True when layer `layer` has a sparse MoE block (Qwen-MoE rule: not in mlp_only_layers and
  /// (layer + 1) % decoder_sparse_step == 0; other MoE families: every layer).
  bool is_moe_layer(int64_t layer) const;
};

/// What a module does; shapes and fusion follow from the role.
enum class ModuleRole : uint8_t {
  Embedding, LmHead,
  QProj, KProj, VProj, OProj,
  GateProj, UpProj, DownProj,                   ///< dense MLP
  ExpertGate, ExpertUp, ExpertDown,             ///< one 2-D Linear per expert
  ExpertsGateUp, ExpertsDown,                   ///< fused 3-D experts [E, N, K]
  SharedExpertGate, SharedExpertUp, SharedExpertDown, SharedExpertRouter,
  Router,
};
std::string_view module_role_name(ModuleRole role);

/// What a non-linear tensor does.
enum class TensorRole : uint8_t {
  Embedding,           ///< the token embedding table [vocab, H]
  InputNorm,           ///< a decoder layer's pre-attention RMSNorm [H]
  PostAttentionNorm,   ///< its pre-MLP RMSNorm [H]
  QNorm, KNorm,        ///< Qwen3 per-head RMSNorm on q and k [head_dim]
  Sinks,               ///< GPT-OSS attention sinks [num_attention_heads]
  FinalNorm,           ///< the RMSNorm before lm_head [H]
};

/// How experts are stored (FORMATS.md §4, §5).
enum class ExpertLayout : uint8_t { None, PerExpert, Fused3d };
/// How the gate and up projections of an expert are laid out: separate modules (fused at run time into w13),
/// one tensor whose first half of rows is gate (GraniteMoe `chunk(2)`), or alternating rows gate_i, up_i
/// (GPT-OSS).
enum class GateUpLayout : uint8_t { SeparateModules, ConcatenatedHalves, InterleavedRows };
/// Which module names a checkpoint gives its experts. Native: the architecture's own (table of FORMATS.md §4:
/// Mixtral `experts.<e>.w1/w3/w2`, GraniteMoe fused 3-D `input_linear/output_linear`, GPT-OSS fused blocks).
/// Linearized: LLM Compressor's per-expert Linear modules `<moe>.experts.<e>.{gate_proj,up_proj,down_proj}`,
/// which it saves under those names for architectures without a rename-on-save mapping (FORMATS.md §4; the
/// fixtures' Mixtral and GraniteMoe quantized folders). For Qwen-MoE both are the same names.
enum class ExpertNaming : uint8_t { Native, Linearized };

/// One module of a concrete model (layer and expert indices filled in).
struct ModuleInfo {
  std::string name;              ///< checkpoint module name, e.g. "model.layers.0.self_attn.q_proj"
  ModuleRole role = ModuleRole::QProj;
  int64_t layer = -1;            ///< -1 outside the decoder layers
  int64_t expert = -1;           ///< expert index of a per-expert Linear, else -1
  int64_t experts = 0;           ///< E of a fused 3-D experts module, else 0
  int64_t out_features = 0;      ///< N (per expert for fused 3-D)
  int64_t in_features = 0;       ///< K
  std::string fusion_group;      ///< runtime fused module (…qkv_proj, …gate_up_proj, …w13); "" when none
  /// The module's name in transformers' in-memory model when the checkpoint names it differently, "" otherwise:
  /// GraniteMoe's router Linear is `…block_sparse_moe.router` in memory and `…router.layer` on disk, and LLM
  /// Compressor writes ignore lists with the in-memory name.
  std::string runtime_name;
  std::string_view class_name;   ///< "Linear", "Embedding", "GptOssExperts", … (matched by CT class targets)
  bool has_bias = false;
  /// Separator between the module name and a tensor suffix: '.' ("P.weight"), '_' for GPT-OSS experts
  /// ("P_blocks", "P_bias").
  char separator = '.';
  /// Name of the unquantized weight tensor: "P.weight"; GPT-OSS experts "P" ([E, K, N], in×out);
  /// lm_head with tied embeddings "model.embed_tokens.weight" (shared, not a tensor of its own).
  std::string dense_weight;
  bool dense_weight_in_out = false;  ///< the unquantized weight is stored [.., K, N] (GPT-OSS experts)
  bool tied = false;                 ///< lm_head shares the embedding (tie_word_embeddings)

  std::string tensor(std::string_view suffix) const { return name + separator + std::string(suffix); }
};

/// A tensor that is not part of a linear module: norms, attention sinks, rotary buffers.
struct OtherTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string_view what;   ///< "rmsnorm weight", "attention sinks", …
  bool optional = false;   ///< may be absent (old exports save rotary inv_freq)
  bool dropped = false;    ///< read-and-ignored when present (recomputed at run time)
};

/// How a router turns its logits [E] into k expert weights (all fp32, in transformers' order of operations).
enum class RouterKind : uint8_t {
  SoftmaxTopK,  ///< softmax over all E, top-k of the probabilities, optional renormalization (Mixtral, Qwen-MoE)
  TopKSoftmax,  ///< top-k of the logits (+ router bias), softmax over the k (GraniteMoe, GPT-OSS)
};

/// Whether SoftmaxTopK divides the k probabilities by their sum.
enum class TopKRenormalize : uint8_t {
  Never,
  Always,      ///< MixtralSparseMoeBlock
  FromConfig,  ///< config `norm_topk_prob` (default false; Qwen-MoE)
};

/// The expert MLP's activation. Both read gate | up halves, so every expert has a gate and an up projection
/// (w13 = 2·I rows). A family whose experts are not gated has no row in the table below, so architecture_spec
/// refuses its config.json by architecture name; a checkpoint of a listed family that lacks an expert's gate
/// fails the plan's tensor contract (describe_model lists the gate modules, and a fused 3-D gate_up of I rows is
/// mis-shaped against its 2·I).
enum class ExpertActivation : uint8_t {
  SiluGated,    ///< silu(gate) · up
  SwigluOai,    ///< GPT-OSS: (clamp(up) + 1) · g · sigmoid(alpha · g), g = min(gate, limit)
};

/// Where an architecture's attention window comes from.
enum class SlidingWindowRule : uint8_t {
  None,                    ///< full attention
  FromConfig,              ///< `sliding_window` on every layer (Mistral, Mixtral; null / absent = full)
  LayerTypes,              ///< `layer_types` marks each layer sliding_attention / full_attention (GPT-OSS)
  /// Qwen families: a config with `use_sliding_window: true` (windows on the layers from `max_window_layers` on)
  /// is refused by name, as before this table; published Qwen2/Qwen3 checkpoints set it false.
  RefuseUseSlidingWindow,
};

/// Static description of one supported `architectures[0]`: everything the plan, the quantizer and the model need
/// to know about a family besides config.json's numbers. Module and tensor names come from module_name /
/// tensor_name below.
struct ArchitectureSpec {
  std::string_view name = {};
  ExpertLayout experts = ExpertLayout::None;
  GateUpLayout gate_up = GateUpLayout::SeparateModules;
  bool qk_norm = false;            ///< Qwen3: per-head RMSNorm on q and k
  bool attention_sinks = false;    ///< GPT-OSS
  bool qkv_bias_always = false;    ///< Qwen2 families: q/k/v biases regardless of config
  bool attention_bias_default = false;
  bool shared_expert = false;      ///< Qwen2-MoE
  std::string_view experts_key = {};  ///< config key of the expert count ("" for dense)
  std::string_view experts_key_alias = {};  ///< accepted when experts_key is absent (transformers 5 Qwen-MoE
                                            ///< configs write num_local_experts)
  std::string_view moe_prefix = {};  ///< submodule of a decoder layer holding router and experts
  std::string_view router = {};    ///< router module template, "" for dense
  RouterKind router_kind = RouterKind::SoftmaxTopK;
  TopKRenormalize renormalize = TopKRenormalize::Never;
  ExpertActivation expert_activation = ExpertActivation::SiluGated;
  SlidingWindowRule sliding_window = SlidingWindowRule::None;
  /// Granite: embedding_multiplier, residual_multiplier, attention_multiplier (the softmax scale) and
  /// logits_scaling (logits are divided by it) from config.json.
  bool granite_multipliers = false;
};

/// "model.layers.<layer>": the prefix of decoder layer `layer`'s modules and tensors.
std::string layer_name(const ArchitectureSpec& spec, int64_t layer);
/// The attention module of decoder layer `layer` ("model.layers.<layer>.self_attn"; online q_attn / k_cache
/// transforms and sinks hang off it).
std::string attention_module(const ArchitectureSpec& spec, int64_t layer);
/// The checkpoint name of the one linear module of `role` in decoder layer `layer` (ignored for Embedding and
/// LmHead): attention projections, dense MLP projections, the shared expert's. Throws UsageError for the
/// per-expert and router roles, whose names describe_model lists (they depend on the expert naming).
std::string module_name(const ArchitectureSpec& spec, ModuleRole role, int64_t layer);
/// The checkpoint name of the tensor of `role` in decoder layer `layer` (ignored for Embedding / FinalNorm).
std::string tensor_name(const ArchitectureSpec& spec, TensorRole role, int64_t layer);

/// The architectures fp4serve describes, in a stable order.
std::span<const ArchitectureSpec> supported_architectures();

/// The spec of `architecture`. Throws UnsupportedError listing the supported architectures when unknown.
const ArchitectureSpec& architecture_spec(std::string_view architecture);

/// A concrete model: dimensions, every module and every non-linear tensor, in checkpoint naming.
struct ModelLayout {
  const ArchitectureSpec* spec = nullptr;
  ModelDims dims;
  ExpertNaming expert_naming = ExpertNaming::Native;
  std::vector<ModuleInfo> modules;
  std::vector<OtherTensor> others;
};

/// Reads config.json. Throws FormatError when `architectures` is missing or not a list of strings, or a required
/// dimension is missing, not an integer or not positive (the message names the key and the architecture);
/// UnsupportedError for an unknown architecture.
ModelDims read_model_dims(const nlohmann::json& config);

/// Every module and non-linear tensor of the model described by `config`, layer by layer, with the experts
/// named as `naming` says. Same errors as read_model_dims.
ModelLayout describe_model(const nlohmann::json& config, ExpertNaming naming = ExpertNaming::Native);

/// The expert naming of a checkpoint, keyed off its tensor names as FORMATS.md §4 requires (the same config can
/// come with either naming): Linearized when `has_tensor_prefix` finds a tensor under
/// `model.layers.<L>.<moe_prefix>.experts.0.gate_proj.` for the first MoE layer L and the native naming differs;
/// Native otherwise (dense models included). The contract check then holds every expert tensor to that one
/// naming, so a checkpoint that mixes both is an error listing the strays.
ExpertNaming detect_expert_naming(const ModelDims& dims, const std::function<bool(std::string_view prefix)>& has_tensor_prefix);

std::string_view expert_naming_name(ExpertNaming naming);

}  // namespace fp4serve::checkpoint
