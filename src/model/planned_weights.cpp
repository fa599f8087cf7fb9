// SPDX-License-Identifier: Apache-2.0
#include "model/planned_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "fp4serve/error.h"
#include "quant/slice.h"
#include "quant/dequant.h"
#include "quant/formats.h"

namespace fp4serve::model {
namespace {

using plan::SchemeId;
using plan::TensorRole;

quant::GlobalScaleConvention convention_of(const plan::ModulePlan& m, const std::string& module) {
  if (!m.global_scale) {
    throw FormatError(fmt::format("{}: the plan gives no global-scale convention for a {} layer", module,
                                  plan::scheme_name(*m.scheme)));
  }
  return *m.global_scale;
}

// The activation emulation of a block format's W4A4 scheme (linear_group.h): a new format needs its own.
ActivationEmulation emulation_of(quant::BlockFormat f) {
  switch (f) {
    case quant::BlockFormat::Nvfp4: return ActivationEmulation::EmulateNvfp4;
    case quant::BlockFormat::Mxfp4: return ActivationEmulation::EmulateMxfp4;
  }
  return ActivationEmulation::None;
}

quant::DenseRequant requant_of(LmHeadDtype dtype) {
  switch (dtype) {
    case LmHeadDtype::Bf16: return quant::DenseRequant::None;
    case LmHeadDtype::Fp8: return quant::DenseRequant::Fp8Rows;
    case LmHeadDtype::Int8: return quant::DenseRequant::Int8Rows;
  }
  return quant::DenseRequant::None;
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
  if (!transpose && !deinterleave) {  // the expert's bytes as they lie in `t`: no copy
    out.view = core::TensorView{t.dtype, shape, std::span<const std::byte>(src, per_expert)};
    return out;
  }
  out.bytes.resize(per_expert);
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
    // Reorder from the source directly, or from a copy of the transposed rows.
    std::vector<std::byte> transposed;
    if (transpose) transposed = out.bytes;
    const std::byte* in = transpose ? transposed.data() : src;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t dst = r % 2 == 0 ? r / 2 : rows / 2 + r / 2;
      std::memcpy(out.bytes.data() + static_cast<size_t>(dst) * row_bytes, in + static_cast<size_t>(r) * row_bytes, row_bytes);
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

PlannedWeights::PlannedWeights(const checkpoint::Checkpoint& ckpt, const plan::LayerPlan& plan, LoadProgress& progress,
                               const plan::TensorParallelPlan* tp, int rank, PrepareOptions options)
    : ckpt_(ckpt),
      plan_(plan),
      progress_(progress),
      options_(options),
      tp_(tp != nullptr && tp->size > 1 ? tp : nullptr),
      rank_(rank) {
  if (tp_ != nullptr && (rank < 0 || rank >= tp_->size)) {
    throw UsageError(fmt::format("rank {} is outside 0 … {} (tensor_parallel_size {})", rank, tp_->size - 1, tp_->size));
  }
  modules_.reserve(plan.modules.size());
  for (const plan::ModulePlan& m : plan.modules) modules_.emplace(m.module.name, &m);
}

core::TensorView PlannedWeights::read(const std::string& name) const {
  core::TensorView view = ckpt_.tensor(name);
  read_.push_back(view.bytes);
  return view;
}

void PlannedWeights::release_read() const {
  for (const std::span<const std::byte> bytes : read_) ckpt_.release_pages(bytes);
  read_.clear();
}

core::TensorView PlannedWeights::tensor(const std::string& name) const {
  const core::TensorView view = read(name);
  progress_.add(1, view.bytes.size());
  return view;
}

bool PlannedWeights::has_tensor(const std::string& name) const { return ckpt_.contains(name); }

LinearPart PlannedWeights::prepare_module(const plan::ModulePlan& m) const {
  const std::string& name = m.module.name;
  if (!m.scheme) throw UnsupportedError(fmt::format("{}: no scheme runs this layer on {}: {}", name, plan_.device.label(), m.reason_text));
  const plan::ModuleShard shard = shard_of(m);
  const bool row_split = shard.rows.size() != m.module.out_features;
  const bool col_split = shard.columns.size() != m.module.in_features;
  const int64_t k_local = shard.columns.size();
  LinearPart part;
  // The shard slices live as long as the weights (the backend's upload repacks from them).
  const auto keep = [&](quant::OwnedTensor t) {
    auto held = std::make_shared<const quant::OwnedTensor>(std::move(t));
    const core::TensorView v = held->view;
    part.weight.owned.push_back(std::move(held));
    return v;
  };
  const auto slice = [&](core::TensorView t, TensorRole role) -> core::TensorView {
    if (!row_split && !col_split) return t;
    const std::string what = fmt::format("{} {} (rank {} shard)", name, plan::tensor_role_name(role), rank_);
    const int64_t group = plan::row_split_granule(m) > 0 && m.quant.weights && m.quant.weights->group_size.value_or(0) > 0
                              ? *m.quant.weights->group_size
                              : 0;
    const bool fp8_block = m.quant.weights && m.quant.weights->block.has_value();
    switch (role) {
      case TensorRole::Weight:
      case TensorRole::WeightPacked: {
        if (row_split) t = keep(quant::slice_rows(t, shard.rows.begin, shard.rows.end, what));
        if (col_split) {
          const int64_t per = t.dtype == core::DType::I32 ? 8 : (t.dtype == core::DType::U8 ? 2 : 1);
          t = keep(quant::slice_columns(t, shard.columns.begin / per, shard.columns.end / per, what));
        }
        return t;
      }
      case TensorRole::WeightScale:
      case TensorRole::WeightZeroPoint: {
        if (t.shape.size() <= 1 && (t.shape.empty() || t.shape[0] == 1)) return t;  // a per-tensor scale
        int64_t bh = 1, bw = m.module.in_features;  // rows and K columns one stored scale covers
        if (fp8_block) {
          bh = (*m.quant.weights->block)[0];
          bw = (*m.quant.weights->block)[1];
        } else if (t.shape.size() == 2 && t.shape[1] > 0) {
          bw = (m.module.in_features + t.shape[1] - 1) / t.shape[1];
          if (group > 0) bw = group;
        }
        if (row_split) {
          t = role == TensorRole::WeightZeroPoint
                  ? keep(quant::slice_packed_int4_rows(t, shard.rows.begin, shard.rows.end, what))
                  : keep(quant::slice_rows(t, shard.rows.begin / bh, (shard.rows.end + bh - 1) / bh, what));
        }
        if (col_split && t.shape.size() == 2 && t.shape[1] > 1) {
          t = keep(quant::slice_columns(t, shard.columns.begin / bw, (shard.columns.end + bw - 1) / bw, what));
        }
        return t;
      }
      case TensorRole::WeightGIdx: {
        if (!col_split) return t;
        // Activation order under a K split: every column of this rank must belong to a group that lies wholly in
        // its columns, so that the rank holds all scales its columns read (renumbered from its first group).
        quant::OwnedTensor g = quant::slice_rows(t, shard.columns.begin, shard.columns.end, what);
        const int64_t g0 = shard.columns.begin / std::max<int64_t>(group, 1);
        const int64_t g1 = (shard.columns.end + std::max<int64_t>(group, 1) - 1) / std::max<int64_t>(group, 1);
        auto* v = reinterpret_cast<int32_t*>(g.bytes.data());
        for (int64_t i = 0; i < k_local; ++i) {
          int32_t x = 0;
          std::memcpy(&x, v + i, sizeof x);
          if (x < g0 || x >= g1) {
            throw UnsupportedError(fmt::format(
                "{}: activation-order column {} reads group {}, which lies outside this rank's columns [{}, {}) "
                "(groups {} … {}); this g_idx cannot be split over tensor_parallel_size {}",
                what, shard.columns.begin + i, x, shard.columns.begin, shard.columns.end, g0, g1 - 1, tp_->size));
          }
          x -= static_cast<int32_t>(g0);
          std::memcpy(v + i, &x, sizeof x);
        }
        return keep(std::move(g));
      }
      case TensorRole::Bias:
        return row_split ? keep(quant::slice_rows(t, shard.rows.begin, shard.rows.end, what)) : t;
      case TensorRole::WeightGlobalScale:
      case TensorRole::WeightShape:
      case TensorRole::InputGlobalScale:
      case TensorRole::InputScale:
      case TensorRole::TransformMatrix:
      case TensorRole::TransformPerm: return t;  // scalars and block-diagonal matrices: every shard keeps them
    }
    return t;
  };
  auto view = [&](TensorRole role) {
    const plan::TensorUse* use = m.tensor(role);
    if (use == nullptr) {
      throw FormatError(fmt::format("{}: the plan lists no {} tensor for scheme {}", name, plan::tensor_role_name(role),
                                    plan::scheme_name(*m.scheme)));
    }
    return slice(read(use->name), role);
  };
  auto scalar = [&](TensorRole role) { return view(role).load<float>(0); };
  quant::LinearWeights& w = part.weight;
  w.in_features = k_local;
  quant::WeightRows rows;
  rows.name = name;
  const plan::SchemeTraits& scheme = plan::scheme_traits(*m.scheme);
  // Native W4A4 is planned only where the device's catalogue has FP4 matrix units (the CUDA backend's cuBLASLt
  // block-scaled path, which quantizes the activations on the device): the packed weights with the activation
  // format attached, as the emulation has them. Native FP8 has no kernel in any catalogue.
  const bool native = scheme.activations == plan::ActivationMode::Native;
  if (native && scheme.weights != plan::WeightKind::Block) {
    throw UnsupportedError(fmt::format("{}: scheme {} was planned for {}, but fp4serve has no kernel for it", name,
                                       scheme.name, plan_.device.label()));
  }
  switch (scheme.weights) {
    case plan::WeightKind::Block: {
      const quant::BlockFormat format = *scheme.block;
      const bool global = quant::block_format_traits(format).global_scale;
      const TensorRole packed_role = m.tensor(TensorRole::WeightPacked) ? TensorRole::WeightPacked : TensorRole::Weight;
      const auto convention = global ? convention_of(m, name) : quant::GlobalScaleConvention::Divisor;
      const float global_scale = global ? scalar(TensorRole::WeightGlobalScale) : 0.f;
      const bool emulated = scheme.activations == plan::ActivationMode::Emulated;
      if (emulated && global) {
        // The numerical reference for W4A4: the weights exactly as the producer's decompression yields them
        // (BF16: block scale ∘ global scale is rounded there), activations quantized and dequantized as
        // compressed-tensors does, fp32 math. Costs 16 bits per weight.
        const quant::DequantizedWeight dq = quant::dequantize_block(format, view(packed_role), view(TensorRole::WeightScale),
                                                                    global_scale, convention, name);
        std::vector<std::byte> bf16(dq.values.size() * sizeof(uint16_t));
        for (size_t i = 0; i < dq.values.size(); ++i) {
          const uint16_t b = quant::float_to_bf16(dq.values[i]);
          std::memcpy(bf16.data() + i * sizeof b, &b, sizeof b);
        }
        w.encoding = quant::WeightEncoding::Dense;
        rows.weight = w.keep(std::move(bf16), core::DType::BF16, {dq.rows, dq.cols});
        quant::set_input_global_scale(w, scalar(TensorRole::InputGlobalScale), convention);
      } else {
        // Without a global scale the weights are exact in the reference's BF16 decompression (2-bit mantissa ×
        // power of two), so the emulation keeps the packed layout and only fake-quantizes the activations.
        w.encoding = quant::WeightEncoding::Fp4;
        w.block_format = format;
        w.convention = convention;
        rows.weight = view(packed_role);
        rows.weight_scale = view(TensorRole::WeightScale);
        rows.global_scale = global_scale;
        if (native && global) quant::set_input_global_scale(w, scalar(TensorRole::InputGlobalScale), convention);
      }
      if (emulated || native) part.activation_quant = emulation_of(format);
      break;
    }
    case plan::WeightKind::Int4: {
      const plan::TensorUse* zp = m.tensor(TensorRole::WeightZeroPoint);
      const plan::TensorUse* gidx = m.tensor(TensorRole::WeightGIdx);
      const core::TensorView zp_view = zp ? slice(read(zp->name), TensorRole::WeightZeroPoint) : core::TensorView{};
      const core::TensorView gidx_view = gidx ? slice(read(gidx->name), TensorRole::WeightGIdx) : core::TensorView{};
      w.encoding = quant::WeightEncoding::Int4;
      w.group_size = m.quant.weights && m.quant.weights->group_size ? *m.quant.weights->group_size : -1;
      rows.weight = view(TensorRole::WeightPacked);
      rows.weight_scale = view(TensorRole::WeightScale);
      rows.zero_point = zp_view;
      rows.has_zero_point = zp != nullptr;
      rows.g_idx = gidx_view;
      rows.has_g_idx = gidx != nullptr;
      break;
    }
    case plan::WeightKind::Fp8: {
      w.encoding = quant::WeightEncoding::Fp8;
      if (m.quant.weights && m.quant.weights->block) w.fp8_block = *m.quant.weights->block;
      rows.weight = view(TensorRole::Weight);
      rows.weight_scale = view(TensorRole::WeightScale);
      break;
    }
    case plan::WeightKind::Unquantized: {
      w.encoding = quant::WeightEncoding::Dense;
      rows.weight = slice(read(m.module.dense_weight), TensorRole::Weight);
      if (m.module.role == checkpoint::ModuleRole::LmHead) w.requant = requant_of(options_.lm_head_dtype);
      break;
    }
  }
  if (const plan::TensorUse* bias = m.tensor(TensorRole::Bias); bias != nullptr && shard.bias) {
    rows.bias = slice(read(bias->name), TensorRole::Bias);
    rows.has_bias = true;
  }
  w.rows.push_back(std::move(rows));
  part.input_transform = online_transform(m, "input", k_local);
  if (auto output = online_transform(m, "output", shard.rows.size())) {
    part.output_transforms.push_back({0, part.weight.out_features(), std::move(output)});
  }
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
  // Tensor parallelism: whole experts of other ranks are not loaded; split experts keep this rank's slice of the
  // intermediate: gate and up rows (each half of a gate | up expert) or down's K columns.
  plan::ModuleShard shard = shard_of(*m);
  const plan::LayerShard* layer_shard = tp_ ? &tp_->layers.at(static_cast<size_t>(m->module.layer)) : nullptr;
  if (layer_shard != nullptr && layer_shard->ffn == plan::FfnSplit::WholeExperts) {
    const plan::IndexRange& mine = layer_shard->expert_ranges[static_cast<size_t>(rank_)];
    if (expert < mine.begin || expert >= mine.end) return LinearGroup();
  }
  const bool gate_up = m->module.role == checkpoint::ModuleRole::ExpertsGateUp;
  const bool split = layer_shard != nullptr && layer_shard->ffn == plan::FfnSplit::Intermediate;
  LinearPart part;
  quant::LinearWeights& w = part.weight;
  // The expert's slices (and this rank's cut of them) live as long as the weights.
  const auto hold = [&](std::vector<std::byte> bytes, const core::TensorView& like, std::vector<int64_t> shape) {
    return w.keep(std::move(bytes), like.dtype, std::move(shape));
  };
  const auto cut = [&](core::TensorView v, int64_t per) -> core::TensorView {
    if (!split) return v;
    if (gate_up) {  // rows: [h·I + i0, h·I + i1) of each half h
      const int64_t inter = layer_shard->intermediate;
      const int64_t halves = v.shape[0] / inter;
      std::vector<std::byte> out;
      for (int64_t h = 0; h < halves; ++h) {
        quant::OwnedTensor part_rows = quant::slice_rows(v, h * inter + shard.rows.begin, h * inter + shard.rows.end, name);
        out.insert(out.end(), part_rows.bytes.begin(), part_rows.bytes.end());
      }
      std::vector<int64_t> shape = v.shape;
      shape[0] = halves * shard.rows.size();
      return hold(std::move(out), v, std::move(shape));
    }
    if (v.shape.size() == 1) return v;  // down's bias: kept whole, added by rank 0 only
    quant::OwnedTensor c = quant::slice_columns(v, shard.columns.begin / per, shard.columns.end / per, name);
    return hold(std::move(c.bytes), c.view, c.view.shape);
  };
  auto slice = [&](TensorRole role, bool transpose) {
    const plan::TensorUse* use = m->tensor(role);
    if (use == nullptr) throw FormatError(fmt::format("{}: the plan lists no {} tensor", name, plan::tensor_role_name(role)));
    ExpertSlice e = slice_expert(read(use->name), expert, deinterleave, transpose, name);
    return e.bytes.empty() ? e.view : hold(std::move(e.bytes), e.view, e.view.shape);
  };
  quant::WeightRows rows;
  rows.name = name;
  const plan::SchemeTraits& scheme = plan::scheme_traits(*m->scheme);
  if (m->quant.format == quant::StorageFormat::GptOssMxfp4Blocks && scheme.weights == plan::WeightKind::Block &&
      scheme.activations == plan::ActivationMode::None) {
    // GPT-OSS blocks [E, N, K/g, g/2]: one expert's [N, K/g, g/2] bytes are the CT-style packed [N, K/2].
    const quant::BlockFormatTraits& f = quant::block_format_traits(*scheme.block);
    core::TensorView blocks = slice(TensorRole::WeightPacked, false);
    blocks.shape = {blocks.shape[0], m->module.in_features / 2};
    const core::TensorView scales = slice(TensorRole::WeightScale, false);
    w.encoding = quant::WeightEncoding::Fp4;
    w.block_format = f.format;
    rows.weight = cut(blocks, 2);
    rows.weight_scale = cut(scales, f.group_size);
    w.in_features = rows.weight.shape.size() == 2 ? rows.weight.shape[1] * 2 : 0;
  } else if (scheme.weights == plan::WeightKind::Unquantized) {
    ExpertSlice e = slice_expert(read(m->module.dense_weight), expert, deinterleave,
                                 m->module.dense_weight_in_out, name);
    const core::TensorView whole = e.bytes.empty() ? e.view : hold(std::move(e.bytes), e.view, e.view.shape);
    w.encoding = quant::WeightEncoding::Dense;
    rows.weight = cut(whole, 1);
    w.in_features = rows.weight.shape.size() == 2 ? rows.weight.shape[1] : 0;
  } else {
    throw UnsupportedError(fmt::format("{}: scheme {} has no fused 3-D expert slicing (only GPT-OSS MXFP4 blocks and "
                                       "unquantized 3-D experts)", name, scheme.name));
  }
  if (m->tensor(TensorRole::Bias) != nullptr && (shard.bias || !split || gate_up)) {
    rows.bias = cut(slice(TensorRole::Bias, false), 1);
    rows.has_bias = true;
  }
  w.rows.push_back(std::move(rows));
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
  TransformSource source{matrix->name, t.type, t.inverse, read(matrix->name), std::nullopt};
  if (perm) source.perm = read(perm->name);
  return transforms_.get(source);
}

std::shared_ptr<const OnlineTransform> PlannedWeights::online_transform(const plan::ModulePlan& m,
                                                                        std::string_view location,
                                                                        int64_t width) const {
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
    if (!shard_of(*m).present) return LinearGroup();  // an expert of another rank
    fuse = fuse && m->run_fused;
    parts.push_back(prepare_module(*m));
  }
  for (const LinearPart& p : parts) {
    fuse = fuse && p.activation_quant == parts.front().activation_quant &&
           p.weight.encoding == parts.front().weight.encoding &&
           p.weight.block_format == parts.front().weight.block_format &&
           p.weight.input_global_scale == parts.front().weight.input_global_scale &&
           p.input_transform == parts.front().input_transform;
  }
  if (fuse) {
    // One GEMM for the whole group; each shard keeps its own global scale in its row block and its output
    // transform on its own slice.
    std::vector<LinearPart> fused;
    fused.push_back(fuse_parts(std::move(parts)));
    return LinearGroup(std::move(fused), modules);
  }
  return LinearGroup(std::move(parts), modules);
}

}  // namespace fp4serve::model

namespace fp4serve::model {

plan::ModuleShard PlannedWeights::shard_of(const plan::ModulePlan& m) const {
  if (tp_ == nullptr) return {true, {0, m.module.out_features}, {0, m.module.in_features}, true};
  return plan::module_shard(*tp_, m, rank_);
}

std::optional<AttentionHeads> PlannedWeights::attention_heads() const {
  if (tp_ == nullptr || tp_->layers.empty()) return std::nullopt;
  const plan::LayerShard& l = tp_->layers.front();
  const auto r = static_cast<size_t>(rank_);
  return AttentionHeads{l.q_heads[r].begin, l.q_heads[r].size(), l.kv_heads[r].begin, l.kv_heads[r].size()};
}

std::string_view lm_head_dtype_name(LmHeadDtype dtype) {
  switch (dtype) {
    case LmHeadDtype::Bf16: return "bf16";
    case LmHeadDtype::Fp8: return "fp8";
    case LmHeadDtype::Int8: return "int8";
  }
  return "?";
}

}  // namespace fp4serve::model
