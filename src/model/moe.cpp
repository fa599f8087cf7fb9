// SPDX-License-Identifier: Apache-2.0
#include "model/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "fp4serve/error.h"

namespace fp4serve::model {
namespace {

using checkpoint::ModuleRole;

// Per-expert modules of one role, indexed by expert; throws when an index is missing or repeated.
std::vector<std::string> by_expert(const std::vector<checkpoint::ModuleInfo>& modules, int64_t experts,
                                   const std::string& layer, std::string_view what) {
  std::vector<std::string> out(static_cast<size_t>(experts));
  for (const auto& m : modules) {
    if (m.expert < 0 || m.expert >= experts || !out[static_cast<size_t>(m.expert)].empty()) {
      throw FormatError(fmt::format("{}: {} module {} has expert index {} (config.json has {} experts)", layer, what,
                                    m.name, m.expert, experts));
    }
    out[static_cast<size_t>(m.expert)] = m.name;
  }
  if (static_cast<int64_t>(modules.size()) != experts) {
    throw FormatError(fmt::format("{}: {} {} modules where config.json has {} experts", layer, modules.size(), what, experts));
  }
  return out;
}

}  // namespace

MoeBlock::MoeBlock(std::string name, MoeSettings settings, LinearGroup router, std::vector<ExpertWeights> experts,
                   std::optional<SharedExpertWeights> shared, Backend* backend)
    : MoeBlock(std::move(name), settings, std::move(router), static_cast<int64_t>(experts.size()),
               [&experts](int64_t i) { return std::move(experts[static_cast<size_t>(i)]); }, std::move(shared),
               backend) {}

MoeBlock::MoeBlock(std::string name, MoeSettings settings, LinearGroup router, int64_t expert_count,
                   const std::function<ExpertWeights(int64_t)>& load_expert, std::optional<SharedExpertWeights> shared,
                   Backend* backend)
    : name_(std::move(name)), settings_(settings) {
  const int64_t e = settings_.router.num_experts;
  if (router.out_features() != e || expert_count != e) {
    throw FormatError(fmt::format("{}: router has {} outputs and there are {} experts where config.json has {}", name_,
                                  router.out_features(), expert_count, e));
  }
  if (settings_.router.top_k < 1 || settings_.router.top_k > e) {
    throw FormatError(fmt::format("{}: num_experts_per_tok {} outside 1 … {}", name_, settings_.router.top_k, e));
  }
  if (backend == nullptr) throw UsageError(fmt::format("{}: no backend", name_));
  hidden_ = router.in_features();
  backend_ = backend;
  router_ = backend_->upload_linear(std::move(router));
  // One expert at a time: its checkpoint-order weights (and any reordered copy of them) are gone once it is
  // uploaded, so a layer's experts never sit in memory twice.
  experts_.reserve(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) {
    ExpertWeights x = load_expert(i);
    // Under expert parallelism the experts of other ranks are empty groups: not run here.
    if (x.w13.empty() && x.down.empty()) {
      experts_.push_back({nullptr, nullptr});
      continue;
    }
    if (intermediate_ == 0) intermediate_ = x.down.in_features();  // the first expert loaded sets I
    if (x.w13.in_features() != hidden_ || x.w13.out_features() != 2 * intermediate_ ||
        x.down.in_features() != intermediate_ || x.down.out_features() != hidden_) {
      throw FormatError(fmt::format(
          "{} expert {}: w13 [{}, {}] and down [{}, {}] where [{}, {}] and [{}, {}] were expected "
          "(w13 = gate | up, I = {})",
          name_, i, x.w13.out_features(), x.w13.in_features(), x.down.out_features(), x.down.in_features(),
          2 * intermediate_, hidden_, hidden_, intermediate_, intermediate_));
    }
    experts_.push_back({backend_->upload_linear(std::move(x.w13)), backend_->upload_linear(std::move(x.down))});
  }
  if (intermediate_ == 0) throw FormatError(fmt::format("{}: no expert of this block is loaded", name_));
  if (shared) {
    const int64_t si = shared->down.in_features();
    if (shared->w13.in_features() != hidden_ || shared->w13.out_features() != 2 * si ||
        shared->down.out_features() != hidden_ || shared->gate.out_features() != 1 || shared->gate.in_features() != hidden_) {
      throw FormatError(fmt::format("{}: shared expert sizes disagree (w13 [{}, {}], down [{}, {}], gate [{}, {}], H = {})",
                                    name_, shared->w13.out_features(), shared->w13.in_features(),
                                    shared->down.out_features(), si, shared->gate.out_features(),
                                    shared->gate.in_features(), hidden_));
    }
    shared_intermediate_ = si;
    shared_w13_ = backend_->upload_linear(std::move(shared->w13));
    shared_down_ = backend_->upload_linear(std::move(shared->down));
    shared_gate_ = backend_->upload_linear(std::move(shared->gate));
  }
}

MoeBlock::~MoeBlock() = default;

void MoeBlock::forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const {
  Backend& b = *backend_;
  const int64_t e_count = settings_.router.num_experts;
  const int64_t k = settings_.router.top_k;
  const int64_t inter = intermediate_;

  // Routing stays in fp32 end to end (logits, softmax, top-k, renormalization).
  float* logits = b.workspace(kMoeWorkspace, m * e_count);
  observe(observer, b, *router_, h, m);
  b.linear(*router_, h, m, logits);
  std::vector<int32_t> chosen(static_cast<size_t>(m * k));
  std::vector<float> weights(static_cast<size_t>(m * k));
  b.route(settings_.router, logits, m, chosen.data(), weights.data());

  // Tokens grouped by expert: token rows and weights in token order.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(e_count));
  std::vector<std::vector<float>> row_weights(static_cast<size_t>(e_count));
  int64_t widest = 0;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const auto e = static_cast<size_t>(chosen[static_cast<size_t>(t * k + j)]);
      rows[e].push_back(t);
      row_weights[e].push_back(weights[static_cast<size_t>(t * k + j)]);
      widest = std::max(widest, static_cast<int64_t>(rows[e].size()));
    }
  }

  // Sized for the busiest expert (and the shared expert's m rows) before any expert runs.
  const int64_t rows_max = std::max(widest, shared_w13_ ? m : int64_t{0});
  float* x = b.workspace(kMoeWorkspace + 1, widest * hidden_);
  float* w13 = b.workspace(kMoeWorkspace + 2, rows_max * 2 * std::max(inter, shared_intermediate_));
  float* act = b.workspace(kMoeWorkspace + 3, rows_max * std::max(inter, shared_intermediate_));
  float* y = b.workspace(kMoeWorkspace + 4, rows_max * hidden_);
  float* gate = b.workspace(kMoeWorkspace + 5, m);

  b.fill(out, m * hidden_, 0.0f);
  for (int64_t e = 0; e < e_count; ++e) {
    const auto& tokens = rows[static_cast<size_t>(e)];
    const Expert& expert = experts_[static_cast<size_t>(e)];
    if (tokens.empty() || !expert.down) continue;
    const auto me = static_cast<int64_t>(tokens.size());
    b.gather_rows(h, hidden_, tokens, x);
    observe(observer, b, *expert.w13, x, me);
    b.linear(*expert.w13, x, me, w13);
    b.activation(settings_.activation, settings_.swiglu_alpha, settings_.swiglu_limit, w13, me, inter, act);
    observe(observer, b, *expert.down, act, me);
    b.linear(*expert.down, act, me, y);
    b.scatter_add_rows(y, hidden_, tokens, row_weights[static_cast<size_t>(e)], out);
  }

  if (shared_w13_) {
    const int64_t si = shared_intermediate_;
    observe(observer, b, *shared_w13_, h, m);
    b.linear(*shared_w13_, h, m, w13);
    b.activation(ExpertActivation::SiluGated, 0.0f, 0.0f, w13, m, si, act);
    observe(observer, b, *shared_down_, act, m);
    b.linear(*shared_down_, act, m, y);
    observe(observer, b, *shared_gate_, h, m);
    b.linear(*shared_gate_, h, m, gate);
    b.add_sigmoid_gated(y, gate, m, hidden_, out);
  }
}

std::unique_ptr<MoeBlock> make_moe_block(const ModelConfig& config, const WeightSource& weights, int64_t layer,
                                         Backend* backend) {
  const MoeConfig& mc = config.moe;
  const std::string where = fmt::format("model.layers.{} MoE", layer);
  const checkpoint::ArchitectureSpec& spec = checkpoint::architecture_spec(config.architecture_name);
  MoeSettings settings;
  settings.router = {mc.router, mc.num_experts, mc.top_k, mc.renormalize, mc.routed_scaling_factor};
  settings.activation = mc.activation;
  settings.swiglu_alpha = mc.swiglu_alpha;
  settings.swiglu_limit = mc.swiglu_limit;

  const auto routers = weights.modules(layer, ModuleRole::Router);
  if (routers.size() != 1) throw FormatError(fmt::format("{}: {} router modules where one was expected", where, routers.size()));
  LinearGroup router = weights.linear_group({routers.front().name});

  std::function<ExpertWeights(int64_t)> load_expert;  // called once per expert, in order, by the block
  const auto gates = weights.modules(layer, ModuleRole::ExpertGate);
  const auto ups = weights.modules(layer, ModuleRole::ExpertUp);
  const auto downs = weights.modules(layer, ModuleRole::ExpertDown);
  if (!ups.empty() || !downs.empty()) {  // split per expert (also LLM Compressor's linearized fused experts)
    const std::vector<std::string> up = by_expert(ups, mc.num_experts, where, "expert up");
    const std::vector<std::string> down = by_expert(downs, mc.num_experts, where, "expert down");
    const std::vector<std::string> gate = by_expert(gates, mc.num_experts, where, "expert gate");
    load_expert = [&weights, up, down, gate](int64_t e) {
      const auto i = static_cast<size_t>(e);
      // Gate and up run as one w13 GEMM when the plan fuses them; each shard keeps its own global scale.
      return ExpertWeights{weights.linear_group({gate[i], up[i]}), weights.linear_group({down[i]})};
    };
  } else {
    const auto gate_up = weights.modules(layer, ModuleRole::ExpertsGateUp);
    const auto down = weights.modules(layer, ModuleRole::ExpertsDown);
    if (gate_up.size() != 1 || down.size() != 1) {
      throw FormatError(fmt::format("{}: the plan lists no experts for this layer", where));
    }
    for (const auto* m : {&gate_up.front(), &down.front()}) {
      if (m->experts != mc.num_experts) {
        throw FormatError(fmt::format("{}: {} holds {} experts where config.json has {}", where, m->name, m->experts, mc.num_experts));
      }
    }
    const bool interleaved = spec.gate_up == checkpoint::GateUpLayout::InterleavedRows;
    load_expert = [&weights, gate_up_name = gate_up.front().name, down_name = down.front().name,
                   interleaved](int64_t e) {
      return ExpertWeights{weights.fused_expert(gate_up_name, e, interleaved), weights.fused_expert(down_name, e, false)};
    };
  }

  std::optional<SharedExpertWeights> shared;
  if (mc.shared_expert_intermediate_size > 0) {
    const auto sg = weights.modules(layer, ModuleRole::SharedExpertGate);
    const auto su = weights.modules(layer, ModuleRole::SharedExpertUp);
    const auto sd = weights.modules(layer, ModuleRole::SharedExpertDown);
    const auto sr = weights.modules(layer, ModuleRole::SharedExpertRouter);
    if (sg.size() != 1 || su.size() != 1 || sd.size() != 1 || sr.size() != 1) {
      throw FormatError(fmt::format("{}: the plan lists no complete shared expert", where));
    }
    shared = SharedExpertWeights{weights.linear_group({sg.front().name, su.front().name}),
                                 weights.linear_group({sd.front().name}), weights.linear_group({sr.front().name})};
  }
  auto block = std::make_unique<MoeBlock>(where, settings, std::move(router), mc.num_experts, load_expert,
                                          std::move(shared), backend);
  // A tensor-parallel shard holds a slice of each expert's intermediate (plan/shard.h checked it against the headers).
  const bool sharded = weights.attention_heads().has_value();
  if ((!sharded && block->intermediate_size() != mc.intermediate_size) || block->hidden_size() != config.hidden_size) {
    throw FormatError(fmt::format("{}: experts are [I = {}, H = {}] where config.json gives [{}, {}]", where,
                                  block->intermediate_size(), block->hidden_size(), mc.intermediate_size, config.hidden_size));
  }
  return block;
}

}  // namespace fp4serve::model
