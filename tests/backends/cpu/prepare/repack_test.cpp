// SPDX-License-Identifier: Apache-2.0
// Repack: every layout dequantizes back to the float64 reference written in checkpoint_tensors.h (NVFP4 bit
// for bit against the producers' bf16 op order), stays within the bits/weight budget, fuses rows with their
// own global scales, and rejects malformed tensors with a message naming the layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "fp4serve/error.h"
#include "quant/checkpoint_tensors.h"
#include "backends/cpu/prepare/repack.h"
#include "quant/linear_weights.h"

namespace fp4serve::prepare {
namespace {

using testing::Layer;
using testing::OwnedTensor;

#define EXPECT_THROW_WITH(statement, Type, substring)                                      \
  do {                                                                                     \
    try {                                                                                  \
      statement;                                                                           \
      ADD_FAILURE() << "no exception from " #statement;                                    \
    } catch (const Type& e) {                                                              \
      EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();     \
    }                                                                                      \
  } while (0)

constexpr const char* kName = "model.layers.3.mlp.up_proj";

std::vector<float> dequant(const PreparedLinear& w) {
  std::vector<float> out(static_cast<size_t>(w.out_features * w.in_features), std::numeric_limits<float>::quiet_NaN());
  kernels::dequantize(w, out.data());
  return out;
}

// compressed-tensors NVFP4PackedCompressor.decompress: bf16(q · (s / gs)), the division in fp32.
TEST(RepackNvfp4, DequantizeMatchesCompressedTensorsBf16BitForBit) {
  std::mt19937 rng(11);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 16}, {13, 48}, {37, 160}}) {
    const Layer l = testing::make_nvfp4(rng, n, k, /*divisor=*/true);
    const PreparedLinear w = prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale, GlobalScaleConvention::Divisor, kName);
    const auto out = dequant(w);
    const auto* codes = reinterpret_cast<const uint8_t*>(l.weight.data.data());
    const auto* scales = reinterpret_cast<const uint8_t*>(l.scale.data.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = codes[r * k / 2 + c / 2];
        const auto q = static_cast<float>(testing::e2m1_value(c % 2 == 0 ? byte & 0xF : byte >> 4));
        const auto s = static_cast<float>(testing::e4m3_value(scales[r * k / 16 + c / 16]));
        const float t = s / l.global_scale;
        ASSERT_EQ(testing::bf16_rne(out[static_cast<size_t>(r * k + c)]), testing::bf16_rne(q * t)) << r << "," << c;
      }
    }
  }
}

// ModelOpt NVFP4QTensor.dequantize: per_block = s · weight_scale_2 in fp32, then times q.
TEST(RepackNvfp4, DequantizeMatchesModelOptMultiplierOrder) {
  std::mt19937 rng(12);
  const Layer l = testing::make_nvfp4(rng, 9, 64, /*divisor=*/false);
  const PreparedLinear w = prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale, GlobalScaleConvention::Multiplier, kName);
  const auto out = dequant(w);
  const auto* codes = reinterpret_cast<const uint8_t*>(l.weight.data.data());
  const auto* scales = reinterpret_cast<const uint8_t*>(l.scale.data.data());
  for (int64_t r = 0; r < 9; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      const uint8_t byte = codes[r * 32 + c / 2];
      const auto q = static_cast<float>(testing::e2m1_value(c % 2 == 0 ? byte & 0xF : byte >> 4));
      const float per_block = static_cast<float>(testing::e4m3_value(scales[r * 4 + c / 16])) * l.global_scale;
      ASSERT_EQ(out[static_cast<size_t>(r * 64 + c)], q * per_block);
    }
  }
}

void expect_exact(const PreparedLinear& w, const Layer& l) {
  const auto out = dequant(w);
  ASSERT_EQ(out.size(), l.w.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(static_cast<double>(out[i]), l.w[i]) << "element " << i;
}

TEST(RepackMxfp4, DequantizeIsExact) {
  std::mt19937 rng(13);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {19, 96}}) {
    const Layer l = testing::make_mxfp4(rng, n, k);
    expect_exact(prepare_mxfp4(l.weight.view(), l.scale.view(), kName), l);
  }
}

TEST(RepackInt4, DequantizeIsExactForEveryVariant) {
  std::mt19937 rng(14);
  for (bool asym : {false, true}) {
    for (bool actorder : {false, true}) {
      for (int64_t group : {int64_t{32}, int64_t{-1}}) {
        if (actorder && group == -1) continue;
        SCOPED_TRACE(::testing::Message() << "asym " << asym << " actorder " << actorder << " group " << group);
        const Layer l = testing::make_int4(rng, 21, 96, group, asym, actorder);
        const core::TensorView zp = l.zero_point.view(), gi = l.g_idx.view();
        const PreparedLinear w = prepare_int4(l.weight.view(), l.scale.view(), asym ? &zp : nullptr,
                                              actorder ? &gi : nullptr, 96, group, kName);
        EXPECT_EQ(w.k_perm.empty(), !actorder);
        expect_exact(w, l);
      }
    }
  }
}

// clone() copies every field into new buffers. The bench's hand-written copy dropped block_format, so an MXFP4
// copy read as NVFP4 (E4M3 scales, groups of 16) and its rows ran the wrong kernel.
TEST(PreparedLinearClone, KeepsEveryFieldInNewBuffers) {
  std::mt19937 rng(15);
  const Layer mx = testing::make_mxfp4(rng, 19, 96);
  const Layer nv = testing::make_nvfp4(rng, 13, 48, /*divisor=*/false);
  const Layer i4 = testing::make_int4(rng, 21, 96, 32, /*asym=*/true, /*actorder=*/true);
  const core::TensorView zp = i4.zero_point.view(), gi = i4.g_idx.view();
  std::vector<std::pair<const Layer*, PreparedLinear>> cases;
  cases.emplace_back(&mx, prepare_mxfp4(mx.weight.view(), mx.scale.view(), kName));
  cases.emplace_back(&nv, prepare_nvfp4(nv.weight.view(), nv.scale.view(), nv.global_scale,
                                        GlobalScaleConvention::Multiplier, kName));
  cases.emplace_back(&i4, prepare_int4(i4.weight.view(), i4.scale.view(), &zp, &gi, 96, 32, kName));
  for (auto& [layer, w] : cases) {
    SCOPED_TRACE(format_label(w));
    w.bias.assign(static_cast<size_t>(w.out_features), 0.25f);
    w.activation_precision = ActivationPrecision::Int8Decode;
    w.input_global_scale = 3.f;
    const PreparedLinear c = w.clone();
    EXPECT_EQ(c.layout, w.layout);
    EXPECT_EQ(c.block_format, w.block_format);
    EXPECT_EQ(c.out_features, w.out_features);
    EXPECT_EQ(c.in_features, w.in_features);
    EXPECT_EQ(c.bias, w.bias);
    EXPECT_EQ(c.input_global_scale, w.input_global_scale);
    EXPECT_EQ(c.padded_rows, w.padded_rows);
    EXPECT_EQ(c.group_size, w.group_size);
    EXPECT_EQ(c.global_scale, w.global_scale);
    EXPECT_EQ(c.convention, w.convention);
    EXPECT_EQ(c.k_perm, w.k_perm);
    EXPECT_EQ(c.dense_storage, w.dense_storage);
    EXPECT_EQ(c.activation_precision, w.activation_precision);
    for (auto [a, b] : {std::pair{&w.codes, &c.codes}, {&w.scales, &c.scales}, {&w.offsets, &c.offsets}}) {
      ASSERT_EQ(a->size(), b->size());
      if (a->size() == 0) continue;
      EXPECT_NE(a->data(), b->data());
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size()), 0);
    }
    EXPECT_EQ(dequant(c), dequant(w));
    if (layer != &nv) expect_exact(c, *layer);  // NVFP4 · global scale rounds in fp32: only the line above
  }
}

TEST(RepackFp8, DequantizeIsExactForTensorChannelAndBlockScales) {
  std::mt19937 rng(15);
  const Layer t = testing::make_fp8(rng, 11, 40, 0);
  expect_exact(prepare_fp8(t.weight.view(), t.scale.view(), {0, 0}, kName), t);
  const Layer c = testing::make_fp8(rng, 11, 40, 1);
  expect_exact(prepare_fp8(c.weight.view(), c.scale.view(), {0, 0}, kName), c);
  const Layer b = testing::make_fp8(rng, 20, 40, 2, 8, 16);  // ragged edges: 20 = 2.5 blocks, 40 = 2.5 blocks
  expect_exact(prepare_fp8(b.weight.view(), b.scale.view(), {8, 16}, kName), b);
}

TEST(RepackDense, DequantizeIsExactForBf16F16F32) {
  std::mt19937 rng(16);
  for (core::DType d : {core::DType::BF16, core::DType::F16, core::DType::F32}) {
    const Layer l = testing::make_dense(rng, 10, 7, d);
    expect_exact(prepare_dense(l.weight.view(), kName), l);
  }
}

TEST(RepackBudget, Fp4LayoutsStayWithinTheirBitsPerWeight) {
  std::mt19937 rng(17);
  const int64_t n = 64, k = 512;
  const Layer nv = testing::make_nvfp4(rng, n, k, true);
  const PreparedLinear w = prepare_nvfp4(nv.weight.view(), nv.scale.view(), nv.global_scale, GlobalScaleConvention::Divisor, kName);
  EXPECT_LE(weight_bytes(w), static_cast<size_t>(n * k * 4.5 / 8 + 4 * n));
  const Layer mx = testing::make_mxfp4(rng, n, k);
  EXPECT_LE(weight_bytes(prepare_mxfp4(mx.weight.view(), mx.scale.view(), kName)), static_cast<size_t>(n * k * 4.25 / 8));
}

TEST(RepackConcat, FusedRowsKeepTheirOwnGlobalScalesAndBias) {
  std::mt19937 rng(18);
  const Layer a = testing::make_nvfp4(rng, 16, 48, true);
  const Layer b = testing::make_nvfp4(rng, 5, 48, true);
  ASSERT_NE(a.global_scale, b.global_scale);
  std::vector<PreparedLinear> parts;
  parts.push_back(prepare_nvfp4(a.weight.view(), a.scale.view(), a.global_scale, GlobalScaleConvention::Divisor, "q"));
  parts.push_back(prepare_nvfp4(b.weight.view(), b.scale.view(), b.global_scale, GlobalScaleConvention::Divisor, "k"));
  const std::vector<uint16_t> bias_bits = {testing::bf16_rne(0.5f), testing::bf16_rne(-1.25f), testing::bf16_rne(3.f),
                                           testing::bf16_rne(0.125f), testing::bf16_rne(-7.f)};
  const OwnedTensor bias = OwnedTensor::from(core::DType::BF16, {5}, bias_bits);
  attach_bias(parts[1], bias.view(), "k");
  const auto da = dequant(parts[0]);
  const auto db = dequant(parts[1]);
  const PreparedLinear fused = concat_rows(std::move(parts));
  ASSERT_EQ(fused.out_features, 21);
  const auto df = dequant(fused);
  for (size_t i = 0; i < da.size(); ++i) ASSERT_EQ(df[i], da[i]);
  for (size_t i = 0; i < db.size(); ++i) ASSERT_EQ(df[da.size() + i], db[i]);
  ASSERT_EQ(fused.bias.size(), 21u);
  EXPECT_EQ(fused.bias[0], 0.f);
  EXPECT_EQ(fused.bias[16 + 2], 3.f);
}

// Fp4 and Int4 store tiles in pairs (prepared_linear.h): parts of 8, 24 and 13 rows (1, 3 and 2 tiles) start and
// end inside pairs, so their tiles move one at a time. The fused weights dequantize to the parts', and every
// kernel reading the fused pairs gives the parts' outputs (the same sums in the same order: equal bits).
TEST(RepackConcat, PartsThatEndInsideATilePairKeepTheirRows) {
  std::mt19937 rng(21);
  const int64_t k = 96;
  const int64_t rows[] = {8, 24, 13};
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "NVFP4" : variant == 1 ? "MXFP4" : "int4");
    std::vector<PreparedLinear> parts;
    for (int64_t n : rows) {
      if (variant == 0) {
        const Layer l = testing::make_nvfp4(rng, n, k, true);
        parts.push_back(prepare_nvfp4(l.weight.view(), l.scale.view(), l.global_scale, GlobalScaleConvention::Divisor, "p"));
      } else if (variant == 1) {
        const Layer l = testing::make_mxfp4(rng, n, k);
        parts.push_back(prepare_mxfp4(l.weight.view(), l.scale.view(), "p"));
      } else {
        const Layer l = testing::make_int4(rng, n, k, 32, true, false);
        const core::TensorView zp = l.zero_point.view();
        parts.push_back(prepare_int4(l.weight.view(), l.scale.view(), &zp, nullptr, k, 32, "p"));
      }
    }
    std::vector<std::vector<float>> expected;
    std::vector<float> x(static_cast<size_t>(2 * k));
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& v : x) v = normal(rng);
    std::vector<std::vector<float>> y_parts;
    for (const PreparedLinear& p : parts) {
      expected.push_back(dequant(p));
      y_parts.emplace_back(static_cast<size_t>(2 * p.out_features));
      kernels::linear(p, x.data(), 2, y_parts.back().data());
    }
    const PreparedLinear fused = concat_rows(std::move(parts));
    ASSERT_EQ(fused.out_features, 45);
    ASSERT_EQ(fused.padded_rows, 48);
    const auto got = dequant(fused);
    std::vector<float> y(static_cast<size_t>(2 * 45));
    kernels::linear(fused, x.data(), 2, y.data());
    int64_t row0 = 0;
    for (size_t p = 0; p < expected.size(); ++p) {
      const int64_t n = rows[p];
      for (int64_t i = 0; i < n * k; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(row0 * k + i)], expected[p][static_cast<size_t>(i)]) << "part " << p << " element " << i;
      }
      for (int64_t m = 0; m < 2; ++m) {
        for (int64_t r = 0; r < n; ++r) {
          ASSERT_EQ(y[static_cast<size_t>(m * 45 + row0 + r)], y_parts[p][static_cast<size_t>(m * n + r)])
              << "part " << p << " x row " << m << " output row " << r;
        }
      }
      row0 += n;
    }
  }
}

TEST(RepackConcat, RejectsDifferentInputGlobalScales) {
  std::mt19937 rng(19);
  const Layer a = testing::make_nvfp4(rng, 8, 32, true);
  std::vector<PreparedLinear> parts;
  for (float igs : {100.f, 200.f}) {
    parts.push_back(prepare_nvfp4(a.weight.view(), a.scale.view(), a.global_scale, GlobalScaleConvention::Divisor, kName));
    set_input_global_scale(parts.back(), igs, GlobalScaleConvention::Divisor);
  }
  EXPECT_THROW_WITH(concat_rows(std::move(parts)), FormatError, "input_global_scale");
}

TEST(RepackConcat, RejectsMismatchedLayouts) {
  std::mt19937 rng(20);
  const Layer a = testing::make_nvfp4(rng, 8, 32, true);
  const Layer b = testing::make_mxfp4(rng, 8, 32);
  std::vector<PreparedLinear> parts;
  parts.push_back(prepare_nvfp4(a.weight.view(), a.scale.view(), a.global_scale, GlobalScaleConvention::Divisor, kName));
  parts.push_back(prepare_mxfp4(b.weight.view(), b.scale.view(), kName));
  EXPECT_THROW_WITH(concat_rows(std::move(parts)), UsageError, "does not match");
  EXPECT_THROW_WITH(concat_rows({}), UsageError, "no parts");
}

TEST(RepackInputScale, MultiplierIsStoredAsItsReciprocalAndBadValuesAreRejected) {
  std::mt19937 rng(21);
  const Layer a = testing::make_nvfp4(rng, 8, 32, false);
  PreparedLinear w = prepare_nvfp4(a.weight.view(), a.scale.view(), a.global_scale, GlobalScaleConvention::Multiplier, kName);
  set_input_global_scale(w, 0.25f, GlobalScaleConvention::Multiplier);
  EXPECT_EQ(w.input_global_scale, 4.f);
  EXPECT_THROW_WITH(set_input_global_scale(w, 0.f, GlobalScaleConvention::Divisor), FormatError, "input_global_scale");
  EXPECT_THROW_WITH(set_input_global_scale(w, std::numeric_limits<float>::infinity(), GlobalScaleConvention::Multiplier),
                    FormatError, "input_scale");
}

// ---- malformed tensors ----------------------------------------------------------------------------------

class RepackErrors : public ::testing::Test {
 protected:
  std::mt19937 rng_{22};
  Layer nv_ = testing::make_nvfp4(rng_, 4, 32, true);
  Layer mx_ = testing::make_mxfp4(rng_, 4, 64);
};

TEST_F(RepackErrors, Nvfp4WrongPackedDtype) {
  OwnedTensor bad = nv_.weight;
  bad.dtype = core::DType::I8;
  EXPECT_THROW_WITH(prepare_nvfp4(bad.view(), nv_.scale.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    std::string(kName) + ": packed FP4 weight has dtype I8, expected U8");
}

TEST_F(RepackErrors, Nvfp4WrongScaleDtype) {
  OwnedTensor bad = nv_.scale;
  bad.dtype = core::DType::U8;
  EXPECT_THROW_WITH(prepare_nvfp4(nv_.weight.view(), bad.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    "block scale has dtype U8, expected F8_E4M3");
}

TEST_F(RepackErrors, Nvfp4WrongScaleShape) {
  OwnedTensor bad = nv_.scale;
  bad.shape = {2, 4};
  EXPECT_THROW_WITH(prepare_nvfp4(nv_.weight.view(), bad.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    "block scale has shape [2, 4], expected [4, 2]");
}

TEST_F(RepackErrors, Nvfp4KNotMultipleOf16) {
  const OwnedTensor packed = OwnedTensor::from(core::DType::U8, {2, 12}, std::vector<uint8_t>(24, 0x11));
  const OwnedTensor scale = OwnedTensor::from(core::DType::F8_E4M3, {2, 1}, std::vector<uint8_t>(2, 0x38));
  EXPECT_THROW_WITH(prepare_nvfp4(packed.view(), scale.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    "K = 24 (shape [2, 12]), which is not a multiple of the scale group size 16");
}

TEST_F(RepackErrors, Nvfp4ZeroNanInfGlobalScale) {
  for (float g : {0.f, -1.f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    EXPECT_THROW_WITH(prepare_nvfp4(nv_.weight.view(), nv_.scale.view(), g, GlobalScaleConvention::Divisor, kName),
                      FormatError, std::string(kName) + ": weight_global_scale is");
  }
  EXPECT_THROW_WITH(prepare_nvfp4(nv_.weight.view(), nv_.scale.view(), 0.f, GlobalScaleConvention::Multiplier, kName),
                    FormatError, "weight_scale_2 is 0, expected a finite value > 0");
}

TEST_F(RepackErrors, Nvfp4NanBlockScale) {
  OwnedTensor bad = nv_.scale;
  bad.data[5] = std::byte{0x7F};
  EXPECT_THROW_WITH(prepare_nvfp4(nv_.weight.view(), bad.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    "block scale [2, 1] is NaN");
}

TEST_F(RepackErrors, Nvfp4TruncatedBytes) {
  OwnedTensor bad = nv_.weight;
  bad.data.pop_back();
  EXPECT_THROW_WITH(prepare_nvfp4(bad.view(), nv_.scale.view(), 1.f, GlobalScaleConvention::Divisor, kName), FormatError,
                    "holds 63 bytes, expected 64");
}

TEST_F(RepackErrors, Mxfp4KNotMultipleOf32) {
  const OwnedTensor packed = OwnedTensor::from(core::DType::U8, {2, 8}, std::vector<uint8_t>(16, 0x11));
  const OwnedTensor scale = OwnedTensor::from(core::DType::U8, {2, 1}, std::vector<uint8_t>(2, 127));
  EXPECT_THROW_WITH(prepare_mxfp4(packed.view(), scale.view(), kName), FormatError,
                    "K = 16 (shape [2, 8]), which is not a multiple of the scale group size 32");
}

TEST_F(RepackErrors, Mxfp4WrongScaleDtypeAndShape) {
  OwnedTensor bad = mx_.scale;
  bad.dtype = core::DType::F8_E4M3;
  EXPECT_THROW_WITH(prepare_mxfp4(mx_.weight.view(), bad.view(), kName), FormatError, "expected U8 or F8_E8M0");
  OwnedTensor bad_shape = mx_.scale;
  bad_shape.shape = {8, 1};
  EXPECT_THROW_WITH(prepare_mxfp4(mx_.weight.view(), bad_shape.view(), kName), FormatError, "expected [4, 2]");
  OwnedTensor e8m0 = mx_.scale;
  e8m0.dtype = core::DType::F8_E8M0;
  EXPECT_NO_THROW(prepare_mxfp4(mx_.weight.view(), e8m0.view(), kName));
}

TEST_F(RepackErrors, Int4BadTensors) {
  const Layer l = testing::make_int4(rng_, 9, 64, 32, true, true);
  OwnedTensor zp = l.zero_point;
  zp.shape = {1, 2};
  zp.data.resize(8);
  const core::TensorView zp_view = zp.view();
  EXPECT_THROW_WITH(prepare_int4(l.weight.view(), l.scale.view(), &zp_view, nullptr, 64, 32, kName), FormatError,
                    "weight_zero_point has shape [1, 2], expected [2, 2]");
  OwnedTensor gidx = l.g_idx;
  reinterpret_cast<int32_t*>(gidx.data.data())[3] = 7;
  const core::TensorView gidx_view = gidx.view();
  EXPECT_THROW_WITH(prepare_int4(l.weight.view(), l.scale.view(), nullptr, &gidx_view, 64, 32, kName), FormatError,
                    "g_idx [3] = 7 is outside [0, 2)");
  std::vector<int32_t> unbalanced(64, 0);
  unbalanced[63] = 1;
  const OwnedTensor ub = OwnedTensor::from(core::DType::I32, {64}, unbalanced);
  const core::TensorView ub_view = ub.view();
  EXPECT_THROW_WITH(prepare_int4(l.weight.view(), l.scale.view(), nullptr, &ub_view, 64, 32, kName), UnsupportedError,
                    "exactly 32 columns");
  EXPECT_THROW_WITH(prepare_int4(l.weight.view(), l.scale.view(), nullptr, nullptr, 60, 32, kName), UnsupportedError,
                    "need K (60) and the group size (32) to be multiples of 8");
  EXPECT_THROW_WITH(prepare_int4(l.weight.view(), l.scale.view(), nullptr, nullptr, 80, 32, kName), FormatError,
                    "weight_packed has shape [9, 8], expected [9, 10]");
}

TEST_F(RepackErrors, Fp8AndDenseBadTensors) {
  const Layer l = testing::make_fp8(rng_, 6, 20, 1);
  OwnedTensor scale = l.scale;
  scale.shape = {3, 2};
  EXPECT_THROW_WITH(prepare_fp8(l.weight.view(), scale.view(), {0, 0}, kName), FormatError,
                    "weight_scale has shape [3, 2], expected [] or [1] (tensor), [6] or [6, 1] (channel)");
  EXPECT_THROW_WITH(prepare_fp8(l.weight.view(), l.scale.view(), {4, 0}, kName), FormatError, "block structure is [4, 0]");
  EXPECT_THROW_WITH(prepare_dense(l.weight.view(), kName), FormatError, "weight has dtype F8_E4M3, expected BF16 or F16 or F32");
  const Layer d = testing::make_dense(rng_, 6, 20, core::DType::F32);
  PreparedLinear w = prepare_dense(d.weight.view(), kName);
  const OwnedTensor bias = OwnedTensor::from(core::DType::F32, {5}, std::vector<float>(5, 1.f));
  EXPECT_THROW_WITH(attach_bias(w, bias.view(), kName), FormatError, "bias has shape [5], expected [6]");
}

// prepare_linear: the CPU's repack of checkpoint-order weights (quant/linear_weights.h). Row blocks of 16, 24 and 13
// rows (ending inside tile pairs) with their own global scales and a bias on one block give exactly the layout of
// their parts prepared one by one and concatenated, and each encoding reaches its own repack.
TEST(PrepareLinear, StackedRowBlocksGiveTheirPartsConcatenated) {
  std::mt19937 rng(41);
  const Layer a = testing::make_nvfp4(rng, 16, 64, true);
  const Layer b = testing::make_nvfp4(rng, 24, 64, true);
  const Layer c = testing::make_nvfp4(rng, 13, 64, true);
  const std::vector<float> bias_values = {0.5f, -2.f, 0.25f, 1.f, -0.75f, 3.f, -1.5f, 2.5f, 0.125f, -4.f, 1.75f,
                                          -0.5f, 6.f, -3.25f, 0.375f, 5.f, -6.5f, 7.f, -0.125f, 0.625f, -1.f, 2.f,
                                          -2.25f, 4.5f};
  const OwnedTensor bias = OwnedTensor::from(core::DType::F32, {24}, bias_values);
  std::vector<quant::LinearWeights> layers;
  for (const Layer* l : {&a, &b, &c}) {
    layers.push_back(quant::fp4_view_weights(quant::BlockFormat::Nvfp4, l->weight.view(), l->scale.view(),
                                             l->global_scale, GlobalScaleConvention::Divisor, kName));
  }
  layers[1].rows[0].bias = bias.view();
  layers[1].rows[0].has_bias = true;
  for (quant::LinearWeights& l : layers) quant::set_input_global_scale(l, 2.5f, GlobalScaleConvention::Divisor);
  const PreparedLinear stacked = prepare_linear(quant::stack_rows(std::move(layers)));

  std::vector<PreparedLinear> parts;
  for (const Layer* l : {&a, &b, &c}) {
    parts.push_back(prepare_nvfp4(l->weight.view(), l->scale.view(), l->global_scale, GlobalScaleConvention::Divisor, kName));
    parts.back().input_global_scale = 2.5f;
  }
  attach_bias(parts[1], bias.view(), kName);
  const PreparedLinear fused = concat_rows(std::move(parts));
  ASSERT_EQ(stacked.out_features, 53);
  ASSERT_EQ(stacked.codes.size(), fused.codes.size());
  EXPECT_EQ(std::memcmp(stacked.codes.data(), fused.codes.data(), fused.codes.size()), 0);
  ASSERT_EQ(stacked.scales.size(), fused.scales.size());
  EXPECT_EQ(std::memcmp(stacked.scales.data(), fused.scales.data(), fused.scales.size()), 0);
  EXPECT_EQ(stacked.global_scale, fused.global_scale);
  EXPECT_EQ(stacked.bias, fused.bias);
  EXPECT_EQ(stacked.bias[16 + 5], 3.f);
  EXPECT_EQ(stacked.bias[0], 0.f);
  EXPECT_EQ(stacked.input_global_scale, 2.5f);
  // The float64 reference of the checkpoint tensors, row by row across the blocks.
  const auto out = dequant(stacked);
  int64_t row = 0;
  for (const Layer* l : {&a, &b, &c}) {
    for (int64_t r = 0; r < l->n; ++r, ++row) {
      for (int64_t k = 0; k < 64; ++k) {
        const double want = l->w[static_cast<size_t>(r * 64 + k)];
        ASSERT_NEAR(out[static_cast<size_t>(row * 64 + k)], want, 1e-6 * std::fabs(want)) << row << "," << k;
      }
    }
  }
}

// With an arena, prepare_linear builds the result's weight buffers in it, byte for byte what the heap path builds,
// and nothing else: a single row block straight into the arena, several blocks only as their concatenation (the
// parts stay on the heap, the arena holds exactly the codes and scales of the fused layer, no second copy).
TEST(PrepareLinear, RepacksIntoTheArenaWithoutASecondCopy) {
  std::mt19937 rng(47);
  const Layer a = testing::make_nvfp4(rng, 16, 64, true);
  const Layer b = testing::make_nvfp4(rng, 24, 64, true);
  const auto view = [](const Layer& l) {
    return quant::fp4_view_weights(quant::BlockFormat::Nvfp4, l.weight.view(), l.scale.view(), l.global_scale,
                                   GlobalScaleConvention::Divisor, kName);
  };
  const auto stacked = [&] {
    std::vector<quant::LinearWeights> layers;
    layers.push_back(view(a));
    layers.push_back(view(b));
    return quant::stack_rows(std::move(layers));
  };
  const auto inside = [](const AlignedBuffer& buf, const std::vector<std::pair<const std::byte*, size_t>>& spans) {
    return std::any_of(spans.begin(), spans.end(), [&](const auto& s) {
      return buf.data() >= s.first && buf.data() + buf.size() <= s.first + s.second;
    });
  };
  const auto rounded = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "two row blocks" : "one row block");
    const quant::LinearWeights w = fused ? stacked() : view(a);
    const PreparedLinear heap = prepare_linear(w);
    HugePageArena arena(size_t{2} << 20);
    const PreparedLinear in_arena = prepare_linear(w, &arena);
    ASSERT_EQ(in_arena.codes.size(), heap.codes.size());
    EXPECT_EQ(std::memcmp(in_arena.codes.data(), heap.codes.data(), heap.codes.size()), 0);
    ASSERT_EQ(in_arena.scales.size(), heap.scales.size());
    EXPECT_EQ(std::memcmp(in_arena.scales.data(), heap.scales.data(), heap.scales.size()), 0);
    EXPECT_EQ(in_arena.global_scale, heap.global_scale);
    // The arena handed out exactly the result's buffers, and they lie in it (a second arena's blocks do not).
    EXPECT_EQ(arena.used_bytes(), rounded(heap.codes.size()) + rounded(heap.scales.size()));
    std::shared_ptr<void> chunk;
    const std::byte* base = arena.allocate(1, chunk);
    const std::vector<std::pair<const std::byte*, size_t>> spans{{base - arena.used_bytes() + 64, arena.used_bytes()}};
    EXPECT_TRUE(inside(in_arena.codes, spans));
    EXPECT_TRUE(inside(in_arena.scales, spans));
    EXPECT_FALSE(inside(heap.codes, spans));
  }
  // The scope ends with the call: later repacks on this thread go to the heap again.
  EXPECT_EQ(ScopedWeightArena::current(), nullptr);
  HugePageArena outer, inner;
  {
    const ScopedWeightArena a1(&outer);
    {
      const ScopedWeightArena a2(&inner);
      EXPECT_EQ(ScopedWeightArena::current(), &inner);
    }
    EXPECT_EQ(ScopedWeightArena::current(), &outer);
  }
  EXPECT_EQ(ScopedWeightArena::current(), nullptr);
}

TEST(PrepareLinear, EachEncodingReachesItsRepack) {
  std::mt19937 rng(43);
  // Equal bytes; an empty buffer has a null data() (memcmp must not see it, even for 0 bytes).
  const auto same_bytes = [](const AlignedBuffer& a, const AlignedBuffer& b) {
    return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
  };
  const auto same = [&](const PreparedLinear& x, const PreparedLinear& y) {
    return x.layout == y.layout && same_bytes(x.codes, y.codes) && same_bytes(x.scales, y.scales) &&
           same_bytes(x.offsets, y.offsets) && x.k_perm == y.k_perm;
  };
  const auto one_block = [](quant::WeightEncoding e, const Layer& l, int64_t k) {
    quant::LinearWeights w;
    w.encoding = e;
    w.in_features = k;
    quant::WeightRows r;
    r.name = kName;
    r.weight = l.weight.view();
    if (e != quant::WeightEncoding::Dense) r.weight_scale = l.scale.view();
    r.zero_point = l.zero_point.view();
    r.has_zero_point = l.has_zero_point;
    r.g_idx = l.g_idx.view();
    r.has_g_idx = l.has_g_idx;
    w.rows.push_back(std::move(r));
    return w;
  };
  const Layer mx = testing::make_mxfp4(rng, 9, 96);
  quant::LinearWeights mxw = one_block(quant::WeightEncoding::Fp4, mx, 96);
  mxw.block_format = quant::BlockFormat::Mxfp4;
  EXPECT_TRUE(same(prepare_linear(mxw), prepare_mxfp4(mx.weight.view(), mx.scale.view(), kName)));
  const Layer i4 = testing::make_int4(rng, 11, 128, 32, /*asym=*/true, /*actorder=*/true);
  quant::LinearWeights i4w = one_block(quant::WeightEncoding::Int4, i4, 128);
  i4w.group_size = 32;
  const core::TensorView zp = i4.zero_point.view(), gi = i4.g_idx.view();
  EXPECT_TRUE(same(prepare_linear(i4w), prepare_int4(i4.weight.view(), i4.scale.view(), &zp, &gi, 128, 32, kName)));
  const Layer f8 = testing::make_fp8(rng, 10, 40, /*kind=channel*/ 1);
  EXPECT_TRUE(same(prepare_linear(one_block(quant::WeightEncoding::Fp8, f8, 40)),
                   prepare_fp8(f8.weight.view(), f8.scale.view(), {0, 0}, kName)));
  const Layer d = testing::make_dense(rng, 7, 24, core::DType::BF16);
  quant::LinearWeights dw = one_block(quant::WeightEncoding::Dense, d, 24);
  EXPECT_TRUE(same(prepare_linear(dw), prepare_dense(d.weight.view(), kName)));
  dw.requant = quant::DenseRequant::Int8Rows;
  EXPECT_TRUE(same(prepare_linear(dw), prepare_dense_as_int8_rows(d.weight.view(), kName)));
  dw.requant = quant::DenseRequant::Fp8Rows;
  EXPECT_TRUE(same(prepare_linear(dw), prepare_dense_as_fp8_rows(d.weight.view(), kName)));
  // A row block whose K is not the layer's is refused, naming the block.
  dw.in_features = 32;
  EXPECT_THROW_WITH(prepare_linear(dw), FormatError, "weight has 24 input features, the layer 32");
  dw.rows.clear();
  EXPECT_THROW(prepare_linear(dw), UsageError);
}

}  // namespace
}  // namespace fp4serve::prepare
