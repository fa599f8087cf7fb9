// SPDX-License-Identifier: Apache-2.0
#include "model/moe.h"

#include <fmt/format.h>

#include <cmath>

#include "fp4serve/error.h"
#include "kernels/activation.h"

namespace fp4serve::model {
namespace {

using checkpoint::ModuleRole;

int64_t w13_rows(ExpertActivation a, int64_t inter) { return is_gated(a) ? 2 * inter : inter; }

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

void expert_activation(const MoeSettings& s, const float* x, int64_t m, int64_t inter, float* y) {
  switch (s.activation) {
    case ExpertActivation::SiluGated: kernels::silu_and_mul(x, m, inter, y); return;
    case ExpertActivation::SwigluOai: kernels::swiglu_oai_and_mul(x, m, inter, s.swiglu_alpha, s.swiglu_limit, y); return;
    case ExpertActivation::ReluSquared: kernels::relu_squared(x, m * inter, y); return;
    case ExpertActivation::Silu: kernels::silu(x, m * inter, y); return;
  }
}

MoeBlock::MoeBlock(std::string name, MoeSettings settings, LinearGroup router, std::vector<ExpertWeights> experts,
                   std::optional<SharedExpertWeights> shared)
    : name_(std::move(name)), settings_(settings), router_(std::move(router)), experts_(std::move(experts)),
      shared_(std::move(shared)) {
  const int64_t e = settings_.router.num_experts;
  if (router_.out_features() != e || static_cast<int64_t>(experts_.size()) != e) {
    throw FormatError(fmt::format("{}: router has {} outputs and there are {} experts where config.json has {}", name_,
                                  router_.out_features(), experts_.size(), e));
  }
  if (settings_.router.top_k < 1 || settings_.router.top_k > e) {
    throw FormatError(fmt::format("{}: num_experts_per_tok {} outside 1 … {}", name_, settings_.router.top_k, e));
  }
  hidden_ = router_.in_features();
  intermediate_ = experts_.front().down.in_features();
  for (size_t i = 0; i < experts_.size(); ++i) {
    const ExpertWeights& x = experts_[i];
    if (x.w13.in_features() != hidden_ || x.w13.out_features() != w13_rows(settings_.activation, intermediate_) ||
        x.down.in_features() != intermediate_ || x.down.out_features() != hidden_) {
      throw FormatError(fmt::format(
          "{} expert {}: w13 [{}, {}] and down [{}, {}] where [{}, {}] and [{}, {}] were expected ({} experts, I = {})",
          name_, i, x.w13.out_features(), x.w13.in_features(), x.down.out_features(), x.down.in_features(),
          w13_rows(settings_.activation, intermediate_), hidden_, hidden_, intermediate_,
          is_gated(settings_.activation) ? "gated" : "non-gated", intermediate_));
    }
  }
  if (shared_) {
    const int64_t si = shared_->down.in_features();
    if (shared_->w13.in_features() != hidden_ || shared_->w13.out_features() != 2 * si ||
        shared_->down.out_features() != hidden_ || shared_->gate.out_features() != 1 || shared_->gate.in_features() != hidden_) {
      throw FormatError(fmt::format("{}: shared expert sizes disagree (w13 [{}, {}], down [{}, {}], gate [{}, {}], H = {})",
                                    name_, shared_->w13.out_features(), shared_->w13.in_features(),
                                    shared_->down.out_features(), si, shared_->gate.out_features(),
                                    shared_->gate.in_features(), hidden_));
    }
  }
}

void MoeBlock::forward(const float* h, int64_t m, float* out, ActivationObserver* observer) const {
  const int64_t e_count = settings_.router.num_experts;
  const int64_t k = settings_.router.top_k;
  const int64_t inter = intermediate_;
  std::vector<float> scratch;

  // Routing stays in fp32 end to end (logits, softmax, top-k, renormalization).
  std::vector<float> logits(static_cast<size_t>(m * e_count));
  if (observer != nullptr) observer->observe(router_.modules(), h, m, hidden_);
  router_.forward(h, m, logits.data(), scratch);
  std::vector<int32_t> chosen(static_cast<size_t>(m * k));
  std::vector<float> weights(static_cast<size_t>(m * k));
  route(settings_.router, logits.data(), m, chosen.data(), weights.data());

  // Tokens grouped by expert: (token, weight) lists in token order.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) routed[static_cast<size_t>(chosen[t * k + j])].push_back({t, weights[t * k + j]});
  }

  std::fill(out, out + m * hidden_, 0.0f);
  std::vector<float> x, w13, act, y;
  for (int64_t e = 0; e < e_count; ++e) {
    const auto& tokens = routed[static_cast<size_t>(e)];
    if (tokens.empty()) continue;
    const ExpertWeights& expert = experts_[static_cast<size_t>(e)];
    const auto me = static_cast<int64_t>(tokens.size());
    x.resize(static_cast<size_t>(me * hidden_));
    for (int64_t r = 0; r < me; ++r) {
      std::copy(h + tokens[r].first * hidden_, h + (tokens[r].first + 1) * hidden_, x.begin() + r * hidden_);
    }
    w13.resize(static_cast<size_t>(me * expert.w13.out_features()));
    act.resize(static_cast<size_t>(me * inter));
    y.resize(static_cast<size_t>(me * hidden_));
    if (observer != nullptr) observer->observe(expert.w13.modules(), x.data(), me, hidden_);
    expert.w13.forward(x.data(), me, w13.data(), scratch);
    expert_activation(settings_, w13.data(), me, inter, act.data());
    if (observer != nullptr) observer->observe(expert.down.modules(), act.data(), me, inter);
    expert.down.forward(act.data(), me, y.data(), scratch);
    for (int64_t r = 0; r < me; ++r) {
      float* o = out + tokens[r].first * hidden_;
      const float wt = tokens[r].second;
      for (int64_t c = 0; c < hidden_; ++c) o[c] += y[r * hidden_ + c] * wt;
    }
  }

  if (shared_) {
    const int64_t si = shared_->down.in_features();
    w13.resize(static_cast<size_t>(m * 2 * si));
    act.resize(static_cast<size_t>(m * si));
    y.resize(static_cast<size_t>(m * hidden_));
    std::vector<float> gate(static_cast<size_t>(m));
    if (observer != nullptr) observer->observe(shared_->w13.modules(), h, m, hidden_);
    shared_->w13.forward(h, m, w13.data(), scratch);
    kernels::silu_and_mul(w13.data(), m, si, act.data());
    if (observer != nullptr) observer->observe(shared_->down.modules(), act.data(), m, si);
    shared_->down.forward(act.data(), m, y.data(), scratch);
    if (observer != nullptr) observer->observe(shared_->gate.modules(), h, m, hidden_);
    shared_->gate.forward(h, m, gate.data(), scratch);
    for (int64_t t = 0; t < m; ++t) {
      const float g = 1.0f / (1.0f + std::exp(-gate[static_cast<size_t>(t)]));
      for (int64_t c = 0; c < hidden_; ++c) out[t * hidden_ + c] += g * y[t * hidden_ + c];
    }
  }
}

std::unique_ptr<MoeBlock> make_moe_block(const ModelConfig& config, const WeightSource& weights, int64_t layer) {
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

  std::vector<ExpertWeights> experts;
  const auto gates = weights.modules(layer, ModuleRole::ExpertGate);
  const auto ups = weights.modules(layer, ModuleRole::ExpertUp);
  const auto downs = weights.modules(layer, ModuleRole::ExpertDown);
  if (!ups.empty() || !downs.empty()) {  // split per expert (also LLM Compressor's linearized fused experts)
    const std::vector<std::string> up = by_expert(ups, mc.num_experts, where, "expert up");
    const std::vector<std::string> down = by_expert(downs, mc.num_experts, where, "expert down");
    std::vector<std::string> gate;
    if (is_gated(mc.activation)) gate = by_expert(gates, mc.num_experts, where, "expert gate");
    for (int64_t e = 0; e < mc.num_experts; ++e) {
      const auto i = static_cast<size_t>(e);
      // Gate and up run as one w13 GEMM when the plan fuses them; each shard keeps its own global scale.
      ExpertWeights x{gate.empty() ? weights.linear_group({up[i]}) : weights.linear_group({gate[i], up[i]}),
                      weights.linear_group({down[i]})};
      experts.push_back(std::move(x));
    }
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
    for (int64_t e = 0; e < mc.num_experts; ++e) {
      experts.push_back({weights.fused_expert(gate_up.front().name, e, interleaved && is_gated(mc.activation)),
                         weights.fused_expert(down.front().name, e, false)});
    }
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
  auto block = std::make_unique<MoeBlock>(where, settings, std::move(router), std::move(experts), std::move(shared));
  if (block->intermediate_size() != mc.intermediate_size || block->hidden_size() != config.hidden_size) {
    throw FormatError(fmt::format("{}: experts are [I = {}, H = {}] where config.json gives [{}, {}]", where,
                                  block->intermediate_size(), block->hidden_size(), mc.intermediate_size, config.hidden_size));
  }
  return block;
}

}  // namespace fp4serve::model
