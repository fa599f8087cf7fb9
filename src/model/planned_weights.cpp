// SPDX-License-Identifier: Apache-2.0
#include "model/planned_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "fp4serve/error.h"
#include "prepare/repack.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::model {
namespace {

using plan::SchemeId;
using plan::TensorRole;

prepare::GlobalScaleConvention convention_of(plan::ScaleConvention c, const std::string& module) {
  switch (c) {
    case plan::ScaleConvention::Divisor: return prepare::GlobalScaleConvention::Divisor;
    case plan::ScaleConvention::Multiplier: return prepare::GlobalScaleConvention::Multiplier;
    case plan::ScaleConvention::None: break;
  }
  throw FormatError(fmt::format("{}: the plan gives no global-scale convention for an NVFP4 layer", module));
}

}  // namespace

ExpertSlice slice_expert(const core::TensorView& t, int64_t expert, bool deinterleave, bool transpose,
                         const std::string& name) {
  if (t.shape.size() < 2 || expert < 0 || expert >= t.shape[0]) {
    throw FormatError(fmt::format("{}: expert {} of a tensor shaped {} (expected [E, ...] with E > {})", name, expert,
                                  core::shape_to_string(t.shape), expert));
  }
  const auto per_expert = static_cast<size_t>(t.bytes.size() / static_cast<size_t>(t.shape[0]));
  const std::byte* src = t.bytes.data() + static_cast<size_t>(expert) * per_expert;
  ExpertSlice out;
  std::vector<int64_t> shape(t.shape.begin() + 1, t.shape.end());
  out.bytes.assign(src, src + per_expert);
  if (transpose) {  // [K, N] → [N, K] element by element
    const int64_t k = shape[0], n = shape[1];
    const size_t elem = per_expert / static_cast<size_t>(k * n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        std::memcpy(out.bytes.data() + static_cast<size_t>(r * k + c) * elem, src + static_cast<size_t>(c * n + r) * elem, elem);
      }
    }
    shape = {n, k};
  }
  if (deinterleave) {
    const int64_t rows = shape[0];
    if (rows % 2 != 0) throw FormatError(fmt::format("{}: {} interleaved gate/up rows is odd", name, rows));
    const size_t row_bytes = per_expert / static_cast<size_t>(rows);
    const std::vector<std::byte> in = out.bytes;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t dst = r % 2 == 0 ? r / 2 : rows / 2 + r / 2;
      std::memcpy(out.bytes.data() + static_cast<size_t>(dst) * row_bytes, in.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
    }
  }
  out.view = core::TensorView{t.dtype, shape, std::span<const std::byte>(out.bytes)};
  return out;
}

LoadProgress::LoadProgress(uint64_t total_tensors, uint64_t total_bytes, LoadProgressCallback callback)
    : callback_(std::move(callback)) {
  state_.total_tensors = total_tensors;
  state_.total_bytes = total_bytes;
}

void LoadProgress::add(uint64_t tensors, uint64_t bytes) {
  state_.tensors += tensors;
  state_.bytes += bytes;
  report(false);
}

void LoadProgress::report(bool done) {
  if (!callback_) return;
  const uint64_t total = state_.total_bytes;
  // Shared tensors (a tied embedding) may be read twice, so the count can pass the total.
  const int percent = total == 0 ? 100 : static_cast<int>(std::min<uint64_t>(100, state_.bytes * 100 / total));
  if (!done && percent == last_percent_) return;
  last_percent_ = percent;
  state_.done = done;
  callback_(state_);
}

void LoadProgress::finish() {
  state_.tensors = state_.total_tensors;
  state_.bytes = state_.total_bytes;
  report(true);
}

PlannedWeights::PlannedWeights(const checkpoint::Checkpoint& ckpt, const plan::LayerPlan& plan, LoadProgress& progress)
    : ckpt_(ckpt), plan_(plan), progress_(progress) {
  modules_.reserve(plan.modules.size());
  for (const plan::ModulePlan& m : plan.modules) modules_.emplace(m.module.name, &m);
}

core::TensorView PlannedWeights::tensor(const std::string& name) const {
  const core::TensorView view = ckpt_.tensor(name);
  progress_.add(1, view.bytes.size());
  return view;
}

bool PlannedWeights::has_tensor(const std::string& name) const { return ckpt_.contains(name); }

LinearPart PlannedWeights::prepare_module(const plan::ModulePlan& m) const {
  const std::string& name = m.module.name;
  if (!m.scheme) throw UnsupportedError(fmt::format("{}: no scheme runs this layer on {}: {}", name, plan_.device.label(), m.reason_text));
  auto view = [&](TensorRole role) {
    const plan::TensorUse* use = m.tensor(role);
    if (use == nullptr) {
      throw FormatError(fmt::format("{}: the plan lists no {} tensor for scheme {}", name, plan::tensor_role_name(role),
                                    plan::scheme_name(*m.scheme)));
    }
    return ckpt_.tensor(use->name);
  };
  auto scalar = [&](TensorRole role) { return view(role).load<float>(0); };
  LinearPart part;
  switch (*m.scheme) {
    case SchemeId::W4A16Nvfp4:
    case SchemeId::W4A4Nvfp4Emulated: {
      const TensorRole packed_role = m.tensor(TensorRole::WeightPacked) ? TensorRole::WeightPacked : TensorRole::Weight;
      const auto convention = convention_of(m.global_scale, name);
      if (*m.scheme == SchemeId::W4A16Nvfp4) {
        part.weight = prepare::prepare_nvfp4(view(packed_role), view(TensorRole::WeightScale),
                                             scalar(TensorRole::WeightGlobalScale), convention, name);
        break;
      }
      // The numerical reference for W4A4: the weights exactly as the producer's decompression yields them (BF16),
      // activations quantized and dequantized as compressed-tensors does, fp32 math. Costs 16 bits per weight.
      const quant::DequantizedWeight dq = quant::dequantize_nvfp4(
          view(packed_role), view(TensorRole::WeightScale), scalar(TensorRole::WeightGlobalScale),
          convention == prepare::GlobalScaleConvention::Divisor ? quant::GlobalScaleConvention::Divisor
                                                                : quant::GlobalScaleConvention::Multiplier,
          name);
      std::vector<uint16_t> bf16(dq.values.size());
      for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = quant::float_to_bf16(dq.values[i]);
      const core::TensorView dense{core::DType::BF16, {dq.rows, dq.cols},
                                   std::as_bytes(std::span<const uint16_t>(bf16))};
      part.weight = prepare::prepare_dense(dense, name);
      prepare::set_input_global_scale(part.weight, scalar(TensorRole::InputGlobalScale), convention);
      part.activation_quant = kernels::ActivationEmulation::EmulateNvfp4;
      break;
    }
    case SchemeId::W4A16Mxfp4:
    case SchemeId::W4A4Mxfp4Emulated:
      // MXFP4 weights are exact in the reference's BF16 decompression (2-bit mantissa × power of two), so the
      // emulation keeps the packed layout and only fake-quantizes the activations.
      part.weight = prepare::prepare_mxfp4(view(TensorRole::WeightPacked), view(TensorRole::WeightScale), name);
      if (*m.scheme == SchemeId::W4A4Mxfp4Emulated) part.activation_quant = kernels::ActivationEmulation::EmulateMxfp4;
      break;
    case SchemeId::W4A16Int4: {
      const plan::TensorUse* zp = m.tensor(TensorRole::WeightZeroPoint);
      const plan::TensorUse* gidx = m.tensor(TensorRole::WeightGIdx);
      const core::TensorView zp_view = zp ? ckpt_.tensor(zp->name) : core::TensorView{};
      const core::TensorView gidx_view = gidx ? ckpt_.tensor(gidx->name) : core::TensorView{};
      const int64_t group = m.quant.weights && m.quant.weights->group_size ? *m.quant.weights->group_size : -1;
      part.weight = prepare::prepare_int4(view(TensorRole::WeightPacked), view(TensorRole::WeightScale),
                                          zp ? &zp_view : nullptr, gidx ? &gidx_view : nullptr,
                                          m.module.in_features, group, name);
      break;
    }
    case SchemeId::W8A16Fp8: {
      std::array<int64_t, 2> block{0, 0};
      if (m.quant.weights && m.quant.weights->block) block = *m.quant.weights->block;
      part.weight = prepare::prepare_fp8(view(TensorRole::Weight), view(TensorRole::WeightScale), block, name);
      break;
    }
    case SchemeId::Unquantized:
      part.weight = prepare::prepare_dense(ckpt_.tensor(m.module.dense_weight), name);
      break;
    case SchemeId::W4A4Nvfp4:
    case SchemeId::W4A4Mxfp4:
    case SchemeId::W8A8Fp8:
      throw UnsupportedError(fmt::format(
          "{}: scheme {} was planned for {} and needs that GPU's FP4/FP8 matrix units; this build runs it on the CPU "
          "only as weight-only or emulation (use --device cpu, or --activation-quant weight-only|emulate)",
          name, plan::scheme_name(*m.scheme), plan_.device.label()));
  }
  if (const plan::TensorUse* bias = m.tensor(TensorRole::Bias)) prepare::attach_bias(part.weight, ckpt_.tensor(bias->name), name);
  part.input_transform = online_transform(m, "input");
  if (auto output = online_transform(m, "output")) part.output_transforms.push_back({0, part.weight.out_features, std::move(output)});
  uint64_t tensors = 0, bytes = 0;
  for (const plan::TensorUse& use : m.tensors) {
    if (use.dropped || use.shared) continue;
    ++tensors;
    bytes += use.bytes;
  }
  progress_.add(tensors, bytes);
  return part;
}

std::vector<checkpoint::ModuleInfo> PlannedWeights::modules(int64_t layer, checkpoint::ModuleRole role) const {
  std::vector<checkpoint::ModuleInfo> out;
  for (const plan::ModulePlan& m : plan_.modules) {
    if (m.module.layer == layer && m.module.role == role) out.push_back(m.module);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.expert < b.expert; });
  return out;
}

LinearGroup PlannedWeights::fused_expert(const std::string& module, int64_t expert, bool deinterleave) const {
  const auto it = modules_.find(module);
  if (it == modules_.end()) throw FormatError(fmt::format("{}: module is not in the layer plan", module));
  const plan::ModulePlan* m = it->second;
  const std::string name = fmt::format("{} expert {}", module, expert);
  if (!m->scheme) throw UnsupportedError(fmt::format("{}: no scheme runs this layer on {}: {}", name, plan_.device.label(), m->reason_text));
  auto slice = [&](TensorRole role, bool transpose) {
    const plan::TensorUse* use = m->tensor(role);
    if (use == nullptr) throw FormatError(fmt::format("{}: the plan lists no {} tensor", name, plan::tensor_role_name(role)));
    return slice_expert(ckpt_.tensor(use->name), expert, deinterleave, transpose, name);
  };
  LinearPart part;
  switch (*m->scheme) {
    case SchemeId::W4A16Mxfp4: {
      // GPT-OSS blocks [E, N, K/32, 16]: one expert's [N, K/32, 16] bytes are the CT-style packed [N, K/2].
      ExpertSlice blocks = slice(TensorRole::WeightPacked, false);
      blocks.view.shape = {blocks.view.shape[0], m->module.in_features / 2};
      const ExpertSlice scales = slice(TensorRole::WeightScale, false);
      part.weight = prepare::prepare_mxfp4(blocks.view, scales.view, name);
      break;
    }
    case SchemeId::Unquantized: {
      const ExpertSlice w = slice_expert(ckpt_.tensor(m->module.dense_weight), expert, deinterleave,
                                         m->module.dense_weight_in_out, name);
      part.weight = prepare::prepare_dense(w.view, name);
      break;
    }
    case SchemeId::W4A16Nvfp4:
    case SchemeId::W4A4Nvfp4Emulated:
    case SchemeId::W4A4Mxfp4Emulated:
    case SchemeId::W4A16Int4:
    case SchemeId::W8A16Fp8:
    case SchemeId::W4A4Nvfp4:
    case SchemeId::W4A4Mxfp4:
    case SchemeId::W8A8Fp8:
      throw UnsupportedError(fmt::format("{}: scheme {} has no fused 3-D expert slicing (only GPT-OSS MXFP4 blocks and "
                                         "unquantized 3-D experts)", name, plan::scheme_name(*m->scheme)));
  }
  if (m->tensor(TensorRole::Bias) != nullptr) {
    const ExpertSlice bias = slice(TensorRole::Bias, false);
    prepare::attach_bias(part.weight, bias.view, name);
  }
  uint64_t tensors = 0, bytes = 0;
  for (const plan::TensorUse& use : m->tensors) {
    if (use.dropped || use.shared) continue;
    if (expert == m->module.experts - 1) ++tensors;
    bytes += use.bytes / static_cast<uint64_t>(std::max<int64_t>(m->module.experts, 1));
  }
  progress_.add(tensors, bytes);
  std::vector<LinearPart> parts;
  parts.push_back(std::move(part));
  return LinearGroup(std::move(parts), {module});
}

std::shared_ptr<const OnlineTransform> PlannedWeights::transform(const std::string& owner, const quant::TransformUse& t,
                                                                  const std::vector<plan::TensorUse>& tensors) const {
  const plan::TensorUse* matrix = nullptr;
  const plan::TensorUse* perm = nullptr;
  for (const plan::TensorUse& use : tensors) {
    if (use.role == TensorRole::TransformMatrix && matrix == nullptr) matrix = &use;
    if (use.role == TensorRole::TransformPerm && perm == nullptr) perm = &use;
  }
  if (matrix == nullptr || (t.randomize && perm == nullptr)) {
    throw FormatError(fmt::format("{}: the plan lists no {} tensor for online transform {} at `{}`", owner,
                                  matrix == nullptr ? "matrix" : "perm", t.group, t.location));
  }
  TransformSource source{matrix->name, t.type, t.inverse, ckpt_.tensor(matrix->name), std::nullopt};
  if (perm) source.perm = ckpt_.tensor(perm->name);
  return transforms_.get(source);
}

std::shared_ptr<const OnlineTransform> PlannedWeights::online_transform(const plan::ModulePlan& m,
                                                                        std::string_view location) const {
  // The contract (plan/scheme.cpp) lists each online transform's matrix, then its perm when randomized, in config
  // order; the names may be tied copies stored under another module, so go by position rather than by name.
  std::vector<const plan::TensorUse*> transform_tensors;
  for (const plan::TensorUse& use : m.tensors) {
    if (use.role == TensorRole::TransformMatrix || use.role == TensorRole::TransformPerm) transform_tensors.push_back(&use);
  }
  std::shared_ptr<const OnlineTransform> out;
  size_t next = 0;
  for (const quant::TransformUse& t : m.quant.transforms) {
    if (!t.online) continue;  // weight_input / weight_output are folded into the stored weight
    const size_t count = t.randomize ? 2 : 1;
    std::vector<plan::TensorUse> uses;
    for (size_t i = next; i < std::min(next + count, transform_tensors.size()); ++i) uses.push_back(*transform_tensors[i]);
    next += count;
    if (t.location != "input" && t.location != "output") {
      throw UnsupportedError(fmt::format("{}: online transform {} at location `{}` does not apply to a Linear",
                                         m.module.name, t.group, t.location));
    }
    if (t.location != location) continue;
    if (out) {
      throw UnsupportedError(fmt::format("{}: more than one online {} transform (second: group {})", m.module.name,
                                         location, t.group));
    }
    out = transform(m.module.name, t, uses);
    const int64_t width = location == "input" ? m.module.in_features : m.module.out_features;
    if (width % out->block() != 0) {
      throw FormatError(fmt::format("{}: transform {} has block {} that does not divide {} {}", m.module.name, t.group,
                                    out->block(), location == "input" ? "in_features" : "out_features", width));
    }
  }
  return out;
}

AttentionTransforms PlannedWeights::attention_transforms(int64_t layer) const {
  AttentionTransforms out;
  for (const plan::AttentionTransform& at : plan_.attention_transforms) {
    if (at.layer != layer) continue;
    auto t = transform(at.module, at.transform, at.tensors);
    (at.transform.location == "q_attn" ? out.query : out.key).push_back(std::move(t));
  }
  return out;
}

LinearGroup PlannedWeights::linear_group(const std::vector<std::string>& modules) const {
  std::vector<LinearPart> parts;
  bool fuse = modules.size() > 1;
  for (const std::string& name : modules) {
    const auto it = modules_.find(name);
    if (it == modules_.end()) throw FormatError(fmt::format("{}: module is not in the layer plan", name));
    const plan::ModulePlan* m = it->second;
    fuse = fuse && m->run_fused;
    parts.push_back(prepare_module(*m));
  }
  for (const LinearPart& p : parts) {
    fuse = fuse && p.activation_quant == parts.front().activation_quant && p.weight.layout == parts.front().weight.layout &&
           p.weight.input_global_scale == parts.front().weight.input_global_scale &&
           p.input_transform == parts.front().input_transform;
  }
  if (fuse) {
    // One GEMM for the whole group; each shard keeps its own global scale inside the prepared weight and its
    // output transform on its own slice.
    std::vector<LinearPart> fused;
    fused.push_back(fuse_parts(std::move(parts)));
    return LinearGroup(std::move(fused), modules);
  }
  return LinearGroup(std::move(parts), modules);
}

}  // namespace fp4serve::model
