// SPDX-License-Identifier: Apache-2.0
#include "quant/linear_weights.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "fp4serve/error.h"

namespace fp4serve::quant {

const char* weight_encoding_name(WeightEncoding encoding) {
  switch (encoding) {
    case WeightEncoding::Fp4: return "FP4";
    case WeightEncoding::Int4: return "INT4";
    case WeightEncoding::Fp8: return "FP8";
    case WeightEncoding::Dense: return "dense";
  }
  return "?";
}

int64_t LinearWeights::out_features() const {
  int64_t n = 0;
  for (const WeightRows& r : rows) n += r.out_features();
  return n;
}

core::TensorView LinearWeights::keep(std::vector<std::byte> bytes, core::DType dtype, std::vector<int64_t> shape) {
  auto held = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  core::TensorView view{dtype, std::move(shape), std::span<const std::byte>(held->data(), held->size())};
  owned.push_back(std::move(held));
  return view;
}

LinearWeights dense_weights(std::vector<float> values, int64_t out_features, int64_t in_features, std::string name) {
  if (out_features <= 0 || in_features <= 0 || values.size() != static_cast<size_t>(out_features * in_features)) {
    throw UsageError(fmt::format("dense_weights {}: {} values for [{}, {}]", name, values.size(), out_features,
                                 in_features));
  }
  LinearWeights w;
  w.encoding = WeightEncoding::Dense;
  w.in_features = in_features;
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  WeightRows r;
  r.name = std::move(name);
  r.weight = w.keep(std::move(bytes), core::DType::F32, {out_features, in_features});
  w.rows.push_back(std::move(r));
  return w;
}

LinearWeights dense_view_weights(const core::TensorView& weight, std::string name, const core::TensorView* bias) {
  LinearWeights w;
  w.encoding = WeightEncoding::Dense;
  w.in_features = check_dense_rows(weight, name);
  WeightRows r;
  r.name = std::move(name);
  r.weight = weight;
  if (bias != nullptr) {
    r.bias = *bias;
    r.has_bias = true;
  }
  w.rows.push_back(std::move(r));
  return w;
}

LinearWeights fp4_view_weights(BlockFormat format, const core::TensorView& weight_packed,
                               const core::TensorView& weight_scale, float global_scale,
                               GlobalScaleConvention convention, std::string name) {
  LinearWeights w;
  w.encoding = WeightEncoding::Fp4;
  w.block_format = format;
  w.convention = convention;
  const bool global = block_format_traits(format).global_scale;
  w.in_features = check_fp4_rows(format, weight_packed, weight_scale, global ? global_scale : 0.f, convention, name);
  WeightRows r;
  r.name = std::move(name);
  r.weight = weight_packed;
  r.weight_scale = weight_scale;
  r.global_scale = global ? global_scale : 0.f;
  w.rows.push_back(std::move(r));
  return w;
}

float input_global_scale_divisor(float value, GlobalScaleConvention convention) {
  if (!std::isfinite(value) || value <= 0.f) {
    throw FormatError(fmt::format("{} is {}, expected a finite value > 0",
                                  convention == GlobalScaleConvention::Divisor ? "input_global_scale" : "input_scale",
                                  value));
  }
  return convention == GlobalScaleConvention::Divisor ? value : 1.f / value;
}

void set_input_global_scale(LinearWeights& w, float value, GlobalScaleConvention convention) {
  w.input_global_scale = input_global_scale_divisor(value, convention);
}

LinearWeights stack_rows(std::vector<LinearWeights> parts) {
  if (parts.empty()) throw UsageError("stack_rows: no parts");
  LinearWeights out = std::move(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    LinearWeights& p = parts[i];
    if (p.encoding != out.encoding || p.block_format != out.block_format || p.in_features != out.in_features ||
        p.group_size != out.group_size || p.fp8_block != out.fp8_block || p.requant != out.requant ||
        p.convention != out.convention) {
      throw UsageError(fmt::format(
          "stack_rows: part {} ({}, K = {}, group {}) does not match part 0 ({}, K = {}, group {}) in encoding, format, "
          "K, group size, FP8 block, requant or global-scale convention",
          i, weight_encoding_name(p.encoding), p.in_features, p.group_size, weight_encoding_name(out.encoding),
          out.in_features, out.group_size));
    }
    if (p.input_global_scale != out.input_global_scale) {
      throw FormatError(fmt::format("stack_rows: part {} has input_global_scale {} but part 0 has {}; fused layers "
                                    "quantize one activation and must share it",
                                    i, p.input_global_scale, out.input_global_scale));
    }
    for (WeightRows& r : p.rows) out.rows.push_back(std::move(r));
    for (auto& o : p.owned) out.owned.push_back(std::move(o));
  }
  return out;
}

void fail_tensor(std::string_view name, std::string_view role, const std::string& message) {
  throw FormatError(fmt::format("{}: {} {}", name, role, message));
}

void check_tensor_dtype(const core::TensorView& t, std::span<const core::DType> allowed, std::string_view name,
                        std::string_view role) {
  bool ok = false;
  std::string expected;
  for (core::DType d : allowed) {
    ok = ok || d == t.dtype;
    if (!expected.empty()) expected += " or ";
    expected += core::dtype_name(d);
  }
  if (!ok) fail_tensor(name, role, fmt::format("has dtype {}, expected {}", core::dtype_name(t.dtype), expected));
  for (int64_t d : t.shape) {
    if (d < 0) {
      fail_tensor(name, role, fmt::format("has a negative dimension in shape {}", core::shape_to_string(t.shape)));
    }
  }
  const auto bits = static_cast<uint64_t>(core::dtype_bits(t.dtype));
  const uint64_t need = (static_cast<uint64_t>(t.numel()) * bits + 7) / 8;
  if (t.bytes.size() != need) {
    fail_tensor(name, role, fmt::format("holds {} bytes, expected {} for shape {}", t.bytes.size(), need,
                                        core::shape_to_string(t.shape)));
  }
}

void check_tensor_shape(const core::TensorView& t, const std::vector<int64_t>& expected, std::string_view name,
                        std::string_view role) {
  if (t.shape != expected) {
    fail_tensor(name, role, fmt::format("has shape {}, expected {}", core::shape_to_string(t.shape),
                                        core::shape_to_string(expected)));
  }
}

int64_t check_fp4_rows(BlockFormat format, const core::TensorView& weight_packed, const core::TensorView& weight_scale,
                       float global_scale, GlobalScaleConvention convention, std::string_view name) {
  const BlockFormatTraits& f = block_format_traits(format);
  const int64_t g = f.group_size;
  const core::DType packed_dtype[] = {core::DType::U8};
  check_tensor_dtype(weight_packed, packed_dtype, name, "packed FP4 weight");
  if (weight_packed.shape.size() != 2 || weight_packed.shape[0] == 0 || weight_packed.shape[1] == 0) {
    fail_tensor(name, "packed FP4 weight",
                fmt::format("has shape {}, expected [N, K/2] with N, K > 0", core::shape_to_string(weight_packed.shape)));
  }
  const int64_t n = weight_packed.shape[0];
  const int64_t k = weight_packed.shape[1] * 2;
  if (k % g != 0) {
    fail_tensor(name, "packed FP4 weight",
                fmt::format("has K = {} (shape {}), which is not a multiple of the scale group size {}", k,
                            core::shape_to_string(weight_packed.shape), g));
  }
  check_tensor_dtype(weight_scale, f.scale_dtypes, name, "block scale");
  check_tensor_shape(weight_scale, {n, k / g}, name, "block scale");
  if (f.global_scale && (!std::isfinite(global_scale) || global_scale <= 0.f)) {
    const char* role = convention == GlobalScaleConvention::Divisor ? "weight_global_scale" : "weight_scale_2";
    fail_tensor(name, role, fmt::format("is {}, expected a finite value > 0", global_scale));
  }
  // E4M3 has NaN codes (0x7F/0xFF), which no reference produces; E8M0's 255 decodes to +inf as in the references.
  if (f.scale == ElementFormat::E4M3) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(weight_scale.bytes.data());
    for (size_t i = 0; i < weight_scale.bytes.size(); ++i) {
      if ((bytes[i] & 0x7F) == 0x7F) {
        fail_tensor(name, "block scale",
                    fmt::format("[{}, {}] is NaN (E4M3 byte 0x{:02X})", static_cast<int64_t>(i) / (k / g),
                                static_cast<int64_t>(i) % (k / g), bytes[i]));
      }
    }
  }
  return k;
}

int64_t check_dense_rows(const core::TensorView& weight, std::string_view name) {
  const core::DType dtypes[] = {core::DType::BF16, core::DType::F16, core::DType::F32};
  check_tensor_dtype(weight, dtypes, name, "weight");
  if (weight.shape.size() != 2 || weight.shape[0] == 0 || weight.shape[1] == 0) {
    fail_tensor(name, "weight",
                fmt::format("has shape {}, expected [N, K] with N, K > 0", core::shape_to_string(weight.shape)));
  }
  return weight.shape[1];
}

}  // namespace fp4serve::quant
