// SPDX-License-Identifier: Apache-2.0
#include "plan/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "fp4serve/error.h"

namespace fp4serve::plan {
namespace {

using checkpoint::ModuleRole;

// Elements per scale group along K of the chosen scheme (1 when a K split may fall anywhere).
int64_t k_group(const ModulePlan& m) {
  const auto config_group = [&] {
    return m.quant.weights && m.quant.weights->group_size.value_or(0) > 0 ? *m.quant.weights->group_size : 1;
  };
  if (!m.scheme) return config_group();
  const SchemeTraits& t = scheme_traits(*m.scheme);
  switch (t.weights) {
    case WeightKind::Block: return quant::block_format_traits(*t.block).group_size;
    case WeightKind::Int4: return config_group();
    case WeightKind::Fp8: return m.quant.weights && m.quant.weights->block ? (*m.quant.weights->block)[1] : 1;
    case WeightKind::Unquantized: return 1;
  }
  return 1;
}

// The block (matrix size) of the module's online transform at `location`, 1 when it has none. The contract lists
// each online transform's matrix, then its perm when randomized, in config order.
int64_t transform_block(const ModulePlan& m, std::string_view location) {
  std::vector<const TensorUse*> tensors;
  for (const TensorUse& use : m.tensors) {
    if (use.role == TensorRole::TransformMatrix || use.role == TensorRole::TransformPerm) tensors.push_back(&use);
  }
  size_t next = 0;
  int64_t block = 1;
  for (const quant::TransformUse& t : m.quant.transforms) {
    if (!t.online) continue;
    if (t.location == location && next < tensors.size() && !tensors[next]->shape.empty()) {
      block = std::lcm(block, tensors[next]->shape[0]);
    }
    next += t.randomize ? 2 : 1;
  }
  return block;
}

std::string join(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", v[i]);
  return out;
}

std::string sizes_text(const std::vector<IndexRange>& ranges) {
  std::vector<int64_t> sizes;
  for (const IndexRange& r : ranges) sizes.push_back(r.size());
  if (std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == sizes.front(); })) {
    return fmt::format("{} × {}", sizes.size(), sizes.front());
  }
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i) out += fmt::format("{}{}", i ? "/" : "", sizes[i]);
  return out;
}

// The modules of each layer by role (first of each role; experts of a layer share sizes and schemes).
struct LayerModules {
  std::vector<const ModulePlan*> qkv, o_proj, down, gate_up, shared_down, shared_gate_up;
  int64_t experts = 0;
};

std::map<int64_t, LayerModules> modules_by_layer(const LayerPlan& plan) {
  std::map<int64_t, LayerModules> out;
  for (const ModulePlan& m : plan.modules) {
    if (m.module.layer < 0) continue;
    LayerModules& l = out[m.module.layer];
    switch (m.module.role) {
      case ModuleRole::OProj: l.o_proj.push_back(&m); break;
      case ModuleRole::DownProj:
      case ModuleRole::ExpertDown:
      case ModuleRole::ExpertsDown: l.down.push_back(&m); break;
      case ModuleRole::GateProj:
      case ModuleRole::UpProj:
      case ModuleRole::ExpertGate:
      case ModuleRole::ExpertUp:
      case ModuleRole::ExpertsGateUp: l.gate_up.push_back(&m); break;
      case ModuleRole::SharedExpertDown: l.shared_down.push_back(&m); break;
      case ModuleRole::SharedExpertGate:
      case ModuleRole::SharedExpertUp: l.shared_gate_up.push_back(&m); break;
      case ModuleRole::Embedding:
      case ModuleRole::LmHead:
      case ModuleRole::QProj:
      case ModuleRole::KProj:
      case ModuleRole::VProj: l.qkv.push_back(&m); break;
      case ModuleRole::SharedExpertRouter:
      case ModuleRole::Router: break;
    }
    if (m.module.role == ModuleRole::ExpertsDown) l.experts = std::max(l.experts, m.module.experts);
    if (m.module.role == ModuleRole::ExpertDown) l.experts = std::max(l.experts, m.module.expert + 1);
  }
  return out;
}

int64_t granule_of(const std::vector<const ModulePlan*>& row_parallel, const std::vector<const ModulePlan*>& column_parallel) {
  int64_t g = 8;
  for (const ModulePlan* m : row_parallel) g = std::lcm(g, row_split_granule(*m));
  for (const ModulePlan* m : column_parallel) g = std::lcm(g, column_split_granule(*m));
  return g;
}

// The split of one layer, or the reason it has none (then `why` is set).
LayerShard shard_layer(const LayerPlan& plan, int64_t layer, const LayerModules& lm, int n, bool expert_parallel,
                       std::string& why) {
  const checkpoint::ModelDims& d = plan.dims;
  LayerShard s;
  s.layer = layer;
  const int64_t heads = d.num_attention_heads, kv = d.num_key_value_heads, hd = d.head_dim;
  if (heads % n != 0) {
    why = fmt::format("layer {}: {} attention heads do not split over {} ranks", layer, heads, n);
    return s;
  }
  if (kv % n != 0 && n % kv != 0) {
    why = fmt::format("layer {}: {} KV heads neither split over {} ranks nor replicate evenly ({} is not a multiple "
                      "of {})", layer, kv, n, n, kv);
    return s;
  }
  const int64_t q_local = heads / n;
  for (int r = 0; r < n; ++r) {
    s.q_heads.push_back({r * q_local, (r + 1) * q_local});
    if (kv >= n) {
      s.kv_heads.push_back({r * (kv / n), (r + 1) * (kv / n)});
    } else {  // replicated: the KV head that this rank's q heads read (GQA group = heads / kv)
      const int64_t head = (r * q_local) / (heads / kv);
      s.kv_heads.push_back({head, head + 1});
    }
  }
  const int64_t qkv_granule = granule_of({}, lm.qkv);
  if ((s.kv_heads.front().size() * hd) % qkv_granule != 0) {
    why = fmt::format("layer {}: q/k/v rows per rank ({} KV head(s) × head_dim {}) are not a multiple of {} (FP8 "
                      "block rows, output transforms, 8-row tiles)", layer, s.kv_heads.front().size(), hd, qkv_granule);
    return s;
  }
  s.o_granule = granule_of(lm.o_proj, {});
  if ((q_local * hd) % s.o_granule != 0) {
    why = fmt::format("layer {}: o_proj K per rank {} ({} heads × head_dim {}) is not a multiple of its granule {}",
                      layer, q_local * hd, q_local, hd, s.o_granule);
    return s;
  }
  s.moe = d.num_experts > 0 && d.is_moe_layer(layer);
  s.experts = s.moe ? std::max(lm.experts, d.num_experts) : 0;
  s.intermediate = s.moe ? d.moe_intermediate_size : d.intermediate_size;
  if (!lm.down.empty() && lm.down.front()->module.in_features > 0) s.intermediate = lm.down.front()->module.in_features;
  s.ffn_granule = granule_of(lm.down, lm.gate_up);
  s.ffn_columns = split_on_granules(s.intermediate, s.ffn_granule, n);
  if (s.moe && (expert_parallel || s.ffn_columns.empty())) {
    s.ffn = FfnSplit::WholeExperts;
    s.ffn_columns.clear();
    if (s.experts < n) {
      why = fmt::format("layer {}: {} experts of intermediate size {} neither split on {}-element granules nor "
                        "distribute whole over {} ranks", layer, s.experts, s.intermediate, s.ffn_granule, n);
      return s;
    }
    s.expert_ranges = split_on_granules(s.experts, 1, n);
  } else if (s.ffn_columns.empty()) {
    why = fmt::format("layer {}: intermediate size {} does not split over {} ranks on {}-element granules (down_proj "
                      "scale groups, transforms, 8-column octets): a rank would hold no whole granule",
                      layer, s.intermediate, n, s.ffn_granule);
    return s;
  }
  if (!lm.shared_down.empty()) {
    s.shared_intermediate = lm.shared_down.front()->module.in_features;
    s.shared_columns = split_on_granules(s.shared_intermediate, granule_of(lm.shared_down, lm.shared_gate_up), n);
    if (s.shared_columns.empty()) {
      why = fmt::format("layer {}: the shared expert's intermediate size {} does not split over {} ranks on "
                        "{}-element granules", layer, s.shared_intermediate, n,
                        granule_of(lm.shared_down, lm.shared_gate_up));
    }
  }
  return s;
}

TensorParallelPlan try_plan(const LayerPlan& plan, int n, bool expert_parallel, std::string& why) {
  TensorParallelPlan tp;
  tp.size = n;
  tp.expert_parallel = expert_parallel;
  const auto by_layer = modules_by_layer(plan);
  for (int64_t l = 0; l < plan.dims.num_hidden_layers; ++l) {
    const auto it = by_layer.find(l);
    static const LayerModules kNone;
    tp.layers.push_back(shard_layer(plan, l, it == by_layer.end() ? kNone : it->second, n, expert_parallel, why));
    if (!why.empty()) return tp;
  }
  return tp;
}

}  // namespace

int64_t row_split_granule(const ModulePlan& module) {
  return std::lcm(std::lcm(k_group(module), transform_block(module, "input")), int64_t{8});
}

int64_t column_split_granule(const ModulePlan& module) {
  int64_t g = std::lcm(int64_t{8}, transform_block(module, "output"));
  // FP8 block scales cover block[0] rows: a row split must not cut one.
  const bool fp8 = module.scheme && (*module.scheme == SchemeId::W8A16Fp8 || *module.scheme == SchemeId::W8A8Fp8);
  if (fp8 && module.quant.weights && module.quant.weights->block) g = std::lcm(g, (*module.quant.weights->block)[0]);
  return g;
}

std::vector<IndexRange> split_on_granules(int64_t total, int64_t granule, int parts) {
  if (parts < 1 || granule < 1 || total <= 0 || total % granule != 0) return {};
  const int64_t units = total / granule;
  if (units < parts) return {};
  std::vector<IndexRange> out;
  int64_t at = 0;
  for (int r = 0; r < parts; ++r) {
    const int64_t u = units / parts + (r < units % parts ? 1 : 0);
    out.push_back({at, at + u * granule});
    at += u * granule;
  }
  return out;
}

std::vector<int> valid_tensor_parallel_sizes(const LayerPlan& plan, bool expert_parallel, int max_size) {
  std::vector<int> out{1};
  for (int n = 2; n <= max_size; ++n) {
    std::string why;
    try_plan(plan, n, expert_parallel, why);
    if (why.empty()) out.push_back(n);
  }
  return out;
}

TensorParallelPlan plan_tensor_parallel(const LayerPlan& plan, int tensor_parallel_size, bool expert_parallel) {
  if (tensor_parallel_size < 1) {
    throw UsageError(fmt::format("--tensor-parallel-size {}: expected 1 or more", tensor_parallel_size));
  }
  if (tensor_parallel_size == 1) return TensorParallelPlan{1, expert_parallel, {}};  // the whole model, no checks
  std::string why;
  TensorParallelPlan tp = try_plan(plan, tensor_parallel_size, expert_parallel, why);
  if (!why.empty()) {
    throw UsageError(fmt::format("tensor_parallel_size {} does not fit {}: {}; valid sizes for this model: {}",
                                 tensor_parallel_size, plan.dims.architecture, why,
                                 join(valid_tensor_parallel_sizes(plan, expert_parallel))));
  }
  return tp;
}

ModuleShard module_shard(const TensorParallelPlan& tp, const ModulePlan& m, int rank) {
  if (rank < 0 || rank >= tp.size) {
    throw UsageError(fmt::format("rank {} is outside 0 … {} (tensor_parallel_size {})", rank, tp.size - 1, tp.size));
  }
  ModuleShard s;
  s.rows = {0, m.module.out_features};
  s.columns = {0, m.module.in_features};
  if (tp.size == 1 || m.module.layer < 0) return s;  // embedding, lm_head: replicated
  if (m.module.layer >= static_cast<int64_t>(tp.layers.size())) {
    throw FormatError(fmt::format("{}: layer {} has no tensor-parallel split", m.module.name, m.module.layer));
  }
  const LayerShard& l = tp.layers[static_cast<size_t>(m.module.layer)];
  const auto r = static_cast<size_t>(rank);
  const bool whole_experts = l.ffn == FfnSplit::WholeExperts;
  const auto expert_here = [&](int64_t e) { return !whole_experts || (e >= l.expert_ranges[r].begin && e < l.expert_ranges[r].end); };
  switch (m.module.role) {
    case ModuleRole::QProj: {
      const int64_t d = m.module.out_features / (l.q_heads.back().end);
      s.rows = {l.q_heads[r].begin * d, l.q_heads[r].end * d};
      break;
    }
    case ModuleRole::KProj:
    case ModuleRole::VProj: {
      const int64_t kv = std::max(l.kv_heads.back().end, int64_t{1});
      const int64_t d = m.module.out_features / kv;
      s.rows = {l.kv_heads[r].begin * d, l.kv_heads[r].end * d};
      break;
    }
    case ModuleRole::OProj: {
      const int64_t d = m.module.in_features / l.q_heads.back().end;
      s.columns = {l.q_heads[r].begin * d, l.q_heads[r].end * d};
      s.bias = rank == 0;
      break;
    }
    case ModuleRole::GateProj:
    case ModuleRole::UpProj: s.rows = l.ffn_columns[r]; break;
    case ModuleRole::DownProj:
      s.columns = l.ffn_columns[r];
      s.bias = rank == 0;
      break;
    case ModuleRole::ExpertGate:
    case ModuleRole::ExpertUp:
      s.present = expert_here(m.module.expert);
      if (!whole_experts) s.rows = l.ffn_columns[r];
      break;
    case ModuleRole::ExpertDown:
      s.present = expert_here(m.module.expert);
      if (!whole_experts) {
        s.columns = l.ffn_columns[r];
        s.bias = rank == 0;
      }
      break;
    case ModuleRole::ExpertsGateUp:
      // Fused 3-D: rows are per expert [2I] (gate | up or interleaved); the caller slices each half by `rows`
      // of the intermediate, and whole experts by expert_ranges.
      if (!whole_experts) s.rows = l.ffn_columns[r];
      break;
    case ModuleRole::ExpertsDown:
      if (!whole_experts) {
        s.columns = l.ffn_columns[r];
        s.bias = rank == 0;
      }
      break;
    case ModuleRole::SharedExpertGate:
    case ModuleRole::SharedExpertUp: s.rows = l.shared_columns[r]; break;
    case ModuleRole::SharedExpertDown:
      s.columns = l.shared_columns[r];
      s.bias = rank == 0;
      break;
    case ModuleRole::Embedding:
    case ModuleRole::LmHead:
    case ModuleRole::SharedExpertRouter:
    case ModuleRole::Router: break;
  }
  return s;
}

std::string render_tensor_parallel_text(const LayerPlan& plan, const TensorParallelPlan& tp) {
  std::string out = fmt::format("tensor parallelism: tensor_parallel_size {}{} (valid sizes for this model: {})\n",
                                tp.size, tp.expert_parallel ? ", --expert-parallel" : "",
                                join(valid_tensor_parallel_sizes(plan, tp.expert_parallel)));
  const checkpoint::ModelDims& d = plan.dims;
  // One line per run of consecutive layers with the same text.
  std::vector<std::pair<std::string, std::string>> lines;  // (attention + ffn text, layer range)
  int64_t run_start = 0;
  std::string previous;
  auto describe = [&](const LayerShard& l) {
    const int64_t q = l.q_heads.front().size(), kv = l.kv_heads.front().size();
    std::string text = fmt::format(
        "  attention  {} q heads, {} KV heads → {} q + {} KV head(s) per rank{}; q/k/v column-parallel, o_proj "
        "row-parallel K {} per rank (granule {})\n",
        d.num_attention_heads, d.num_key_value_heads, q, kv,
        d.num_key_value_heads < tp.size ? " (KV replicated)" : "", q * d.head_dim, l.o_granule);
    if (!l.moe) {
      text += fmt::format("  mlp        intermediate {} → {} per rank (granule {}); gate/up column-, down row-parallel\n",
                          l.intermediate, sizes_text(l.ffn_columns), l.ffn_granule);
    } else if (l.ffn == FfnSplit::Intermediate) {
      text += fmt::format("  moe        {} experts, each intermediate {} → {} per rank (granule {}); router "
                          "replicated\n", l.experts, l.intermediate, sizes_text(l.ffn_columns), l.ffn_granule);
    } else {
      text += fmt::format("  moe        {} experts whole per rank → {} experts per rank{}; router replicated\n",
                          l.experts, sizes_text(l.expert_ranges),
                          tp.expert_parallel ? " (--expert-parallel)"
                                             : fmt::format(" (intermediate {} has fewer than {} granules of {})",
                                                           l.intermediate, tp.size, l.ffn_granule));
    }
    if (l.shared_intermediate > 0) {
      text += fmt::format("  shared     expert intermediate {} → {} per rank\n", l.shared_intermediate,
                          sizes_text(l.shared_columns));
    }
    return text;
  };
  for (size_t i = 0; i <= tp.layers.size(); ++i) {
    const std::string text = i < tp.layers.size() ? describe(tp.layers[i]) : std::string();
    if (i > 0 && text != previous) {
      const int64_t last = static_cast<int64_t>(i) - 1;
      lines.push_back({previous, run_start == last ? fmt::format("layer {}", last)
                                                   : fmt::format("layers {}-{}", run_start, last)});
      run_start = static_cast<int64_t>(i);
    }
    previous = text;
  }
  for (const auto& [text, range] : lines) out += fmt::format("{}\n{}", range, text);
  out += "embedding, lm_head, norms, router: replicated on every rank (full logits on every rank)\n";
  out += "one all-reduce (sum, fp32) after o_proj and one after the MLP / MoE block per layer\n";
  return out;
}

}  // namespace fp4serve::plan
