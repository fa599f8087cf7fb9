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

using quant::BlockFormat;
constexpr std::optional<BlockFormat> kNoBlock = std::nullopt;
constexpr std::optional<BlockFormat> kNvfp4 = BlockFormat::Nvfp4;
constexpr std::optional<BlockFormat> kMxfp4 = BlockFormat::Mxfp4;

constexpr std::array<SchemeTraits, 10> kSchemes{{
    {SchemeId::W4A4Nvfp4, "W4A4_NVFP4", WeightKind::Block, kNvfp4, ActivationMode::Native, true},
    {SchemeId::W4A16Nvfp4, "W4A16_NVFP4", WeightKind::Block, kNvfp4, ActivationMode::None, false},
    {SchemeId::W4A4Nvfp4Emulated, "W4A4_NVFP4_EMULATED", WeightKind::Block, kNvfp4, ActivationMode::Emulated, true},
    {SchemeId::W4A4Mxfp4, "W4A4_MXFP4", WeightKind::Block, kMxfp4, ActivationMode::Native, true},
    {SchemeId::W4A4Mxfp4Emulated, "W4A4_MXFP4_EMULATED", WeightKind::Block, kMxfp4, ActivationMode::Emulated, true},
    {SchemeId::W4A16Mxfp4, "W4A16_MXFP4", WeightKind::Block, kMxfp4, ActivationMode::None, false},
    {SchemeId::W4A16Int4, "W4A16_INT4", WeightKind::Int4, kNoBlock, ActivationMode::None, false},
    {SchemeId::W8A8Fp8, "W8A8_FP8", WeightKind::Fp8, kNoBlock, ActivationMode::Native, true},
    {SchemeId::W8A16Fp8, "W8A16_FP8", WeightKind::Fp8, kNoBlock, ActivationMode::None, false},
    {SchemeId::Unquantized, "UNQUANTIZED", WeightKind::Unquantized, kNoBlock, ActivationMode::None, false},
}};

constexpr std::array<VariantTraits, 8> kVariants{{
    {Variant::Unquantized, "unquantized", WeightKind::Unquantized, kNoBlock, false},
    {Variant::Nvfp4W4A4, "NVFP4 W4A4", WeightKind::Block, kNvfp4, true},
    {Variant::Nvfp4W4A16, "NVFP4 W4A16", WeightKind::Block, kNvfp4, false},
    {Variant::Mxfp4W4A4, "MXFP4 W4A4", WeightKind::Block, kMxfp4, true},
    {Variant::Mxfp4W4A16, "MXFP4 W4A16", WeightKind::Block, kMxfp4, false},
    {Variant::Int4W4A16, "INT4 W4A16", WeightKind::Int4, kNoBlock, false},
    {Variant::Fp8W8A8, "FP8 W8A8", WeightKind::Fp8, kNoBlock, true},
    {Variant::Fp8W8A16, "FP8 W8A16", WeightKind::Fp8, kNoBlock, false},
}};

static_assert([] {
  for (size_t i = 0; i < kSchemes.size(); ++i) {
    const SchemeTraits& t = kSchemes[i];
    if (static_cast<size_t>(t.id) != i || t.block.has_value() != (t.weights == WeightKind::Block) ||
        t.quantizes_activations != (t.activations != ActivationMode::None)) {
      return false;
    }
  }
  for (size_t i = 0; i < kVariants.size(); ++i) {
    if (static_cast<size_t>(kVariants[i].id) != i || kVariants[i].block.has_value() != (kVariants[i].weights == WeightKind::Block)) {
      return false;
    }
  }
  return true;
}(), "scheme and variant rows follow their enums; `block` is set exactly for block formats");

// --- rule 1 predicates: every distinguishing field -------------------------------------------------------------

bool scale_dtype_or_unset(ScaleDtype s, ScaleDtype expected) { return s == ScaleDtype::Unspecified || s == expected; }

// A block format's weights (static scales) or W4A4 activations (the row's `dynamic`), as its row describes them.
bool is_block_weights(const QuantArgs& w, const quant::BlockFormatTraits& f) {
  return w.type == QuantType::Float && w.num_bits == quant::format_traits(f.element).bits && w.strategy == f.strategy &&
         w.group_size == f.group_size && w.symmetric && w.dynamic == Dynamic::Static &&
         scale_dtype_or_unset(w.scale_dtype, f.scale_dtype);
}
bool is_block_input(const QuantArgs& a, const quant::BlockFormatTraits& f) {
  return a.type == QuantType::Float && a.num_bits == quant::format_traits(f.element).bits && a.strategy == f.strategy &&
         a.group_size == f.group_size && a.symmetric && a.dynamic == f.input_dynamic &&
         scale_dtype_or_unset(a.scale_dtype, f.scale_dtype);
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

// "float4 tensor_group group_size=16 dynamic=local" as a refusal names the activations a format needs.
std::string block_input_description(const quant::BlockFormatTraits& f) {
  return fmt::format("float4 {} group_size={} dynamic={}", quant::strategy_name(f.strategy), f.group_size,
                     f.input_dynamic == Dynamic::Local ? "local" : "true");
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

const VariantTraits& variant_traits(Variant v) { return kVariants[static_cast<size_t>(v)]; }
std::string_view variant_name(Variant v) { return variant_traits(v).name; }
bool variant_has_activation_quant(Variant v) { return variant_traits(v).activations; }

Variant find_variant(WeightKind kind, std::optional<quant::BlockFormat> block, bool activations) {
  for (const VariantTraits& t : kVariants) {
    if (t.weights == kind && t.block == block && t.activations == activations) return t.id;
  }
  throw UnsupportedError(fmt::format("no variant row for weight kind {} format {} activations {}", static_cast<int>(kind),
                                  block ? quant::block_format_name(*block) : "none", activations));
}

std::optional<SchemeId> find_scheme(WeightKind kind, std::optional<quant::BlockFormat> block, ActivationMode activations) {
  for (const SchemeTraits& t : kSchemes) {
    if (t.weights == kind && t.block == block && t.activations == activations) return t.id;
  }
  return std::nullopt;
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
  for (const quant::BlockFormatTraits& f : quant::kBlockFormats) {
    if (!is_block_weights(w, f)) continue;
    if (quant::block_format_of(q.format) != f.format) {
      refuse(q, m, fmt::format("the arguments describe {} weights but the storage format is '{}'", f.name,
                               quant::storage_format_name(q.format)));
    }
    if (a != nullptr && !is_block_input(*a, f)) {
      refuse(q, m, fmt::format("{} weights need {} activations ({}) or none", f.name, f.name, block_input_description(f)));
    }
    return find_variant(WeightKind::Block, f.format, a != nullptr);
  }
  if (w.type == QuantType::Float && w.num_bits == 4) {
    std::string formats;
    for (const quant::BlockFormatTraits& f : quant::kBlockFormats) {
      formats += fmt::format("{}{} ({}, group_size {}, {} scales, symmetric, static)", formats.empty() ? "" : " nor ",
                             f.name, quant::strategy_name(f.strategy), f.group_size, quant::format_traits(f.scale).name);
    }
    refuse(q, m, "4-bit float weights match neither " + formats);
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

std::optional<quant::GlobalScaleConvention> global_scale_convention(Variant v, const quant::LayerQuant& q) {
  const VariantTraits& t = variant_traits(v);
  if (!t.block || !quant::block_format_traits(*t.block).global_scale) return std::nullopt;
  return quant::global_scale_convention_of(q.producer);
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
  const VariantTraits& v = variant_traits(variant);
  switch (v.weights) {
    case WeightKind::Unquantized:
      if (m.dense_weight_in_out) {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{m.experts, k, n}}, "[E, K, N]");
      } else if (m.experts > 0) {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{m.experts, n, k}}, "[E, N, K]");
      } else {
        b.add(m.dense_weight, TensorRole::Weight, kFloatTypes, {{n, k}}, "[N, K]");
      }
      b.out.back().shared = m.tied;
      break;
    case WeightKind::Block: {
      const quant::BlockFormatTraits& f = quant::block_format_traits(*v.block);
      const int64_t g = f.group_size;
      const std::vector<DType> scale_dtypes(f.scale_dtypes.begin(), f.scale_dtypes.end());
      check_divisible(m, g, f.name, problems);
      if (q.format == StorageFormat::GptOssMxfp4Blocks) {
        b.add(m.tensor("blocks"), TensorRole::WeightPacked, {DType::U8}, {{m.experts, n, k / g, f.packed_bytes_per_group()}},
              fmt::format("[E, N, K/{}, {}]", g, f.packed_bytes_per_group()));
        b.add(m.tensor("scales"), TensorRole::WeightScale, scale_dtypes, {{m.experts, n, k / g}}, fmt::format("[E, N, K/{}]", g));
        break;
      }
      b.add(m.tensor(modelopt ? "weight" : "weight_packed"), modelopt ? TensorRole::Weight : TensorRole::WeightPacked, {DType::U8}, {{n, k / 2}}, "[N, K/2]");
      b.add(m.tensor("weight_scale"), TensorRole::WeightScale, scale_dtypes, {{n, k / g}}, fmt::format("[N, K/{}]", g));
      if (f.global_scale) {
        b.scalar(m.tensor(modelopt ? "weight_scale_2" : "weight_global_scale"), TensorRole::WeightGlobalScale, false);
        // MXFP4 activation scales are dynamic: only formats with a global scale store one for the input.
        if (v.activations) {
          b.scalar(m.tensor(modelopt ? "input_scale" : "input_global_scale"), TensorRole::InputGlobalScale, drop_inputs);
        }
      }
      break;
    }
    case WeightKind::Int4: {
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
    case WeightKind::Fp8: {
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
      if (v.activations && static_input) {
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
