// SPDX-License-Identifier: Apache-2.0
// The CUDA kernels' scalar FP4/FP8 math (backends/cuda/kernels/fp4_math.h), run on the host, against the CPU reference
// implementation (quant/formats.h and kernels::emulate_nvfp4_activations), bit for bit: every code, random
// values, exact ties and saturation. Runs on every machine (no GPU needed).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/kernels/linear.h"
#include "backends/cuda/kernels/fp4_math.h"
#include "quant/block_format.h"
#include "quant/formats.h"

namespace fp4serve::kernels::cuda {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

TEST(CudaFp4Math, DecodersMatchReferenceForEveryCode) {
  for (uint32_t c = 0; c < 16; ++c) EXPECT_EQ(bits(e2m1_value(c)), bits(quant::e2m1_to_float(static_cast<uint8_t>(c)))) << c;
  for (uint32_t b = 0; b < 256; ++b) {
    const float want = quant::e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(e4m3_value(b))) << b;
    } else {
      EXPECT_EQ(bits(e4m3_value(b)), bits(want)) << b;
    }
    EXPECT_EQ(bits(e8m0_value(b)), bits(quant::e8m0_to_float(static_cast<uint8_t>(b)))) << b;
  }
}

// The kernels' scale decode of each block format (block_scale_value, chosen by the row's scale element) against
// the CPU's decode_block_scale, every byte of every row.
TEST(CudaFp4Math, BlockScaleValueMatchesTheRowForEveryFormat) {
  for (const quant::BlockFormatTraits& row : quant::kBlockFormats) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(quant::visit_block_format(row.format, []<quant::BlockFormat F>() { return kGroupSize<F>; }),
              row.group_size);
    for (uint32_t b = 0; b < 256; ++b) {
      const float got = quant::visit_block_format(row.format, [&]<quant::BlockFormat F>() { return block_scale_value<F>(b); });
      const float want = quant::decode_block_scale(row.format, static_cast<uint8_t>(b));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << b;
      } else {
        EXPECT_EQ(bits(got), bits(want)) << b;
      }
    }
  }
}

// Random magnitudes over the formats' ranges, every midpoint between neighbouring codes (ties), saturation and
// signed zeros.
std::vector<float> probe_values(float max_value, float min_step) {
  std::vector<float> v = {0.f, -0.f, max_value, -max_value, 2 * max_value, -1e30f, 1e30f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          min_step / 2, -min_step / 2, min_step / 4, min_step * 0.75f};
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> log_mag(std::log2(min_step) - 3, std::log2(max_value) + 1);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(log_mag(rng));
    v.push_back((rng() & 1) ? x : -x);
  }
  return v;
}

TEST(CudaFp4Math, E2m1EncodeMatchesReference) {
  std::vector<float> v = probe_values(6.f, 0.5f);
  for (uint32_t c = 0; c < 7; ++c) {  // ties between neighbouring codes
    const float mid = (quant::e2m1_to_float(static_cast<uint8_t>(c)) + quant::e2m1_to_float(static_cast<uint8_t>(c + 1))) / 2;
    v.push_back(mid);
    v.push_back(-mid);
    v.push_back(std::nextafter(mid, 0.f));
    v.push_back(std::nextafter(mid, 10.f));
  }
  for (const float x : v) EXPECT_EQ(e2m1_encode(x), quant::float_to_e2m1(x)) << x;
  EXPECT_EQ(e2m1_encode(std::numeric_limits<float>::quiet_NaN()), 0u);
}

TEST(CudaFp4Math, E4m3EncodeMatchesReference) {
  std::vector<float> v = probe_values(448.f, 0x1p-9f);
  for (uint32_t c = 0; c < 0x7E; ++c) {
    const float mid = (quant::e4m3_to_float(static_cast<uint8_t>(c)) + quant::e4m3_to_float(static_cast<uint8_t>(c + 1))) / 2;
    v.push_back(mid);
    v.push_back(-mid);
    v.push_back(std::nextafter(mid, 0.f));
    v.push_back(std::nextafter(mid, 1000.f));
  }
  v.push_back(464.f);  // above the largest finite value: saturates
  for (const float x : v) EXPECT_EQ(e4m3_encode(x), quant::float_to_e4m3(x)) << x;
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::quiet_NaN()) & 0x7Fu, 0x7Fu);
}

TEST(CudaFp4Math, ActivationFakeQuantMatchesCpuBitForBit) {
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const float igs : {1.f, 448.f * 6.f / 7.3f, 0.37f, 3e4f}) {
    const int64_t m = 5, k = 96;
    std::vector<float> x(static_cast<size_t>(m * k));
    for (size_t i = 0; i < x.size(); ++i) {
      // Heavy-tailed values with a few exact zeros groups and huge outliers to hit the 448 clamp and the 0.125 rule.
      x[i] = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 24) - 12));
    }
    for (int j = 0; j < 16; ++j) x[static_cast<size_t>(16 + j)] = 0.f;
    x[40] = 1e9f;
    // Exact E2M1 ties at step 1 (amax/6 = 1 when igs = 1).
    for (int j = 0; j < 16; ++j) x[static_cast<size_t>(64 + j)] = j == 0 ? 6.f : 0.25f + 0.5f * static_cast<float>(j % 8);
    std::vector<float> want = x;
    kernels::emulate_nvfp4_activations(want.data(), m, k, igs);
    std::vector<float> got = x;
    for (size_t g = 0; g < got.size(); g += 16) emulate_nvfp4_group(got.data() + g, igs);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << "igs " << igs << " element " << i;
  }
}

// The device MXFP4 activation fake quant against the CPU one (itself bit-exact with compressed-tensors:
// tests/model/w4a4_golden_test.cpp), over every exponent region: zeros, subnormal scales, ties, saturation, inf
// scales and NaN groups.
TEST(CudaFp4Math, Mxfp4ActivationFakeQuantMatchesCpuBitForBit) {
  std::mt19937 rng(78);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t m = 7, k = 96;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 300) - 150));
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(32 + j)] = 0.f;
  x[100] = std::numeric_limits<float>::infinity();
  x[140] = std::numeric_limits<float>::quiet_NaN();
  x[200] = 3.2e38f;
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(256 + j)] = j == 0 ? 4.f : 0.25f + 0.5f * static_cast<float>(j % 8);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(288 + j)] = std::ldexp(1.f + static_cast<float>(j) / 32.f, -140);
  std::vector<float> want = x;
  kernels::emulate_mxfp4_activations(want.data(), m, k);
  std::vector<float> got = x;
  for (size_t g = 0; g < got.size(); g += 32) emulate_mxfp4_group(got.data() + g);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(bits(got[i]), bits(want[i])) << "element " << i << " x " << x[i];
    }
  }
  for (uint32_t b = 0; b < (1u << 16); ++b) {  // every bf16 amax pattern, as the device sees bf16 activations
    const float amax = std::fabs(std::bit_cast<float>(b << 16));
    ASSERT_EQ(mxfp4_activation_exponent(amax), kernels::mxfp4_activation_exponent(amax)) << b;
  }
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
