// SPDX-License-Identifier: Apache-2.0
#include "plan/explain.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <tuple>

#include "plan/name_pattern.h"

namespace fp4serve::plan {
namespace {

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string scheme_label(const std::optional<SchemeId>& s) { return s ? std::string(scheme_name(*s)) : "-"; }

}  // namespace

namespace {

// "<location> <group> <type> b<block> <kernel>"; the kernel guess matches model::TransformCache, which runs an
// exact Sylvester matrix as the FWHT, a stored matrix that verifies as signs · (A ⊗ H_p) · signs (what
// compressed-tensors builds for `hadamard` of other sizes and for `random-hadamard`) as the Kronecker kernel, and
// anything else as a dense block-diagonal rotation. The guess reads the config; the load checks the matrix.
std::string transform_text(const quant::TransformUse& t, int64_t block) {
  const bool pow2 = block >= 2 && (block & (block - 1)) == 0;
  const bool hadamard = t.type == "hadamard" || t.type == "random-hadamard";
  const char* kernel = t.type == "hadamard" && !t.randomize && pow2 ? "fwht" : hadamard ? "kronecker-hadamard" : "dense";
  return fmt::format("{} {} {} b{} {}", t.location, t.group, t.type, block, kernel);
}

}  // namespace

std::string online_transform_summary(const ModulePlan& mp) {
  std::vector<std::string> parts;
  for (const quant::TransformUse& t : mp.quant.transforms) {
    if (!t.online) continue;
    int64_t block = 0;
    const std::string suffix = fmt::format(".{}_{}.weight", t.group, t.location);
    for (const TensorUse& u : mp.tensors) {
      if (u.role == TensorRole::TransformMatrix && u.name.ends_with(suffix) && !u.shape.empty()) block = u.shape.front();
    }
    parts.push_back(transform_text(t, block));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string attention_transform_summary(const AttentionTransform& at) { return transform_text(at.transform, at.block); }

std::vector<ExplainRow> explain_rows(const LayerPlan& plan) {
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string, std::string>;
  std::map<Key, size_t> index;
  std::vector<ExplainRow> rows;
  std::vector<std::set<std::string>> runs;
  const std::string& backend = plan.backend;
  for (const ModulePlan& mp : plan.modules) {
    const std::string pattern = name_pattern(mp.run_name);
    const std::string variant(variant_name(mp.variant));
    const std::string scheme = scheme_label(mp.scheme);
    const std::string kernel = mp.scheme ? mp.kernel.kernel : "-";
    // Reasons name modules ("ignored by 'model.layers.3.mlp.gate'"); collapse their indices too.
    const std::string reason = name_pattern(mp.reason_text);
    std::string transform = online_transform_summary(mp);
    const Key key{pattern, variant, scheme, kernel, reason, transform};
    auto [it, inserted] = index.emplace(key, rows.size());
    if (inserted) {
      rows.push_back({pattern, 0, variant, scheme, mp.scheme ? backend : "-", kernel,
                      !mp.scheme || mp.kernel.hardware_verified, reason, std::string(reason_code(mp.reason)),
                      std::move(transform)});
      runs.emplace_back();
    }
    runs[it->second].insert(mp.run_name);
  }
  // Attention-module transforms (q_attn, k_cache) have no scheme of their own: one row per pattern and transform.
  for (const AttentionTransform& at : plan.attention_transforms) {
    const std::string pattern = name_pattern(at.module);
    std::string transform = attention_transform_summary(at);
    const std::string reason = at.transform.location == "q_attn"
                                   ? "post-RoPE query states, per head, before the attention scores"
                                   : "post-RoPE key states, per head, before they are written to the KV cache";
    const std::string kernel = plan.attention.ok() ? plan.attention.kernel : "-";
    const Key key{pattern, "attention", "-", kernel, reason, transform};
    auto [it, inserted] = index.emplace(key, rows.size());
    if (inserted) {
      rows.push_back({pattern, 0, "attention", "-", backend, kernel, plan.attention.hardware_verified, reason,
                      "online-transform", std::move(transform)});
      runs.emplace_back();
    }
    runs[it->second].insert(at.module);
  }
  for (size_t i = 0; i < rows.size(); ++i) rows[i].count = runs[i].size();
  return rows;
}

std::vector<SchemeTotal> scheme_totals(const LayerPlan& plan) {
  std::map<std::string, SchemeTotal> totals;
  for (const ModulePlan& mp : plan.modules) {
    const std::string scheme = scheme_label(mp.scheme);
    SchemeTotal& t = totals[scheme];
    t.scheme = scheme;
    t.modules += 1;
    for (const TensorUse& u : mp.tensors) {
      if (u.shared) continue;  // a tied lm_head reads the embedding's bytes
      t.checkpoint_bytes += u.bytes;
      if (!u.dropped) t.resident_bytes += u.bytes;
    }
  }
  std::vector<SchemeTotal> out;
  for (auto& [name, t] : totals) out.push_back(t);
  return out;
}

namespace {

// Non-linear tensors as loaded: norms, sinks, KV scales, and the attention transforms' matrices (tied copies once).
std::pair<size_t, uint64_t> non_linear_totals(const LayerPlan& plan) {
  size_t count = 0;
  uint64_t bytes = 0;
  for (const TensorUse& u : plan.others) {
    ++count;
    if (!u.dropped) bytes += u.bytes;
  }
  for (const AttentionTransform& at : plan.attention_transforms) {
    for (const TensorUse& u : at.tensors) {
      if (u.shared) continue;
      ++count;
      bytes += u.bytes;
    }
  }
  return {count, bytes};
}

}  // namespace

uint64_t resident_bytes(const LayerPlan& plan) {
  uint64_t bytes = non_linear_totals(plan).second;
  for (const SchemeTotal& t : scheme_totals(plan)) bytes += t.resident_bytes;
  return bytes;
}

std::string render_explain_text(const LayerPlan& plan, const std::string& source, bool verbose) {
  std::string out;
  const auto& d = plan.dims;
  out += fmt::format("checkpoint: {}\n", source);
  out += fmt::format("model: {}, {} layers, hidden {}", d.architecture, d.num_hidden_layers, d.hidden_size);
  if (d.num_experts > 0) {
    out += fmt::format(", {} experts (top {}), expert names: {}", d.num_experts, d.num_experts_per_tok,
                       checkpoint::expert_naming_name(plan.expert_naming));
  }
  out += fmt::format("; producer: {}", quant::producer_name(plan.producer.producer));
  if (!plan.producer.formats.empty()) out += fmt::format(" ({})", fmt::join(plan.producer.formats, ", "));
  out += fmt::format("\ndevice: {} — {}{}; backend: {}; activation-quant: {}\n", plan.device.label(),
                     plan.device.name, plan.device.detected ? " (detected)" : "", plan.backend,
                     activation_quant_name(plan.activation_quant));
  // The marker of kernels compiled but never run on this kind of device (verbose only).
  const auto marked = [&](const std::string& kernel, bool verified) {
    return verbose && !verified && kernel != "-" ? kernel + " *" : kernel;
  };
  out += plan.attention.ok() ? fmt::format("attention: {}\n\n", marked(plan.attention.kernel, plan.attention.hardware_verified))
                             : fmt::format("attention: no kernel: {}\n\n", plan.attention.why_not);

  const std::vector<ExplainRow> rows = explain_rows(plan);
  size_t w_pattern = 6, w_variant = 10, w_scheme = 6, w_backend = 7, w_kernel = 6;
  bool unverified = false;
  for (const ExplainRow& r : rows) {
    w_backend = std::max(w_backend, r.backend.size());
    w_pattern = std::max(w_pattern, r.pattern.size());
    w_variant = std::max(w_variant, r.variant.size());
    w_scheme = std::max(w_scheme, r.scheme.size());
    w_kernel = std::max(w_kernel, marked(r.kernel, r.hardware_verified).size());
    unverified = unverified || (!r.hardware_verified && r.kernel != "-");
  }
  unverified = unverified || (plan.attention.ok() && !plan.attention.hardware_verified);
  // The transform column appears only for checkpoints with online transforms (it is empty otherwise).
  size_t w_transform = 0;
  for (const ExplainRow& r : rows) w_transform = std::max(w_transform, r.transform.size());
  if (w_transform > 0) w_transform = std::max(w_transform, std::string_view("online transform").size());
  const auto transform_cell = [&](const std::string& t) {
    return w_transform == 0 ? std::string() : fmt::format("{:<{}}  ", t.empty() ? "-" : t, w_transform);
  };
  out += fmt::format("{:<{}}  {:>5}  {:<{}}  {:<{}}  {:<{}}  {:<{}}  {}{}\n", "layers", w_pattern, "count", "checkpoint",
                     w_variant, "scheme", w_scheme, "backend", w_backend, "kernel", w_kernel,
                     transform_cell("online transform"), "reason");
  for (const ExplainRow& r : rows) {
    out += fmt::format("{:<{}}  {:>5}  {:<{}}  {:<{}}  {:<{}}  {:<{}}  {}{}\n", r.pattern, w_pattern, r.count, r.variant,
                       w_variant, r.scheme, w_scheme, r.backend, w_backend, marked(r.kernel, r.hardware_verified),
                       w_kernel, transform_cell(r.transform), r.reason);
  }
  if (verbose && unverified) {
    out += "\n* compiled and host-tested, but fp4serve has not run this kernel on this kind of device yet\n";
  }
  if (verbose) {
    std::set<std::string> seen;
    std::string rejected;
    for (const ModulePlan& mp : plan.modules) {
      for (const RejectedCandidate& r : mp.rejected) {
        const std::string line = fmt::format("  {} {}: {}", name_pattern(mp.run_name), scheme_name(r.scheme), r.why);
        if (seen.insert(line).second) rejected += line + "\n";
      }
    }
    if (!rejected.empty()) out += "\nrejected candidates:\n" + rejected;
  }
  if (!plan.notices.empty()) {
    out += "\nnotices:\n";
    for (const Notice& n : plan.notices) {
      out += fmt::format("  {}: {} layer{}", n.severity == Severity::Warning ? "warning" : "info", n.layers,
                         n.layers == 1 ? "" : "s");
      if (n.scheme) out += fmt::format(" {} → {}", variant_name(n.variant), scheme_name(*n.scheme));
      out += fmt::format(": {}\n", n.text);
    }
  }
  out += "\ntotals:\n";
  out += fmt::format("  {:<20} {:>7}  {:>16}  {:>16}\n", "scheme", "layers", "checkpoint bytes", "resident bytes");
  for (const SchemeTotal& t : scheme_totals(plan)) {
    out += fmt::format("  {:<20} {:>7}  {:>16}  {:>16}\n", t.scheme, t.modules, t.checkpoint_bytes, t.resident_bytes);
  }
  const auto [other_count, other_bytes] = non_linear_totals(plan);
  out += fmt::format("  {:<20} {:>7}  {:>16}  {:>16}\n", "non-linear tensors", other_count, other_bytes, other_bytes);
  const uint64_t resident = resident_bytes(plan);
  out += fmt::format("  estimated resident memory: {:.2f} MiB ({} bytes of weights as loaded; KV cache and activations "
                     "not included)\n", mib(resident), resident);
  size_t missing = 0;
  for (const ModulePlan& mp : plan.modules) missing += mp.scheme ? 0 : 1;
  if (missing == 0 && plan.attention.ok()) {
    out += "status: every layer has a scheme\n";
  } else if (missing > 0) {
    out += fmt::format("status: {} layer{} have no scheme on {}\n", missing, missing == 1 ? "" : "s", plan.device.label());
  }
  if (!plan.attention.ok()) out += fmt::format("status: attention has no kernel on {}\n", plan.device.label());
  return out;
}

nlohmann::json render_explain_json(const LayerPlan& plan, const std::string& source) {
  using nlohmann::json;
  json out;
  out["checkpoint"] = source;
  out["architecture"] = plan.dims.architecture;
  out["producer"] = std::string(quant::producer_name(plan.producer.producer));
  out["device"] = {{"label", plan.device.label()}, {"name", plan.device.name}, {"detected", plan.device.detected},
                   {"sm", plan.device.sm}, {"backend", plan.backend}};
  out["attention"] = {{"kernel", plan.attention.kernel}, {"why_not", plan.attention.why_not},
                      {"hardware_verified", plan.attention.hardware_verified}};
  out["activation_quant"] = std::string(activation_quant_name(plan.activation_quant));
  out["rows"] = json::array();
  for (const ExplainRow& r : explain_rows(plan)) {
    out["rows"].push_back({{"pattern", r.pattern}, {"count", r.count}, {"variant", r.variant}, {"scheme", r.scheme},
                           {"backend", r.backend}, {"kernel", r.kernel}, {"hardware_verified", r.hardware_verified},
                           {"reason", r.reason_code}, {"reason_text", r.reason},
                           {"online_transform", r.transform}});
  }
  out["notices"] = json::array();
  for (const Notice& n : plan.notices) {
    out["notices"].push_back({{"severity", n.severity == Severity::Warning ? "warning" : "info"},
                              {"variant", std::string(variant_name(n.variant))},
                              {"scheme", scheme_label(n.scheme)},
                              {"reason", n.reason ? std::string(reason_code(*n.reason)) : "fused-shards-disagree"},
                              {"text", n.text}, {"layers", n.layers}});
  }
  out["modules"] = json::array();
  for (const ModulePlan& mp : plan.modules) {
    json m = {{"name", mp.module.name}, {"role", std::string(checkpoint::module_role_name(mp.module.role))},
              {"run_name", mp.run_name}, {"run_fused", mp.run_fused}, {"variant", std::string(variant_name(mp.variant))},
              {"scheme", scheme_label(mp.scheme)}, {"kernel", mp.kernel.kernel},
              {"hardware_verified", mp.kernel.hardware_verified}, {"reason", std::string(reason_code(mp.reason))},
              {"reason_text", mp.reason_text},
              {"global_scale", mp.global_scale ? std::string(quant::global_scale_convention_name(*mp.global_scale)) : "none"},
              {"has_input_global_scale", mp.has_input_global_scale}};
    m["rejected"] = json::array();
    for (const RejectedCandidate& r : mp.rejected) m["rejected"].push_back({{"scheme", std::string(scheme_name(r.scheme))}, {"why", r.why}});
    m["tensors"] = json::array();
    for (const TensorUse& t : mp.tensors) {
      m["tensors"].push_back({{"name", t.name}, {"role", std::string(tensor_role_name(t.role))},
                              {"dtype", std::string(core::dtype_name(t.dtype))}, {"shape", t.shape},
                              {"bytes", t.bytes}, {"dropped", t.dropped}, {"shared", t.shared}});
    }
    out["modules"].push_back(std::move(m));
  }
  out["attention_transforms"] = json::array();
  for (const AttentionTransform& at : plan.attention_transforms) {
    json a = {{"module", at.module}, {"location", at.transform.location}, {"group", at.transform.group},
              {"type", at.transform.type}, {"block", at.block}, {"summary", attention_transform_summary(at)}};
    a["tensors"] = json::array();
    for (const TensorUse& t : at.tensors) {
      a["tensors"].push_back({{"name", t.name}, {"role", std::string(tensor_role_name(t.role))},
                              {"dtype", std::string(core::dtype_name(t.dtype))}, {"shape", t.shape},
                              {"bytes", t.bytes}, {"shared", t.shared}});
    }
    out["attention_transforms"].push_back(std::move(a));
  }
  out["totals"] = json::array();
  for (const SchemeTotal& t : scheme_totals(plan)) {
    out["totals"].push_back({{"scheme", t.scheme}, {"layers", t.modules}, {"checkpoint_bytes", t.checkpoint_bytes},
                             {"resident_bytes", t.resident_bytes}});
  }
  out["resident_bytes"] = resident_bytes(plan);
  out["complete"] = plan.complete();
  return out;
}

}  // namespace fp4serve::plan
