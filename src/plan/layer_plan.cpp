// SPDX-License-Identifier: Apache-2.0
#include "plan/layer_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <unordered_set>

#include "fp4serve/error.h"
#include "plan/name_pattern.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::plan {
namespace {

using checkpoint::ModuleInfo;

std::string shape_str(const std::vector<int64_t>& s) { return core::shape_to_string(s); }

std::string dtypes_str(const std::vector<core::DType>& ds) {
  std::vector<std::string_view> names;
  for (core::DType d : ds) names.push_back(core::dtype_name(d));
  return fmt::format("{}", fmt::join(names, " or "));
}

std::string not_quantized_text(const ModulePlan& mp) {
  const quant::LayerQuant& q = mp.quant;
  std::string text;
  switch (q.origin) {
    case quant::MatchOrigin::NotQuantized: text = "plain checkpoint (no quantization config)"; break;
    case quant::MatchOrigin::Ignored:
      text = fmt::format("ignored by '{}' ({})", q.source, quant::match_kind_name(q.match_kind.value_or(quant::MatchKind::Exact)));
      break;
    case quant::MatchOrigin::Excluded: text = fmt::format("excluded by '{}'", q.source); break;
    case quant::MatchOrigin::NotTargeted: text = "no config group targets it"; break;
    case quant::MatchOrigin::NotListed: text = "MIXED_PRECISION: not listed in quantized_layers"; break;
    case quant::MatchOrigin::Group: text = fmt::format("config group '{}' quantizes nothing", q.source); break;
  }
  if (mp.module.tied) text += "; tied to model.embed_tokens.weight";
  return text;
}

// The quantization-relevant identity of a shard: shards of one fused group run fused only when these agree.
bool same_quant(const ModulePlan& a, const ModulePlan& b) {
  return a.scheme == b.scheme && a.variant == b.variant && a.quant.weights == b.quant.weights &&
         a.quant.input == b.quant.input && a.quant.format == b.quant.format && a.module.has_bias == b.module.has_bias;
}

std::string shard_summary(const ModulePlan& mp) {
  const std::string_view name = mp.module.name;
  const std::string_view leaf = name.substr(name.rfind('.') + 1);
  std::string s = fmt::format("{} {}", leaf, mp.scheme ? scheme_name(*mp.scheme) : "none");
  if (!mp.quant.quantized()) s += fmt::format(" ({})", not_quantized_text(mp));
  else s += fmt::format(" ({} '{}')", mp.quant.format_name, mp.quant.source);
  return s;
}

// Validates one contract entry of `owner` (a module, or an attention block for q_attn / k_cache transforms)
// against the headers, records the use, and collects problems. `dims` names the sizes the expected shape comes
// from; `shape_hint` (may be empty) adds an explanation to a mis-shape.
void check_contract(const TensorContract& c, std::string_view owner, std::string_view dims, const TensorHeaders& headers,
                    const std::function<std::string(const TensorHeader&)>& shape_hint, std::vector<TensorUse>& uses,
                    std::unordered_set<std::string>& consumed, std::vector<std::string>& problems) {
  const auto it = headers.find(c.name);
  if (it == headers.end()) {
    if (c.required) {
      problems.push_back(fmt::format("missing {} (layer {}, {}): expected {} {} = {}", c.name, owner,
                                     tensor_role_name(c.role), dtypes_str(c.dtypes), c.formula, shape_str(c.shapes.front())));
    }
    return;
  }
  consumed.insert(c.name);
  const TensorHeader& h = it->second;
  if (std::find(c.dtypes.begin(), c.dtypes.end(), h.dtype) == c.dtypes.end()) {
    problems.push_back(fmt::format("mis-typed {} (layer {}): expected {}, found {}", c.name, owner,
                                   dtypes_str(c.dtypes), core::dtype_name(h.dtype)));
  }
  if (std::find(c.shapes.begin(), c.shapes.end(), h.shape) == c.shapes.end()) {
    problems.push_back(fmt::format("mis-shaped {} (layer {}, {}): expected {} = {}, found {}{}", c.name, owner, dims,
                                   c.formula, shape_str(c.shapes.front()), shape_str(h.shape),
                                   shape_hint ? shape_hint(h) : std::string()));
  }
  uses.push_back({c.name, c.role, h.dtype, h.shape, h.bytes, c.dropped, c.shared});
}

// check_contract for a Linear module's tensor; a block-scale shape that implies another group size than the
// config's says that the config's group_size is stale.
void check_tensor(const TensorContract& c, const ModulePlan& mp, const TensorHeaders& headers,
                  std::vector<TensorUse>& uses, std::unordered_set<std::string>& consumed,
                  std::vector<std::string>& problems) {
  const int64_t k = mp.module.in_features;
  const auto stale_group_size = [&](const TensorHeader& h) -> std::string {
    const auto& w = mp.quant.weights;
    if (c.role == TensorRole::WeightScale && w && w->group_size && h.shape.size() == 2 && h.shape[1] > 0 &&
        k % h.shape[1] == 0 && k / h.shape[1] != *w->group_size) {
      return fmt::format("; the config's group_size {} is stale: the tensor implies group_size {}", *w->group_size,
                         k / h.shape[1]);
    }
    return {};
  };
  check_contract(c, mp.module.name, fmt::format("N={}, K={}", mp.module.out_features, k), headers, stale_group_size,
                 uses, consumed, problems);
}

// compressed-tensors ties the matrices (and perms) of one transform group that have the same size
// (`HadamardFactory.weights` is keyed by size, `perms` by weight, `_dynamic_tied_weights_keys`), and save_pretrained
// then writes only one of them: e.g. `model.layers.0.self_attn.q_proj.v_input.weight` stands for every 256-wide `v`
// matrix. A module whose own `P.<group>_<location>.weight` is absent uses the stored one with the same group suffix
// and shape; failing that, one of the same group and size at another online location (SpinQuant R3's q_attn and
// k_cache are one parameter, stored once).
class SharedTransforms {
 public:
  explicit SharedTransforms(const TensorHeaders& headers) {
    for (const auto& [name, h] : headers) {
      for (auto [k, map] : {std::pair{key(name, h.shape), &by_key_}, std::pair{group_key(name, h.shape), &by_group_}}) {
        if (k.empty()) continue;
        auto [it, inserted] = map->emplace(k, name);
        if (!inserted && name < it->second) it->second = name;  // deterministic choice; tied copies are identical
      }
    }
  }
  /// Points `c` at the stored tied tensor when there is one; leaves it unchanged (reported missing) otherwise.
  void resolve(TensorContract& c) const {
    if (c.shapes.empty()) return;
    auto it = by_key_.find(key(c.name, c.shapes.front()));
    if (it == by_key_.end()) {
      it = by_group_.find(group_key(c.name, c.shapes.front()));
      if (it == by_group_.end()) return;
    }
    c.name = it->second;
    c.shared = true;
  }

 private:
  // "model.layers.0.self_attn.q_proj.v_input.weight" [256, 256] → "v_input.weight#256": the last two name
  // components and the size; "" for names that cannot be transform tensors.
  static std::string key(const std::string& name, const std::vector<int64_t>& shape) {
    if (shape.empty() || !(name.ends_with(".weight") || name.ends_with(".perm"))) return {};
    const size_t last = name.rfind('.');
    const size_t dot = last == 0 ? std::string::npos : name.rfind('.', last - 1);
    if (dot == std::string::npos) return {};
    return fmt::format("{}#{}", name.substr(dot + 1), shape.front());
  }
  // "….self_attn.R3_k_cache.weight" [32, 32] → "R3 weight#32": the group without its online location.
  static std::string group_key(const std::string& name, const std::vector<int64_t>& shape) {
    const std::string k = key(name, shape);
    const size_t dot = k.find('.');
    if (dot == std::string::npos) return {};
    const std::string component = k.substr(0, dot);
    for (std::string_view location : {"_input", "_output", "_q_attn", "_k_cache"}) {
      if (component.size() > location.size() && component.ends_with(location) && !component.ends_with("_weight" + std::string(location))) {
        return fmt::format("{} {}", component.substr(0, component.size() - location.size()), k.substr(dot + 1));
      }
    }
    return {};
  }
  std::unordered_map<std::string, std::string> by_key_;
  std::unordered_map<std::string, std::string> by_group_;
};

// The layer's shape as the device catalogue is asked about it (the scheme is filled in per candidate).
LinearQuery linear_query(const ModulePlan& mp) {
  LinearQuery q;
  q.role = mp.module.role;
  q.out_features = mp.module.out_features;
  q.in_features = mp.module.in_features;
  q.fused_experts = mp.module.experts > 0;
  if (const auto& w = mp.quant.weights) {
    if (w->group_size && *w->group_size > 0) q.group_size = *w->group_size;
    q.activation_order = w->actorder == quant::ActOrder::Group;
  }
  return q;
}

// The block b of each online transform of a module: its TransformMatrix tensors are [b, b] (the contract lists a
// matrix for online transforms only; offline ones are folded into the weights and run nothing). By role, not by
// name: a tied matrix may be stored under another location of the same group (SharedTransforms).
std::vector<int64_t> online_transform_blocks(const ModulePlan& mp) {
  std::vector<int64_t> blocks;
  for (const TensorUse& u : mp.tensors) {
    if (u.role == TensorRole::TransformMatrix && !u.shape.empty()) blocks.push_back(u.shape.front());
  }
  return blocks;
}

// Why an online transform of a module cannot run, or "" when every one can: `input` and `output` run around the
// GEMM of a Linear (model/linear_group.h); `q_attn` / `k_cache` belong to attention modules, not Linears.
std::string unexecuted_transform(const ModulePlan& mp) {
  int inputs = 0, outputs = 0;
  for (const quant::TransformUse& t : mp.quant.transforms) {
    if (!t.online) continue;
    if (t.location == "q_attn" || t.location == "k_cache") {
      return fmt::format("online transform {} at location `{}` targets a {}; it is applied only to attention modules "
                         "(self_attn)", t.group, t.location, mp.module.class_name);
    }
    if (t.location != "input" && t.location != "output") {
      return fmt::format("online transform {} has unknown location `{}`", t.group, t.location);
    }
    if (mp.module.role == checkpoint::ModuleRole::Embedding) {
      return fmt::format("online transform {} at location `{}` on the embedding is not executed (only Linear modules "
                         "run online transforms)", t.group, t.location);
    }
    if (mp.module.experts > 0) {
      return fmt::format("online transform {} at location `{}` on fused 3-D experts is not executed (only 2-D Linear "
                         "modules run online transforms)", t.group, t.location);
    }
    (t.location == "input" ? inputs : outputs) += 1;
  }
  if (inputs > 1 || outputs > 1) {
    return fmt::format("{} online `{}` transforms on one module are not executed (one per location is)",
                       std::max(inputs, outputs), inputs > 1 ? "input" : "output");
  }
  return {};
}

// The transformers class of an architecture's attention module ("LlamaForCausalLM" → "LlamaAttention"), for
// compressed-tensors class-name targets.
std::string attention_class(const std::string& architecture) {
  constexpr std::string_view kSuffix = "ForCausalLM";
  const std::string base = architecture.ends_with(kSuffix) ? architecture.substr(0, architecture.size() - kSuffix.size()) : architecture;
  return base + "Attention";
}

// The q_attn / k_cache transforms of every attention module, with their tensors checked against the headers.
void plan_attention_transforms(const quant::QuantConfig& qc, const SharedTransforms& shared, const TensorHeaders& headers,
                               LayerPlan& plan, std::unordered_set<std::string>& consumed,
                               std::vector<std::string>& problems) {
  if (qc.transforms.empty()) return;
  const std::string cls = attention_class(plan.dims.architecture);
  const std::array<std::string_view, 1> classes{cls};
  const int64_t head_dim = plan.dims.head_dim;
  for (int64_t layer = 0; layer < plan.dims.num_hidden_layers; ++layer) {
    const std::string module = checkpoint::attention_module(checkpoint::architecture_spec(plan.dims.architecture), layer);
    const quant::LayerQuant lq = quant::resolve_layer_quant(qc, {module, classes});
    for (const quant::TransformUse& t : lq.transforms) {
      if (t.location != "q_attn" && t.location != "k_cache") {
        problems.push_back(fmt::format("transform group {} at location `{}` targets the attention module {}, which is "
                                       "not a Linear (only q_attn / k_cache apply there)", t.group, t.location, module));
        continue;
      }
      AttentionTransform at{module, layer, t, t.head_dim.value_or(head_dim), {}};
      const std::string base = fmt::format("{}.{}_{}", module, t.group, t.location);
      const bool divides = at.block >= 1 && head_dim % at.block == 0;
      if (!divides) {  // its tensors are still consumed below, so this is the one problem reported about them
        problems.push_back(fmt::format("{}.weight (layer {}): transform head_dim {} does not divide the model's head_dim {}",
                                       base, module, at.block, head_dim));
        at.block = std::max<int64_t>(at.block, 1);
      }
      std::vector<TensorContract> contract;
      contract.push_back({base + ".weight", TensorRole::TransformMatrix, {core::DType::BF16, core::DType::F16,
                          core::DType::F32, core::DType::F64}, {{at.block, at.block}}, "[b, b], b dividing head_dim"});
      if (t.randomize) {
        contract.push_back({base + ".perm", TensorRole::TransformPerm, {core::DType::I64, core::DType::I32},
                            {{at.block}}, "[b]"});
      }
      for (TensorContract& c : contract) {
        if (!headers.contains(c.name)) shared.resolve(c);
        check_contract(c, module, fmt::format("head_dim {}", head_dim), headers, {}, at.tensors, consumed, problems);
      }
      if (divides) plan.attention_transforms.push_back(std::move(at));
    }
  }
}

void add_other(const std::string& name, std::vector<std::vector<int64_t>> shapes, bool optional, bool dropped,
               std::string_view what, const TensorHeaders& headers, LayerPlan& plan,
               std::unordered_set<std::string>& consumed, std::vector<std::string>& problems) {
  const auto it = headers.find(name);
  if (it == headers.end()) {
    if (!optional) problems.push_back(fmt::format("missing {} ({}): expected a float tensor {}", name, what, shape_str(shapes.front())));
    return;
  }
  consumed.insert(name);
  const TensorHeader& h = it->second;
  if (h.dtype != core::DType::BF16 && h.dtype != core::DType::F16 && h.dtype != core::DType::F32) {
    problems.push_back(fmt::format("mis-typed {} ({}): expected BF16, F16 or F32, found {}", name, what, core::dtype_name(h.dtype)));
  }
  if (std::find(shapes.begin(), shapes.end(), h.shape) == shapes.end()) {
    problems.push_back(fmt::format("mis-shaped {} ({}): expected {}, found {}", name, what, shape_str(shapes.front()), shape_str(h.shape)));
  }
  plan.others.push_back({name, TensorRole::Weight, h.dtype, h.shape, h.bytes, dropped, false});
}

void add_notice(std::vector<Notice>& notices, Notice n) {
  for (Notice& existing : notices) {
    if (existing.severity == n.severity && existing.variant == n.variant && existing.scheme == n.scheme &&
        existing.reason == n.reason && (n.reason.has_value() || existing.text == n.text)) {
      existing.layers += n.layers;
      return;
    }
  }
  notices.push_back(std::move(n));
}

}  // namespace

const TensorUse* ModulePlan::tensor(TensorRole role) const {
  for (const TensorUse& t : tensors) {
    if (t.role == role) return &t;
  }
  return nullptr;
}

const TensorUse* AttentionTransform::tensor(TensorRole role) const {
  for (const TensorUse& t : tensors) {
    if (t.role == role) return &t;
  }
  return nullptr;
}

const AttentionTransform* LayerPlan::attention_transform(int64_t layer, std::string_view location) const {
  for (const AttentionTransform& t : attention_transforms) {
    if (t.layer == layer && t.transform.location == location) return &t;
  }
  return nullptr;
}

bool LayerPlan::complete() const {
  return attention.ok() &&
         std::all_of(modules.begin(), modules.end(), [](const ModulePlan& m) { return m.scheme.has_value(); });
}

const ModulePlan* LayerPlan::find(std::string_view name) const {
  for (const ModulePlan& m : modules) {
    if (m.module.name == name) return &m;
  }
  return nullptr;
}

const Notice* LayerPlan::warning(Reason r) const {
  for (const Notice& n : notices) {
    if (n.severity == Severity::Warning && n.reason == r) return &n;
  }
  return nullptr;
}

TensorHeaders read_headers(const checkpoint::Checkpoint& ckpt) {
  TensorHeaders out;
  for (const auto& shard : ckpt.shards()) {
    for (const auto& e : shard->header().tensors) out.emplace(e.name, TensorHeader{e.dtype, e.shape, e.end - e.begin});
  }
  return out;
}

LayerPlan build_plan(const nlohmann::json& config, const nlohmann::json& hf_quant_config, const TensorHeaders& headers,
                     const PlanOptions& options) {
  if (options.catalogue == nullptr) throw UsageError("build_plan: no kernel catalogue for the target device");
  const KernelCatalogue& catalogue = *options.catalogue;
  LayerPlan plan;
  plan.device = catalogue.device();
  plan.backend = catalogue.backend();
  plan.activation_quant = options.activation_quant;
  const quant::QuantConfig qc = quant::parse_quant_config(config, hf_quant_config);
  plan.producer = qc.producer;
  const checkpoint::ExpertNaming naming =
      checkpoint::detect_expert_naming(checkpoint::read_model_dims(config), [&](std::string_view prefix) {
        return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return h.first.starts_with(prefix); });
      });
  const checkpoint::ModelLayout layout = checkpoint::describe_model(config, naming);
  plan.expert_naming = naming;
  plan.dims = layout.dims;
  std::vector<std::string> problems;

  // 1. Quantization, variant (rule 1) and scheme of every module.
  plan.modules.reserve(layout.modules.size());
  for (const ModuleInfo& m : layout.modules) {
    ModulePlan mp;
    mp.module = m;
    const std::array<std::string_view, 1> classes{m.class_name};
    mp.quant = quant::resolve_layer_quant(qc, {m.name, classes});
    if (!m.runtime_name.empty()) {  // an ignore/exclude entry may use the in-memory name
      quant::LayerQuant by_runtime = quant::resolve_layer_quant(qc, {m.runtime_name, classes});
      if (by_runtime.origin == quant::MatchOrigin::Ignored || by_runtime.origin == quant::MatchOrigin::Excluded) {
        mp.quant = std::move(by_runtime);
      }
    }
    mp.variant = classify_layer(mp.quant, m);
    mp.run_name = m.name;
    // Online `input` / `output` transforms run around the GEMM (model/linear_group.h); anything else a Linear
    // cannot run leaves the layer without a scheme rather than with wrong numerics.
    if (std::string why = unexecuted_transform(mp); !why.empty()) {
      mp.reason = Reason::OnlineTransform;
      mp.reason_text = why + "; the layer has no scheme";
    } else {
      Selection s = select_scheme(mp.variant, catalogue, options.activation_quant, linear_query(mp));
      mp.scheme = s.scheme;
      mp.kernel = std::move(s.kernel);
      mp.reason = s.reason;
      mp.reason_text = std::move(s.reason_text);
      mp.rejected = std::move(s.rejected);
    }
    if (mp.reason == Reason::NotQuantized) mp.reason_text = not_quantized_text(mp);
    mp.global_scale = global_scale_convention(mp.variant, mp.quant);
    plan.modules.push_back(std::move(mp));
  }

  // 2. Fused groups (rule 4): run fused only when every shard agrees; otherwise each runs alone.
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < plan.modules.size(); ++i) {
    if (!plan.modules[i].module.fusion_group.empty()) groups[plan.modules[i].module.fusion_group].push_back(i);
  }
  for (const auto& [group, members] : groups) {
    const ModulePlan& first = plan.modules[members.front()];
    const bool agree = std::all_of(members.begin(), members.end(),
                                   [&](size_t i) { return same_quant(first, plan.modules[i]); });
    if (agree) {
      for (size_t i : members) {
        plan.modules[i].run_fused = true;
        plan.modules[i].run_name = group;
      }
      continue;
    }
    std::vector<std::string> shards;
    for (size_t i : members) shards.push_back(shard_summary(plan.modules[i]));
    add_notice(plan.notices, {Severity::Warning, first.variant, std::nullopt, std::nullopt,
                              fmt::format("{}: shards disagree ({}); they run unfused, each with its own scheme",
                                          name_pattern(group), fmt::join(shards, "; ")),
                              members.size()});
  }

  // 3. Parameter contracts against the headers (rule 6), collecting every problem.
  std::unordered_set<std::string> consumed;
  const SharedTransforms shared_transforms(headers);
  for (ModulePlan& mp : plan.modules) {
    std::vector<SchemeId> table = scheme_candidates(mp.variant, options.activation_quant);
    if (table.empty()) table = scheme_candidates(mp.variant, ActivationQuant::Auto);  // refused emulate: check as stored
    const SchemeId contract_scheme = mp.scheme ? *mp.scheme : table.front();
    auto contract = parameter_contract(contract_scheme, mp.variant, mp.quant, mp.module, problems);
    for (TensorContract& c : contract) {
      if ((c.role == TensorRole::TransformMatrix || c.role == TensorRole::TransformPerm) && !headers.contains(c.name)) {
        shared_transforms.resolve(c);
      }
      check_tensor(c, mp, headers, mp.tensors, consumed, problems);
      if (c.role == TensorRole::InputGlobalScale || c.role == TensorRole::InputScale) mp.has_input_global_scale = true;
    }
  }
  plan_attention_transforms(qc, shared_transforms, headers, plan, consumed, problems);
  for (const checkpoint::OtherTensor& t : layout.others) {
    add_other(t.name, {t.shape}, t.optional, t.dropped, t.what, headers, plan, consumed, problems);
  }
  if (qc.kv_cache) {  // KV-cache scales live on the attention module (CT) or on k_proj/v_proj (ModelOpt)
    const bool modelopt = qc.producer.producer == quant::Producer::ModelOpt;
    const bool per_head = qc.kv_cache->strategy == quant::Strategy::AttnHead;
    std::vector<std::vector<int64_t>> shapes = per_head ? std::vector<std::vector<int64_t>>{{plan.dims.num_key_value_heads, 1, 1}}
                                                        : std::vector<std::vector<int64_t>>{{1}, {}};
    for (int64_t layer = 0; layer < plan.dims.num_hidden_layers; ++layer) {
      const std::string a = checkpoint::attention_module(checkpoint::architecture_spec(plan.dims.architecture), layer);
      add_other(modelopt ? a + ".k_proj.k_scale" : a + ".k_scale", shapes, false, false, "KV-cache scale", headers, plan, consumed, problems);
      add_other(modelopt ? a + ".v_proj.v_scale" : a + ".v_scale", shapes, false, false, "KV-cache scale", headers, plan, consumed, problems);
    }
  }
  std::vector<std::string> unconsumed;
  for (const auto& [name, header] : headers) {
    if (!consumed.contains(name)) unconsumed.push_back(name);
  }
  std::sort(unconsumed.begin(), unconsumed.end());
  for (const std::string& name : unconsumed) {
    problems.push_back(fmt::format("unconsumed {} ({} {}): no module of {} declares it", name,
                                   core::dtype_name(headers.at(name).dtype), shape_str(headers.at(name).shape),
                                   plan.dims.architecture));
  }
  if (!problems.empty()) {
    constexpr size_t kShown = 40;
    std::string message = fmt::format("checkpoint tensors do not match the plan ({} problem{}):", problems.size(),
                                      problems.size() == 1 ? "" : "s");
    for (size_t i = 0; i < std::min(kShown, problems.size()); ++i) message += "\n  " + problems[i];
    if (problems.size() > kShown) message += fmt::format("\n  … and {} more", problems.size() - kShown);
    throw FormatError(message);
  }

  // 4. What the device runs besides the GEMMs: the online transforms of each module and of attention, and the
  // attention itself. A refusal leaves the layer (or the plan) without a kernel, as a GEMM refusal does.
  for (ModulePlan& mp : plan.modules) {
    if (!mp.scheme) continue;
    for (int64_t block : online_transform_blocks(mp)) {
      const KernelChoice t = catalogue.online_transform({block});
      if (t.ok()) continue;
      mp.scheme.reset();
      mp.kernel = t;
      mp.reason = Reason::OnlineTransform;
      mp.reason_text = t.why_not + "; the layer has no scheme";
      break;
    }
  }
  const checkpoint::ModelDims& d = plan.dims;
  plan.attention = catalogue.attention({d.head_dim, d.num_attention_heads, d.num_key_value_heads});
  for (const AttentionTransform& at : plan.attention_transforms) {
    if (!plan.attention.ok()) break;
    const KernelChoice t = catalogue.online_transform({at.block});
    if (!t.ok()) plan.attention = KernelChoice::refused(fmt::format("{} {}: {}", at.module, at.transform.location, t.why_not));
  }

  // 5. Notices: once per distinct (variant, scheme, reason), with the number of layers.
  for (const ModulePlan& mp : plan.modules) {
    if (reason_is_warning(mp.reason)) {
      add_notice(plan.notices, {Severity::Warning, mp.variant, mp.scheme, mp.reason, mp.reason_text, 1});
    } else if (mp.reason == Reason::WeightOnlyByDesign) {
      add_notice(plan.notices, {Severity::Info, mp.variant, mp.scheme, mp.reason, mp.reason_text, 1});
    }
  }
  return plan;
}

LayerPlan build_plan(const checkpoint::Checkpoint& ckpt, const PlanOptions& options) {
  return build_plan(ckpt.config(), ckpt.hf_quant_config(), read_headers(ckpt), options);
}

void check_scale_values(const LayerPlan& plan, const checkpoint::Checkpoint& ckpt) {
  std::vector<std::string> bad;
  for (const ModulePlan& mp : plan.modules) {
    for (const TensorUse& t : mp.tensors) {
      const bool global = t.role == TensorRole::WeightGlobalScale || t.role == TensorRole::InputGlobalScale;
      if (!global && t.role != TensorRole::InputScale) continue;
      const core::TensorView v = ckpt.tensor(t.name);
      if (v.numel() != 1) continue;
      // Contracts admit only these dtypes for scalar scales; anything else was already reported.
      if (v.dtype != core::DType::F32 && v.dtype != core::DType::BF16 && v.dtype != core::DType::F16) continue;
      const float value = quant::load_float(v, 0, t.name);
      const bool divisor = global && mp.global_scale == quant::GlobalScaleConvention::Divisor;
      if (!std::isfinite(value) || value < 0.0f || (divisor && value == 0.0f)) {
        bad.push_back(fmt::format("{} = {} ({} {}; must be finite{})", t.name, value,
                                  divisor ? "divisor" : "multiplier", tensor_role_name(t.role),
                                  divisor ? " and positive" : " and non-negative"));
      }
    }
  }
  if (!bad.empty()) {
    throw FormatError(fmt::format("invalid global/input scales (a zero divisor would become Inf and spread through a "
                                  "fused max):\n  {}", fmt::join(bad, "\n  ")));
  }
}

}  // namespace fp4serve::plan
