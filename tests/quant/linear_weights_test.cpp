// SPDX-License-Identifier: Apache-2.0
// quant::LinearWeights, the checkpoint-order hand-off from the model to every backend: stacking row blocks (fused
// q|k|v, gate|up) keeps each block's tensors, order and owned bytes, refuses blocks that cannot share one GEMM, and
// the shared tensor checks name the layer, the tensor, the expected and the found value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "fp4serve/error.h"
#include "quant/checkpoint_tensors.h"
#include "quant/linear_weights.h"

namespace fp4serve::quant {
namespace {

template <class E>
std::string message_of(auto&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception";
}

TEST(LinearWeights, StackRowsKeepsEveryBlockInOrderWithItsOwnBytes) {
  std::vector<LinearWeights> parts;
  parts.push_back(dense_weights({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, 2, 3, "q"));
  parts.push_back(dense_weights({7.f, 8.f, 9.f}, 1, 3, "k"));
  parts.push_back(dense_weights({10.f, 11.f, 12.f, 13.f, 14.f, 15.f, 16.f, 17.f, 18.f}, 3, 3, "v"));
  const LinearWeights w = stack_rows(std::move(parts));
  ASSERT_EQ(w.rows.size(), 3u);
  EXPECT_EQ(w.out_features(), 6);
  EXPECT_EQ(w.in_features, 3);
  EXPECT_EQ(w.rows[0].name, "q");
  EXPECT_EQ(w.rows[2].name, "v");
  EXPECT_EQ(w.owned.size(), 3u);  // the copies live as long as the stacked layer
  EXPECT_EQ(w.rows[1].weight.load<float>(2), 9.f);
  EXPECT_EQ(w.rows[2].weight.load<float>(8), 18.f);
}

TEST(LinearWeights, DenseWeightsOwnACopyOfTheirValues) {
  std::vector<float> values = {0.5f, -1.5f, 2.25f, 3.f};
  const LinearWeights w = dense_weights(values, 2, 2, "x");
  values.assign(4, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(w.rows[0].weight.dtype, core::DType::F32);
  EXPECT_EQ(w.rows[0].weight.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(w.rows[0].weight.load<float>(1), -1.5f);
  EXPECT_THROW(dense_weights({1.f, 2.f, 3.f}, 2, 2, "x"), UsageError);
}

TEST(LinearWeights, StackRowsRefusesBlocksThatCannotShareOneGemm) {
  std::mt19937 rng(3);
  const testing::Layer a = testing::make_nvfp4(rng, 8, 32, true);
  const testing::Layer b = testing::make_mxfp4(rng, 8, 32);
  const auto nvfp4 = [&] {
    return fp4_view_weights(BlockFormat::Nvfp4, a.weight.view(), a.scale.view(), a.global_scale,
                            GlobalScaleConvention::Divisor, "q");
  };
  {  // another block format
    std::vector<LinearWeights> parts;
    parts.push_back(nvfp4());
    parts.push_back(fp4_view_weights(BlockFormat::Mxfp4, b.weight.view(), b.scale.view(), 0.f,
                                     GlobalScaleConvention::Divisor, "k"));
    EXPECT_NE(message_of<UsageError>([&] { stack_rows(std::move(parts)); }).find("part 1"), std::string::npos);
  }
  {  // another K
    std::vector<LinearWeights> parts;
    parts.push_back(nvfp4());
    parts.push_back(dense_weights(std::vector<float>(8 * 16, 1.f), 8, 16, "k"));
    EXPECT_THROW(stack_rows(std::move(parts)), UsageError);
  }
  {  // another activation global scale: one activation, one scale
    std::vector<LinearWeights> parts;
    parts.push_back(nvfp4());
    parts.push_back(nvfp4());
    set_input_global_scale(parts[0], 4.f, GlobalScaleConvention::Divisor);
    set_input_global_scale(parts[1], 5.f, GlobalScaleConvention::Divisor);
    EXPECT_NE(message_of<FormatError>([&] { stack_rows(std::move(parts)); }).find("input_global_scale"),
              std::string::npos);
  }
  EXPECT_THROW(stack_rows({}), UsageError);
}

TEST(LinearWeights, InputGlobalScaleIsStoredAsTheDivisor) {
  LinearWeights w = dense_weights({1.f}, 1, 1, "x");
  set_input_global_scale(w, 4.f, GlobalScaleConvention::Multiplier);
  EXPECT_EQ(w.input_global_scale, 0.25f);
  set_input_global_scale(w, 3.f, GlobalScaleConvention::Divisor);
  EXPECT_EQ(w.input_global_scale, 3.f);
  for (const float bad : {0.f, -1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THROW(set_input_global_scale(w, bad, GlobalScaleConvention::Divisor), FormatError) << bad;
  }
}

TEST(LinearWeights, Fp4ChecksNameTheLayerTheTensorAndBothValues) {
  std::mt19937 rng(5);
  testing::Layer l = testing::make_nvfp4(rng, 4, 32, true);
  const auto make = [&](float global_scale) {
    return fp4_view_weights(BlockFormat::Nvfp4, l.weight.view(), l.scale.view(), global_scale,
                            GlobalScaleConvention::Divisor, "model.layers.2.mlp.up_proj");
  };
  EXPECT_EQ(make(l.global_scale).in_features, 32);
  const std::string zero = message_of<FormatError>([&] { make(0.f); });
  EXPECT_NE(zero.find("model.layers.2.mlp.up_proj: weight_global_scale is 0"), std::string::npos) << zero;
  // An E4M3 NaN block scale (0x7F) at row 1, group 1.
  reinterpret_cast<uint8_t*>(l.scale.data.data())[3] = 0x7F;
  const std::string nan = message_of<FormatError>([&] { make(l.global_scale); });
  EXPECT_NE(nan.find("block scale [1, 1] is NaN (E4M3 byte 0x7F)"), std::string::npos) << nan;
  // Scales for groups of 32 where NVFP4 has 16.
  const testing::OwnedTensor wrong = testing::OwnedTensor::from(core::DType::F8_E4M3, {4, 1},
                                                                std::vector<uint8_t>{0x38, 0x38, 0x38, 0x38});
  const std::string shape = message_of<FormatError>([&] {
    fp4_view_weights(BlockFormat::Nvfp4, l.weight.view(), wrong.view(), 1.f, GlobalScaleConvention::Divisor, "x");
  });
  EXPECT_NE(shape.find("block scale has shape [4, 1], expected [4, 2]"), std::string::npos) << shape;
  const testing::Layer d = testing::make_dense(rng, 3, 8, core::DType::F16);
  EXPECT_EQ(check_dense_rows(d.weight.view(), "x"), 8);
  const std::string dtype = message_of<FormatError>([&] { check_dense_rows(l.weight.view(), "x"); });
  EXPECT_NE(dtype.find("x: weight has dtype U8, expected BF16 or F16 or F32"), std::string::npos) << dtype;
}

}  // namespace
}  // namespace fp4serve::quant
