// SPDX-License-Identifier: Apache-2.0
#include "plan/scheme.h"

#include <fmt/format.h>

#include <array>

#include "fp4serve/error.h"

namespace fp4serve::plan {
namespace {

using core::DType;
using quant::Dynamic;
using quant::QuantArgs;
using quant::QuantType;
using quant::ScaleDtype;
using quant::StorageFormat;
using quant::Strategy;

constexpr std::array<SchemeTraits, 10> kSchemes{{
    {SchemeId::W4A4Nvfp4, "W4A4_NVFP4", true},
    {SchemeId::W4A16Nvfp4, "W4A16_NVFP4", false},
    {SchemeId::W4A4Nvfp4Emulated, "W4A4_NVFP4_EMULATED", true},
    {SchemeId::W4A4Mxfp4, "W4A4_MXFP4", true},
    {SchemeId::W4A4Mxfp4Emulated, "W4A4_MXFP4_EMULATED", true},
    {SchemeId::W4A16Mxfp4, "W4A16_MXFP4", false},
    {SchemeId::W4A16Int4, "W4A16_INT4", false},
    {SchemeId::W8A8Fp8, "W8A8_FP8", true},
    {SchemeId::W8A16Fp8, "W8A16_FP8", false},
    {SchemeId::Unquantized, "UNQUANTIZED", false},
}};

// --- rule 1 predicates: every distinguishing field -------------------------------------------------------------

bool e4m3_or_unset(ScaleDtype s) { return s == ScaleDtype::Unspecified || s == ScaleDtype::E4M3; }
bool e8m0_or_unset(ScaleDtype s) { return s == ScaleDtype::Unspecified || s == ScaleDtype::E8M0; }

bool is_nvfp4_weights(const QuantArgs& w) {
  return w.type == QuantType::Float && w.num_bits == 4 && w.strategy == Strategy::TensorGroup && w.group_size == 16 &&
         w.symmetric && w.dynamic == Dynamic::Static && e4m3_or_unset(w.scale_dtype);
}
bool is_nvfp4_input(const QuantArgs& a) {
  return a.type == QuantType::Float && a.num_bits == 4 && a.strategy == Strategy::TensorGroup && a.group_size == 16 &&
         a.symmetric && a.dynamic == Dynamic::Local && e4m3_or_unset(a.scale_dtype);
}
bool is_mxfp4_weights(const QuantArgs& w) {
  return w.type == QuantType::Float && w.num_bits == 4 && w.strategy == Strategy::Group && w.group_size == 32 &&
         w.symmetric && w.dynamic == Dynamic::Static && e8m0_or_unset(w.scale_dtype);
}
bool is_mxfp4_input(const QuantArgs& a) {
  return a.type == QuantType::Float && a.num_bits == 4 && a.strategy == Strategy::Group && a.group_size == 32 &&
         a.symmetric && a.dynamic == Dynamic::Dynamic && e8m0_or_unset(a.scale_dtype);
}
bool is_int4_weights(const QuantArgs& w) {
  const bool grouped = (w.strategy == Strategy::Group && w.group_size.value_or(0) > 0) || w.strategy == Strategy::Channel;
  return w.type == QuantType::Int && w.num_bits == 4 && grouped && w.dynamic == Dynamic::Static &&
         w.scale_dtype != ScaleDtype::E4M3 && w.scale_dtype != ScaleDtype::E8M0;
}
bool is_fp8_weights(const QuantArgs& w) {
  const bool strategy = w.strategy == Strategy::Tensor || w.strategy == Strategy::Channel || w.strategy == Strategy::Block;
  return w.type == QuantType::Float && w.num_bits == 8 && strategy && w.symmetric && w.dynamic == Dynamic::Static &&
         w.scale_dtype != ScaleDtype::E8M0 && w.scale_dtype != ScaleDtype::E4M3;
}
bool is_fp8_input(const QuantArgs& a) {
  if (a.type != QuantType::Float || a.num_bits != 8 || !a.symmetric || a.scale_dtype == ScaleDtype::E8M0) return false;
  if (a.strategy == Strategy::Tensor) return a.dynamic == Dynamic::Static || a.dynamic == Dynamic::Dynamic;
  return (a.strategy == Strategy::Token || a.strategy == Strategy::Group) && a.dynamic == Dynamic::Dynamic;
}

[[noreturn]] void refuse(const quant::LayerQuant& q, const checkpoint::ModuleInfo& m, std::string_view why) {
  throw UnsupportedError(fmt::format(
      "layer {} ({} '{}', format '{}'): {}; weights: {}; input activations: {}", m.name,
      q.producer == quant::Producer::ModelOpt ? "ModelOpt algorithm" : "config group", q.source, q.format_name, why,
      q.weights ? q.weights->describe() : "none", q.input ? q.input->describe() : "none"));
}

void require_storage(const quant::LayerQuant& q, const checkpoint::ModuleInfo& m, std::initializer_list<StorageFormat> ok,
                     std::string_view what) {
  for (StorageFormat f : ok) {
    if (q.format == f) return;
  }
  refuse(q, m, fmt::format("the arguments describe {} but the storage format is '{}'", what,
                           quant::storage_format_name(q.format)));
}

std::string shape_formula_scalar() { return "[1] or []"; }

}  // namespace

std::string_view scheme_name(SchemeId id) { return scheme_traits(id).name; }
const SchemeTraits& scheme_traits(SchemeId id) { return kSchemes[static_cast<size_t>(id)]; }

std::string_view variant_name(Variant v) {
  switch (v) {
    case Variant::Unquantized: return "unquantized";
    case Variant::Nvfp4W4A4: return "NVFP4 W4A4";
    case Variant::Nvfp4W4A16: return "NVFP4 W4A16";
    case Variant::Mxfp4W4A4: return "MXFP4 W4A4";
    case Variant::Mxfp4W4A16: return "MXFP4 W4A16";
    case Variant::Int4W4A16: return "INT4 W4A16";
    case Variant::Fp8W8A8: return "FP8 W8A8";
    case Variant::Fp8W8A16: return "FP8 W8A16";
  }
  return "?";
}

bool variant_has_activation_quant(Variant v) {
  switch (v) {
    case Variant::Nvfp4W4A4:
    case Variant::Mxfp4W4A4:
    case Variant::Fp8W8A8:
      return true;
    case Variant::Unquantized:
    case Variant::Nvfp4W4A16:
    case Variant::Mxfp4W4A16:
    case Variant::Int4W4A16:
    case Variant::Fp8W8A16:
      return false;
  }
  return false;
}

Variant classify_layer(const quant::LayerQuant& q, const checkpoint::ModuleInfo& m) {
  if (!q.weights) {
    if (q.input) refuse(q, m, "activation quantization without weight quantization has no scheme");
    return Variant::Unquantized;
  }
  if (q.has_output_quant) refuse(q, m, "output activation quantization is not supported");
  if (m.experts > 0 && q.format != StorageFormat::GptOssMxfp4Blocks) {
    refuse(q, m, "quantized fused 3-D experts are supported only as GPT-OSS native MXFP4 blocks");
  }
  if (q.format == StorageFormat::Dense) refuse(q, m, "format 'dense' with quantization args is fake-quantized (float "
                                                   "weights plus scales), which fp4serve does not load");
  const QuantArgs& w = *q.weights;
  const QuantArgs* a = q.input ? &*q.input : nullptr;
  if (is_nvfp4_weights(w)) {
    require_storage(q, m, {StorageFormat::Nvfp4Packed}, "NVFP4 weights");
    if (a == nullptr) return Variant::Nvfp4W4A16;
    if (is_nvfp4_input(*a)) return Variant::Nvfp4W4A4;
    refuse(q, m, "NVFP4 weights need NVFP4 activations (float4 tensor_group group_size=16 dynamic=local) or none");
  }
  if (is_mxfp4_weights(w)) {
    require_storage(q, m, {StorageFormat::Mxfp4Packed, StorageFormat::GptOssMxfp4Blocks}, "MXFP4 weights");
    if (a == nullptr) return Variant::Mxfp4W4A16;
    if (is_mxfp4_input(*a)) return Variant::Mxfp4W4A4;
    refuse(q, m, "MXFP4 weights need MXFP4 activations (float4 group group_size=32 dynamic=true) or none");
  }
  if (w.type == QuantType::Float && w.num_bits == 4) {
    refuse(q, m, "4-bit float weights match neither NVFP4 (tensor_group, group_size 16, E4M3 scales, symmetric, "
                 "static) nor MXFP4 (group, group_size 32, E8M0 scales, symmetric, static)");
  }
  if (is_int4_weights(w)) {
    require_storage(q, m, {StorageFormat::IntPacked}, "int4 weights");
    if (a != nullptr) refuse(q, m, "int4 weights with activation quantization (W4A8) have no scheme");
    return Variant::Int4W4A16;
  }
  if (is_fp8_weights(w)) {
    require_storage(q, m, {StorageFormat::Fp8}, "FP8 weights");
    if (a == nullptr) return Variant::Fp8W8A16;
    if (is_fp8_input(*a)) return Variant::Fp8W8A8;
    refuse(q, m, "FP8 weights need FP8 activations (tensor, token or group) or none");
  }
  refuse(q, m, "no fp4serve scheme matches this combination");
}

bool scheme_supported(SchemeId id, const DeviceCaps& d, std::string* why_not) {
  std::string reason;
  switch (id) {
    case SchemeId::W4A4Nvfp4:
      if (!d.has_nvfp4_mma()) reason = fmt::format("{} has no FP4 matrix units (needs sm100 or sm120)", d.label());
      break;
    case SchemeId::W4A4Mxfp4:
      if (!d.has_mxfp4_mma()) {
        reason = d.has_nvfp4_mma() ? fmt::format("{}: no MXFP4 W4A4 kernel (MXFP4 activations run on the sm100 family only)", d.label())
                                   : fmt::format("{} has no FP4 matrix units (needs the sm100 family)", d.label());
      }
      break;
    case SchemeId::W8A8Fp8:
      if (!d.has_fp8_mma()) reason = fmt::format("{} has no FP8 matrix units (needs sm89+)", d.label());
      break;
    case SchemeId::W4A16Nvfp4:
    case SchemeId::W4A4Nvfp4Emulated:
    case SchemeId::W4A4Mxfp4Emulated:
    case SchemeId::W4A16Mxfp4:
    case SchemeId::W4A16Int4:
    case SchemeId::W8A16Fp8:
      if (!d.runs_weight_only()) reason = fmt::format("{} is below sm80: quantized weights are not supported there", d.label());
      break;
    case SchemeId::Unquantized:
      break;
  }
  if (why_not != nullptr) *why_not = reason;
  return reason.empty();
}

std::string_view tensor_role_name(TensorRole r) {
  switch (r) {
    case TensorRole::Weight: return "weight";
    case TensorRole::WeightPacked: return "weight_packed";
    case TensorRole::WeightScale: return "weight_scale";
    case TensorRole::WeightGlobalScale: return "weight_global_scale";
    case TensorRole::WeightZeroPoint: return "weight_zero_point";
    case TensorRole::WeightShape: return "weight_shape";
    case TensorRole::WeightGIdx: return "weight_g_idx";
    case TensorRole::InputGlobalScale: return "input_global_scale";
    case TensorRole::InputScale: return "input_scale";
    case TensorRole::Bias: return "bias";
    case TensorRole::TransformMatrix: return "transform";
    case TensorRole::TransformPerm: return "transform_perm";
  }
  return "?";
}

std::string_view scale_convention_name(ScaleConvention c) {
  switch (c) {
    case ScaleConvention::None: return "none";
    case ScaleConvention::Divisor: return "divisor";
    case ScaleConvention::Multiplier: return "multiplier";
  }
  return "?";
}

ScaleConvention global_scale_convention(Variant v, const quant::LayerQuant& q) {
  const bool has_global = v == Variant::Nvfp4W4A4 || v == Variant::Nvfp4W4A16;
  if (!has_global) return ScaleConvention::None;
  return q.producer == quant::Producer::ModelOpt ? ScaleConvention::Multiplier : ScaleConvention::Divisor;
}

namespace {

const std::vector<DType> kFloatTypes{DType::BF16, DType::F16, DType::F32};

struct ContractBuilder {
  const checkpoint::ModuleInfo& m;
  std::vector<TensorContract> out;

  void add(std::string name, TensorRole role, std::vector<DType> dtypes, std::vector<std::vector<int64_t>> shapes,
           std::string formula, bool required = true, bool dropped = false) {
    out.push_back({std::move(name), role, std::move(dtypes), std::move(shapes), std::move(formula), required, dropped, false});
  }
  void scalar(std::string name, TensorRole role, bool dropped, std::vector<DType> dtypes = {DType::F32}) {
    add(std::move(name), role, std::move(dtypes), {{1}, {}}, shape_formula_scalar(), true, dropped);
  }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_divisible(const checkpoint::ModuleInfo& m, int64_t group, std::string_view what, std::vector<std::string>& problems) {
  if (group > 0 && m.in_features % group != 0) {
    problems.push_back(fmt::format("{}: in_features K = {} is not divisible by the {} group size {}", m.name,
                                   m.in_features, what, group));
  }
}

}  // namespace

std::vector<TensorContract> parameter_contract(SchemeId scheme, Variant variant, const quant::LayerQuant& q,
                                               const checkpoint::ModuleInfo& m, std::vector<std::string>& problems) {
  ContractBuilder b{m, {}};
  const int64_t n = m.out_features;
  const int64_t k = m.in_features;
  const bool modelopt = q.producer == quant::Producer::ModelOpt;
  const bool drop_inputs = !scheme_traits(scheme).quantizes_activations;
  switch (variant) {
    case Variant::Unquantized:
      if (m.dense_weight_in_out) {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{m.experts, k, n}}, "[E, K, N]");
      } else if (m.experts > 0) {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{m.experts, n, k}}, "[E, N, K]");
      } else {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{n, k}}, "[N, K]");
      }
      b.out.back().shared = m.tied;
      break;
    case Variant::Nvfp4W4A4:
    case Variant::Nvfp4W4A16: {
      const int64_t g = q.weights->group_size.value_or(16);
      check_divisible(m, g, "NVFP4", problems);
      b.add(m.tensor(modelopt ? "weight" : "weight_packed"), modelopt ? TensorRole::Weight : TensorRole::WeightPacked,
            {DType::U8}, {{n, k / 2}}, "[N, K/2]");
      b.add(m.tensor("weight_scale"), TensorRole::WeightScale, {DType::F8_E4M3}, {{n, k / g}}, fmt::format("[N, K/{}]", g));
      b.scalar(m.tensor(modelopt ? "weight_scale_2" : "weight_global_scale"), TensorRole::WeightGlobalScale, false);
      if (variant == Variant::Nvfp4W4A4) {
        b.scalar(m.tensor(modelopt ? "input_scale" : "input_global_scale"), TensorRole::InputGlobalScale, drop_inputs);
      }
      break;
    }
    case Variant::Mxfp4W4A4:
    case Variant::Mxfp4W4A16:
      check_divisible(m, 32, "MXFP4", problems);
      if (q.format == StorageFormat::GptOssMxfp4Blocks) {
        b.add(m.tensor("blocks"), TensorRole::WeightPacked, {DType::U8}, {{m.experts, n, k / 32, 16}}, "[E, N, K/32, 16]");
        b.add(m.tensor("scales"), TensorRole::WeightScale, {DType::U8, DType::F8_E8M0}, {{m.experts, n, k / 32}}, "[E, N, K/32]");
      } else {
        b.add(m.tensor(modelopt ? "weight" : "weight_packed"), TensorRole::WeightPacked, {DType::U8}, {{n, k / 2}}, "[N, K/2]");
        b.add(m.tensor("weight_scale"), TensorRole::WeightScale, {DType::U8, DType::F8_E8M0}, {{n, k / 32}}, "[N, K/32]");
      }
      break;
    case Variant::Int4W4A16: {
      const QuantArgs& w = *q.weights;
      const bool group = w.strategy == Strategy::Group;
      const int64_t g = group ? *w.group_size : k;
      if (group) check_divisible(m, g, "int4", problems);
      const int64_t cols = group ? k / g : 1;
      b.add(m.tensor("weight_packed"), TensorRole::WeightPacked, {DType::I32}, {{n, ceil_div(k, 8)}}, "[N, ceil(K/8)]");
      b.add(m.tensor("weight_scale"), TensorRole::WeightScale, kFloatTypes, {{n, cols}},
            group ? fmt::format("[N, K/{}]", g) : "[N, 1]");
      b.add(m.tensor("weight_shape"), TensorRole::WeightShape, {DType::I64, DType::I32}, {{2}}, "[2] = (N, K)");
      if (!w.symmetric) {
        b.add(m.tensor("weight_zero_point"), TensorRole::WeightZeroPoint, {DType::I32}, {{ceil_div(n, 8), cols}},
              group ? fmt::format("[ceil(N/8), K/{}]", g) : "[ceil(N/8), 1]");
      }
      if (w.actorder == quant::ActOrder::Group) b.add(m.tensor("weight_g_idx"), TensorRole::WeightGIdx, {DType::I32}, {{k}}, "[K]");
      break;
    }
    case Variant::Fp8W8A8:
    case Variant::Fp8W8A16: {
      const QuantArgs& w = *q.weights;
      b.add(m.tensor("weight"), TensorRole::Weight, {DType::F8_E4M3}, {{n, k}}, "[N, K]");
      const std::vector<DType> scale_types = modelopt ? std::vector<DType>{DType::F32} : kFloatTypes;
      switch (w.strategy) {
        case Strategy::Tensor:
          b.scalar(m.tensor("weight_scale"), TensorRole::WeightScale, false, scale_types);
          break;
        case Strategy::Channel:
          b.add(m.tensor("weight_scale"), TensorRole::WeightScale, scale_types, {{n, 1}, {n}}, "[N, 1] or [N]");
          break;
        case Strategy::Block: {
          const auto [bh, bw] = *w.block;
          b.add(m.tensor("weight_scale"), TensorRole::WeightScale, scale_types, {{ceil_div(n, bh), ceil_div(k, bw)}},
                fmt::format("[ceil(N/{}), ceil(K/{})]", bh, bw));
          break;
        }
        case Strategy::Group:
        case Strategy::TensorGroup:
        case Strategy::Token:
        case Strategy::AttnHead:
          break;  // excluded by is_fp8_weights
      }
      const bool static_input = q.input && q.input->strategy == Strategy::Tensor && q.input->dynamic == Dynamic::Static;
      if (variant == Variant::Fp8W8A8 && static_input) {
        b.scalar(m.tensor("input_scale"), TensorRole::InputScale, drop_inputs, scale_types);
      }
      break;
    }
  }
  if (m.has_bias) {
    if (m.experts > 0) {
      b.add(m.tensor("bias"), TensorRole::Bias, kFloatTypes, {{m.experts, n}}, "[E, N]");
    } else {
      b.add(m.tensor("bias"), TensorRole::Bias, kFloatTypes, {{n}}, "[N]");
    }
  }
  for (const quant::TransformUse& t : q.transforms) {
    // compressed-tensors `get_transform_size`: a Linear's input side is K and output side N; an Embedding's input
    // side is its vocabulary (our N) and output side its width (our K). head_dim must divide that side.
    const bool embedding = m.role == checkpoint::ModuleRole::Embedding;
    const bool input_side = t.location == "input" || t.location == "weight_input";
    const int64_t side = input_side != embedding ? k : n;
    if (t.head_dim && (*t.head_dim < 1 || side % *t.head_dim != 0)) {
      problems.push_back(fmt::format("transform group {} at `{}` on {}: head_dim {} does not divide the transformed width {}",
                                     t.group, t.location, m.name, *t.head_dim, side));
      continue;
    }
    if (!t.online) continue;  // weight_input / weight_output are already folded into the stored weight: validated only
    const int64_t size = t.head_dim ? *t.head_dim : side;
    const std::string base = fmt::format("{}.{}_{}", m.name, t.group, t.location);
    // compressed-tensors stores the matrix in the scheme's `precision`, float64 by default for QuIP.
    b.add(base + ".weight", TensorRole::TransformMatrix, {DType::BF16, DType::F16, DType::F32, DType::F64},
          {{size, size}}, "[n, n]");
    if (t.randomize) b.add(base + ".perm", TensorRole::TransformPerm, {DType::I64, DType::I32}, {{size}}, "[n]");
  }
  return std::move(b.out);
}

}  // namespace fp4serve::plan
