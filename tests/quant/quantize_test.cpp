// SPDX-License-Identifier: Apache-2.0
// Quantization against independent references:
//  1. llm-compressor itself: quantizing tests/data/ref/<model>-bf16 must reproduce the tensors llm-compressor
//     wrote for <model>-nvfp4a16 / -mxfp4a16 / -w4a16 bit for bit (tools/reference/make_fixtures.py).
//  2. float64 re-derivations of the math written here (own RNE rounding to BF16/F32/E4M3/E2M1), on seeded
//     random weights with odd shapes, plus the round-trip bound through our reference dequantizer.
//  3. Our own output (byte-identical to tests/data/ref/llama-nvfp4a16 / llama-w4a16, so not stored twice) against
//     compressed-tensors' decompression of it, stored as digests in tests/data/quantized-by-fp4serve
//     (tools/quantize_roundtrip.py).
#include "quant/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "quant/dequant.h"
#include "quant/dequant_digest.h"  // tests/quant (tests/ is on the include path)
#include "quant/formats.h"
#include "quant/quantize_checkpoint.h"

namespace fp4serve::quant {
namespace {

namespace fs = std::filesystem;
using core::DType;

const fs::path kData = FP4SERVE_TEST_DATA;

// ---- independent float64 reference ------------------------------------------------------------------------

// x rounded to nearest-even in a binary format with `mantissa` stored bits and smallest normal exponent
// `min_exp` (subnormals below it), by scaling to an integer in double (exact: power-of-two scaling).
double round_to_format(double x, int mantissa, int min_exp) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m · 2^e, m in [0.5, 1)
  const int unit_exp = std::max(e - 1, min_exp) - mantissa;
  return std::nearbyint(std::ldexp(x, -unit_exp)) * std::ldexp(1.0, unit_exp);
}
double bf16(double x) { return round_to_format(x, 7, -126); }
double f32(double x) { return round_to_format(x, 23, -126); }

// Nearest E4M3 value (RNE, saturating at 448) as a double.
double e4m3(double x) { return std::min(round_to_format(x, 3, -6), 448.0); }

// Nearest E2M1 magnitude index (0..7) of |v| clamped to 6; ties go to the even index.
int e2m1_index(double v) {
  static constexpr double kGrid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::min(std::fabs(v), 6.0);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(a - kGrid[i]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return best;
}
uint8_t e2m1_code(double v) { return static_cast<uint8_t>(e2m1_index(v) | (v < 0 ? 8 : 0)); }

std::vector<float> random_bf16_weights(int64_t rows, int64_t cols, uint32_t seed, double stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& x : w) x = static_cast<float>(bf16(dist(rng)));
  return w;
}

uint8_t nibble(const std::vector<uint8_t>& packed, size_t k) {
  return k % 2 == 0 ? packed[k / 2] & 0xF : packed[k / 2] >> 4;
}

core::TensorView view(DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
  return core::TensorView{dtype, std::move(shape), std::span(static_cast<const std::byte*>(data), bytes)};
}

// ---- 2. math vs float64 ------------------------------------------------------------------------------------

TEST(QuantizeMath, Nvfp4GlobalScaleFollowsTorchReciprocalThenMultiply) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(1e-3, 10.0);
  for (int i = 0; i < 2000; ++i) {
    const double amax = bf16(dist(rng));
    const double expected = bf16(bf16(f32(1.0 / amax)) * 2688.0);
    ASSERT_EQ(nvfp4_global_scale(static_cast<float>(amax), DType::BF16), expected) << amax;
    const double amax32 = f32(dist(rng));
    ASSERT_EQ(nvfp4_global_scale(static_cast<float>(amax32), DType::F32), f32(f32(1.0 / amax32) * 2688.0));
  }
  // The llama-bf16 down_proj case where one division (26624) and torch's reciprocal route (26496) differ.
  EXPECT_EQ(bf16(2688.0 / 0.10107421875), 26624.0);
  EXPECT_EQ(nvfp4_global_scale(0.10107421875f, DType::BF16), 26496.0f);
  EXPECT_EQ(nvfp4_global_scale(0.0f, DType::BF16), 1.0f);  // 2688 / tiny overflows → 1 (CT nan_to_num)
  // F16 sources are computed in F32 on purpose (the producer's F16 arithmetic overflows to 1.0 here).
  EXPECT_NEAR(nvfp4_global_scale(0.03f, DType::F16), 2688.0 / 0.03, 2688.0 / 0.03 * 1e-6);
  EXPECT_THROW(nvfp4_global_scale(-1.0f, DType::BF16), UsageError);
  EXPECT_THROW(nvfp4_global_scale(1.0f, DType::U8), UsageError);
}

TEST(QuantizeMath, Nvfp4MatchesFloat64DerivationAndRoundTripBound) {
  const int64_t rows = 13, cols = 80;  // odd row count, 5 groups per row
  std::vector<float> w = random_bf16_weights(rows, cols, 20251129, 0.03);
  for (int i = 0; i < 16; ++i) w[static_cast<size_t>(16 + i)] = 0.0f;  // an all-zero group → scale 0.125
  w[40] = -0.0f;                                                         // -0 → code 0x0
  w[41] = -1e-6f;                                                        // tiny negative → code 0x8
  const float amax = abs_max(w, "w");
  const float gs = nvfp4_global_scale(amax, DType::BF16);
  const QuantizedNvfp4 q = quantize_nvfp4(w, rows, cols, gs, DType::BF16);
  ASSERT_EQ(q.packed.size(), static_cast<size_t>(rows * cols / 2));
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(rows * cols / 16));
  EXPECT_EQ(q.global_scale, gs);
  EXPECT_EQ(e4m3_to_float(q.scales[1]), 0.125f);
  EXPECT_EQ(nibble(q.packed, 40), 0x0);
  EXPECT_EQ(nibble(q.packed, 41), 0x8);

  const DequantizedWeight deq =
      dequantize_nvfp4(view(DType::U8, {rows, cols / 2}, q.packed.data(), q.packed.size()),
                       view(DType::F8_E4M3, {rows, cols / 16}, q.scales.data(), q.scales.size()), gs,
                       GlobalScaleConvention::Divisor, "roundtrip");
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < cols / 16; ++g) {
      double gmax = 0;
      for (int i = 0; i < 16; ++i) gmax = std::max(gmax, std::fabs(double(w[size_t(n * cols + g * 16 + i)])));
      double s = e4m3(f32(double(gs) * bf16(gmax / 6.0)));
      if (s == 0) s = 0.125;
      ASSERT_EQ(double(e4m3_to_float(q.scales[size_t(n * (cols / 16) + g)])), s) << n << "," << g;
      const double t = f32(s / gs);
      for (int i = 0; i < 16; ++i) {
        const size_t k = size_t(n * cols + g * 16 + i);
        const double v = f32(double(w[k]) / t);
        ASSERT_EQ(nibble(q.packed, k), v == 0 ? 0 : e2m1_code(v)) << k << " v=" << v;
        // Round trip: half a grid step of the interval holding |v| (or the clamp overshoot), scaled back,
        // plus the BF16 rounding of the dequantized value.
        const double a = std::fabs(v);
        const double half_step = a <= 2 ? 0.25 : a <= 4 ? 0.5 : 1.0;
        const double bound = (a > 6 ? a - 6 : half_step) * t + std::fabs(deq.values[k]) * 0x1p-8 + 1e-12;
        ASSERT_LE(std::fabs(double(deq.values[k]) - double(w[k])), bound) << k;
      }
    }
  }
}

TEST(QuantizeMath, Mxfp4MatchesFloat64DerivationAndRoundTripBound) {
  const int64_t rows = 11, cols = 96;  // 3 groups of 32
  std::vector<float> w = random_bf16_weights(rows, cols, 424242, 0.05);
  for (int i = 0; i < 32; ++i) w[size_t(32 + i)] = 0.0f;  // zero group → code 0
  w[0] = 1.75f;                                             // mantissa 1.75 rounds up: R = 2 → code 126
  const QuantizedMxfp4 q = quantize_mxfp4(w, rows, cols, DType::BF16);
  EXPECT_EQ(q.scales[0], 126);
  EXPECT_EQ(q.scales[1], 0);
  const DequantizedWeight deq =
      dequantize_mxfp4(view(DType::U8, {rows, cols / 2}, q.packed.data(), q.packed.size()),
                       view(DType::U8, {rows, cols / 32}, q.scales.data(), q.scales.size()), "roundtrip");
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < cols / 32; ++g) {
      double gmax = 0;
      for (int i = 0; i < 32; ++i) gmax = std::max(gmax, std::fabs(double(w[size_t(n * cols + g * 32 + i)])));
      int expected = 0;
      if (gmax > 0) {
        int e = 0;
        const double m = 2 * std::frexp(gmax, &e);  // gmax = m · 2^(e−1), m in [1, 2)
        expected = 127 + (e - 1) + (m >= 1.75 ? 1 : 0) - 2;
      }
      ASSERT_EQ(int(q.scales[size_t(n * (cols / 32) + g)]), expected) << gmax;
      const double scale = std::ldexp(1.0, expected - 127);
      for (int i = 0; i < 32; ++i) {
        const size_t k = size_t(n * cols + g * 32 + i);
        const double v = bf16(double(w[k]) / scale);
        ASSERT_EQ(nibble(q.packed, k), v == 0 ? 0 : e2m1_code(v)) << k;
        const double a = std::fabs(v);
        const double bound = (a > 6 ? a - 6 : a <= 2 ? 0.25 : a <= 4 ? 0.5 : 1.0) * scale + 1e-12;
        ASSERT_LE(std::fabs(double(deq.values[k]) - double(w[k])), bound) << k;
      }
    }
  }
}

TEST(QuantizeMath, Int4MatchesFloat64DerivationAndRoundTripBound) {
  for (const int64_t group : {int64_t{128}, int64_t{32}}) {
    const int64_t rows = 9, cols = 384;
    std::vector<float> w = random_bf16_weights(rows, cols, 99 + uint32_t(group), 0.02);
    for (int i = 0; i < group; ++i) w[size_t(group + i)] = 0.0f;  // zero group → scale eps(BF16) = 2^-7
    const QuantizedInt4 q = quantize_int4(w, rows, cols, group, DType::BF16);
    EXPECT_EQ(q.scale_dtype, DType::BF16);
    EXPECT_EQ(q.scales[1], 0x1p-7f);
    std::vector<uint16_t> scale_bits(q.scales.size());
    for (size_t i = 0; i < q.scales.size(); ++i) scale_bits[i] = float_to_bf16(q.scales[i]);
    const DequantizedWeight deq = dequantize_int4(
        view(DType::I32, {rows, cols / 8}, q.packed.data(), q.packed.size() * 4),
        view(DType::BF16, {rows, cols / group}, scale_bits.data(), scale_bits.size() * 2), nullptr, nullptr, cols,
        group, "roundtrip");
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t g = 0; g < cols / group; ++g) {
        double gmax = 0;
        for (int64_t i = 0; i < group; ++i) gmax = std::max(gmax, std::fabs(double(w[size_t(n * cols + g * group + i)])));
        double scale = bf16(gmax / 7.5);
        if (scale == 0) scale = 0x1p-7;
        ASSERT_EQ(double(q.scales[size_t(n * (cols / group) + g)]), scale);
        for (int64_t i = 0; i < group; ++i) {
          const size_t k = size_t(n * cols + g * group + i);
          const double v = std::clamp(bf16(double(w[k]) / scale), -8.0, 7.0);  // BF16 quotient, then clamp
          const int expected = int(std::nearbyint(v));
          const uint32_t word = uint32_t(q.packed[size_t(n * (cols / 8)) + (k - size_t(n * cols)) / 8]);
          ASSERT_EQ(int((word >> (4 * (k % 8))) & 0xF) - 8, expected) << k;
          // Half a step, widened by the clamp at +7 (amax/scale ≤ 7.5·(1 + 2^-8): +0.03) and by the BF16
          // rounding of the quotient before the integer rounding (≤ 2^-6 below 8); plus the BF16 product.
          const double bound = (0.5 + 0x1p-6 + 7.5 * 0x1p-8) * scale + std::fabs(deq.values[k]) * 0x1p-8 + 1e-12;
          ASSERT_LE(std::fabs(double(deq.values[k]) - double(w[k])), bound) << k;
        }
      }
    }
  }
}

TEST(QuantizeMath, BadInputsAreUsageErrors) {
  const std::vector<float> w(3 * 48, 0.5f);
  EXPECT_THROW(quantize_nvfp4(w, 3, 48, 1.0f, DType::I8), UsageError);
  EXPECT_THROW(quantize_nvfp4(w, 4, 36, 1.0f, DType::BF16), UsageError);  // 36 % 16
  EXPECT_THROW(quantize_nvfp4(w, 3, 48, 0.0f, DType::BF16), UsageError);
  EXPECT_THROW(quantize_nvfp4(w, 3, 32, 1.0f, DType::BF16), UsageError);  // size mismatch
  EXPECT_THROW(quantize_mxfp4(w, 3, 48, DType::BF16), UsageError);        // 48 % 32
  EXPECT_THROW(quantize_int4(w, 3, 48, 0, DType::BF16), UsageError);
  EXPECT_THROW(quantize_int4(w, 3, 48, 32, DType::BF16), UsageError);     // 48 % 32
  std::vector<float> nan = w;
  nan[5] = std::nanf("");
  EXPECT_THROW(abs_max(nan, "t"), UsageError);
}

// ---- 1. bit-exact against llm-compressor -------------------------------------------------------------------

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("fp4serve_quantize_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

// The fixture's module name for one of ours. llm-compressor saved the Mixtral experts under the linearized
// names (w1 → gate_proj, w3 → up_proj, w2 → down_proj) while the bf16 source and our output keep w1/w2/w3.
std::string fixture_name(const std::string& ours) {
  std::string s = ours;
  for (const auto& [from, to] : {std::pair{".w1.", ".gate_proj."}, {".w3.", ".up_proj."}, {".w2.", ".down_proj."}}) {
    if (const size_t p = s.find(from); p != std::string::npos) s.replace(p, std::strlen(from), to);
  }
  return s;
}

struct ParityCase {
  const char* model;
  const char* scheme;
};

class QuantizeParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(QuantizeParity, ReproducesLlmCompressorBitForBit) {
  const ParityCase c = GetParam();
  const fs::path source_dir = kData / "ref" / (std::string(c.model) + "-bf16");
  const fs::path fixture_dir = kData / "ref" / (std::string(c.model) + "-" + c.scheme);
  if (!fs::exists(source_dir) || !fs::exists(fixture_dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto source = checkpoint::Checkpoint::open(source_dir);
  QuantizeOptions opts;
  opts.scheme = *parse_quant_scheme(c.scheme);
  const QuantizePlan plan = plan_quantization(source, opts);
  const fs::path out = fresh_dir(std::string(c.model) + c.scheme);
  quantize_checkpoint(source, plan, out, checkpoint::kDefaultMaxShardBytes);
  const auto ours = checkpoint::Checkpoint::open(out);
  const auto ref = checkpoint::Checkpoint::open(fixture_dir);

  // Every tensor of every quantized linear of the fixture (and every other tensor) is ours, byte for byte.
  size_t quantized = 0;
  EXPECT_EQ(ours.tensor_names().size(), ref.tensor_names().size());
  for (const std::string& name : ours.tensor_names()) {
    const core::TensorView a = ours.tensor(name);
    const core::TensorView b = ref.tensor(fixture_name(name));
    ASSERT_EQ(a.dtype, b.dtype) << name;
    ASSERT_EQ(a.shape, b.shape) << name;
    const auto mismatch = std::mismatch(a.bytes.begin(), a.bytes.end(), b.bytes.begin());
    EXPECT_TRUE(mismatch.first == a.bytes.end()) << name << ": first differing byte at "
                                                 << (mismatch.first - a.bytes.begin());
    quantized += name.ends_with(".weight_packed") ? 1 : 0;
  }
  EXPECT_GT(quantized, 0u);
  // The quantization_config is llm-compressor's, ignore list included.
  EXPECT_EQ(ours.config()["quantization_config"], ref.config()["quantization_config"]);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeParity,
                         ::testing::Values(ParityCase{"llama", "nvfp4a16"}, ParityCase{"llama", "mxfp4a16"},
                                           ParityCase{"llama", "w4a16"}, ParityCase{"llama", "mxfp4"},
                                           ParityCase{"qwen3moe", "nvfp4a16"},
                                           ParityCase{"qwen3moe", "mxfp4a16"}, ParityCase{"mixtral", "nvfp4a16"},
                                           ParityCase{"mixtral", "mxfp4a16"}),
                         [](const auto& p) { return std::string(p.param.model) + "_" + p.param.scheme; });

TEST(QuantizeCheckpoint, ShardedOutputHoldsTheSameTensors) {
  const fs::path source_dir = kData / "ref" / "llama-bf16";
  if (!fs::exists(source_dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto source = checkpoint::Checkpoint::open(source_dir);
  QuantizeOptions opts;
  opts.scheme = QuantScheme::W4A16;
  const QuantizePlan plan = plan_quantization(source, opts);
  const fs::path single = fresh_dir("single"), sharded = fresh_dir("sharded");
  quantize_checkpoint(source, plan, single, checkpoint::kDefaultMaxShardBytes);
  quantize_checkpoint(source, plan, sharded, 300'000);
  const auto a = checkpoint::Checkpoint::open(single);
  const auto b = checkpoint::Checkpoint::open(sharded);
  EXPECT_EQ(a.shards().size(), 1u);
  EXPECT_GT(b.shards().size(), 3u);
  ASSERT_EQ(a.tensor_names().size(), b.tensor_names().size());
  for (const std::string& name : a.tensor_names()) {
    const core::TensorView x = a.tensor(name), y = b.tensor(name);
    EXPECT_TRUE(std::equal(x.bytes.begin(), x.bytes.end(), y.bytes.begin(), y.bytes.end())) << name;
  }
  EXPECT_THROW(quantize_checkpoint(source, plan, single, checkpoint::kDefaultMaxShardBytes), UsageError);  // not empty
  fs::remove_all(single);
  fs::remove_all(sharded);
}

TEST(QuantizeCheckpoint, W4A4WithCalibratedAmaxMatchesLlmCompressorLayout) {
  // Calibration itself needs the runtime (not in this build); given activation amaxes, the W4A4 output must be
  // llm-compressor's llama-nvfp4: same weight tensors and config, plus one input_global_scale per layer shared
  // by each fused group (the joint max of its members' amaxes).
  const fs::path source_dir = kData / "ref" / "llama-bf16";
  const fs::path fixture_dir = kData / "ref" / "llama-nvfp4";
  if (!fs::exists(source_dir) || !fs::exists(fixture_dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto source = checkpoint::Checkpoint::open(source_dir);
  QuantizeOptions opts;
  opts.scheme = QuantScheme::Nvfp4;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(0.5f, 20.0f);
  for (const auto& name : source.tensor_names()) {
    if (name.ends_with("_proj.weight")) opts.input_amax[name.substr(0, name.size() - 7)] = dist(rng);
  }
  const QuantizePlan plan = plan_quantization(source, opts);
  const fs::path out = fresh_dir("w4a4");
  quantize_checkpoint(source, plan, out, checkpoint::kDefaultMaxShardBytes);
  const auto ours = checkpoint::Checkpoint::open(out);
  const auto ref = checkpoint::Checkpoint::open(fixture_dir);
  ASSERT_EQ(ours.tensor_names().size(), ref.tensor_names().size());
  for (const std::string& name : ours.tensor_names()) {
    const core::TensorView a = ours.tensor(name), b = ref.tensor(name);
    ASSERT_EQ(a.shape, b.shape) << name;
    if (name.ends_with(".input_global_scale")) continue;  // depends on the calibration text
    EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin(), b.bytes.end())) << name;
  }
  EXPECT_EQ(ours.config()["quantization_config"], ref.config()["quantization_config"]);
  const auto igs = [&](const std::string& m) { return ours.tensor(m + ".input_global_scale").load<float>(0); };
  const std::string a = "model.layers.1.self_attn.";
  const float joint = std::max({opts.input_amax[a + "q_proj"], opts.input_amax[a + "k_proj"], opts.input_amax[a + "v_proj"]});
  EXPECT_EQ(igs(a + "q_proj"), nvfp4_global_scale(joint, DType::BF16));
  EXPECT_EQ(igs(a + "v_proj"), igs(a + "q_proj"));
  EXPECT_EQ(igs(a + "o_proj"), nvfp4_global_scale(opts.input_amax[a + "o_proj"], DType::BF16));
  fs::remove_all(out);
}

TEST(QuantizeCheckpoint, PlanOptionsAndRefusals) {
  const fs::path source_dir = kData / "ref" / "llama-bf16";
  if (!fs::exists(source_dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto source = checkpoint::Checkpoint::open(source_dir);
  QuantizeOptions opts;
  opts.scheme = QuantScheme::Nvfp4A16;
  opts.ignore = std::vector<std::string>{"lm_head", R"(re:.*\.1\.mlp\.)"};
  QuantizePlan plan = plan_quantization(source, opts);
  EXPECT_EQ(plan.ignore, (std::vector<std::string>{"model.layers.1.mlp.down_proj", "model.layers.1.mlp.gate_proj",
                                                   "model.layers.1.mlp.up_proj", "lm_head"}));
  // q/k/v of one layer share the global scale; o_proj has its own.
  std::map<std::string, float> gs;
  for (const auto& l : plan.linears) gs[l.module] = l.global_scale;
  EXPECT_EQ(gs["model.layers.0.self_attn.q_proj"], gs["model.layers.0.self_attn.k_proj"]);
  EXPECT_EQ(gs["model.layers.0.self_attn.q_proj"], gs["model.layers.0.self_attn.v_proj"]);
  EXPECT_EQ(gs["model.layers.0.mlp.gate_proj"], gs["model.layers.0.mlp.up_proj"]);

  opts.ignore = std::vector<std::string>{"re:("};
  EXPECT_THROW(plan_quantization(source, opts), UsageError);
  opts.ignore.reset();
  opts.group_size = 32;
  EXPECT_THROW(plan_quantization(source, opts), UsageError);  // NVFP4 groups are 16
  opts.scheme = QuantScheme::W4A16;
  opts.group_size = 96;
  // 256 % 96 != 0: the message names the group size that fits every layer (in_features 256 and 512), not only --ignore.
  try {
    (void)plan_quantization(source, opts);
    ADD_FAILURE() << "group size 96 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a multiple of the w4a16 group size 96; use --group-size 64 (it "
                                         "divides every quantized layer's in_features), or keep the layer unquantized "
                                         "with --ignore"),
              std::string::npos)
        << e.what();
  }
  opts.scheme = QuantScheme::Nvfp4;
  opts.group_size = 0;
  EXPECT_THROW(plan_quantization(source, opts), UsageError);  // W4A4 without calibrated input amax
  const auto quantized = checkpoint::Checkpoint::open(kData / "ref" / "llama-nvfp4a16");
  EXPECT_THROW(plan_quantization(quantized, QuantizeOptions{}), UsageError);  // already quantized
}

// llm-compressor QuIPModifier(rotations=["v"], transform_type="hadamard", transform_block_size=128) + NVFP4A16 on
// the same bf16 source (tests/data/ref/llama-quip-nvfp4a16): every quantized tensor must be ours byte for byte (the
// rotation is fused in float64 and rounded to BF16 as compressed-tensors does), the stored matrix equal to theirs
// (they store it under another module: tied copies are written once), the transform_config theirs.
TEST(QuantizeCheckpoint, HadamardReproducesLlmCompressorQuip) {
  const fs::path source_dir = kData / "ref" / "llama-bf16";
  const fs::path fixture_dir = kData / "ref" / "llama-quip-nvfp4a16";
  if (!fs::exists(source_dir) || !fs::exists(fixture_dir)) GTEST_SKIP() << "reference fixtures not present";
  const auto source = checkpoint::Checkpoint::open(source_dir);
  QuantizeOptions opts;
  opts.scheme = QuantScheme::Nvfp4A16;
  opts.hadamard = 128;
  const QuantizePlan plan = plan_quantization(source, opts);
  const fs::path out = fresh_dir("quip128");
  quantize_checkpoint(source, plan, out, checkpoint::kDefaultMaxShardBytes);
  const auto ours = checkpoint::Checkpoint::open(out);
  const auto ref = checkpoint::Checkpoint::open(fixture_dir);
  size_t packed = 0, matrices = 0;
  for (const std::string& name : ours.tensor_names()) {
    const bool matrix = name.ends_with(".v_input.weight");
    std::string ref_name = name;
    if (matrix) {
      ++matrices;
      ref_name = "model.layers.0.self_attn.q_proj.v_input.weight";
    }
    ASSERT_TRUE(ref.contains(ref_name)) << ref_name;
    const core::TensorView a = ours.tensor(name);
    const core::TensorView b = ref.tensor(ref_name);
    ASSERT_EQ(a.dtype, b.dtype) << name;
    ASSERT_EQ(a.shape, b.shape) << name;
    const auto mismatch = std::mismatch(a.bytes.begin(), a.bytes.end(), b.bytes.begin());
    EXPECT_TRUE(mismatch.first == a.bytes.end()) << name << ": first differing byte at " << (mismatch.first - a.bytes.begin());
    packed += name.ends_with(".weight_packed") ? 1 : 0;
  }
  EXPECT_EQ(packed, 14u);
  EXPECT_EQ(matrices, 1u);
  EXPECT_EQ(ours.tensor_names().size(), ref.tensor_names().size());
  EXPECT_EQ(ours.config()["quantization_config"]["transform_config"], ref.config()["quantization_config"]["transform_config"]);
  fs::remove_all(out);

  opts.hadamard = 48;
  EXPECT_THROW(plan_quantization(source, opts), UsageError);  // not 16/32/64/128
}

TEST(QuantizeMath, HadamardRotationMatchesFloat64AndIsOrthonormal) {
  const int64_t rows = 3, cols = 64, b = 32;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1));
  std::vector<float> rotated = w;
  rotate_weight_hadamard(rotated, rows, cols, b, core::DType::F32);
  double norm_in = 0, norm_out = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t blk = j / b * b;
      double want = 0;
      for (int64_t i = 0; i < b; ++i) {
        const double h = (__builtin_popcountll(static_cast<unsigned long long>(i & (j - blk))) & 1) ? -1.0 : 1.0;
        want += static_cast<double>(w[static_cast<size_t>(r * cols + blk + i)]) * h;
      }
      want /= std::sqrt(static_cast<double>(b));
      EXPECT_NEAR(rotated[static_cast<size_t>(r * cols + j)], want, 1e-6);
      norm_in += static_cast<double>(w[static_cast<size_t>(r * cols + j)]) * w[static_cast<size_t>(r * cols + j)];
      norm_out += static_cast<double>(rotated[static_cast<size_t>(r * cols + j)]) * rotated[static_cast<size_t>(r * cols + j)];
    }
  }
  EXPECT_NEAR(norm_in, norm_out, 1e-4);
  EXPECT_THROW(rotate_weight_hadamard(rotated, rows, cols, 48, core::DType::F32), UsageError);
}

// ---- 3. our committed output vs compressed-tensors ------------------------------------------------------------

TEST(QuantizedByFp4serve, ReferenceDequantMatchesCompressedTensorsBitForBit) {
  int checked = 0;
  for (const char* scheme : {"nvfp4a16", "w4a16"}) {
    // `fp4serve quantize --scheme <scheme>` of llama-bf16 writes exactly llm-compressor's folder
    // (QuantizeParity above, cli.quantize_nvfp4a16), so the reference decompression of our output is read
    // against that folder.
    const fs::path ckpt_dir = kData / "ref" / (std::string("llama-") + scheme);
    if (!fs::exists(ckpt_dir)) GTEST_SKIP() << "reference fixtures not present";
    const auto ckpt = checkpoint::Checkpoint::open(ckpt_dir);
    const checkpoint::SafetensorsFile golden(kData / "quantized-by-fp4serve" / scheme /
                                             "reference_dequant.safetensors");
    for (const auto& entry : golden.header().tensors) {
      if (!entry.name.starts_with(digest::kDigestPrefix)) continue;
      const std::string m = entry.name.substr(digest::kDigestPrefix.size());
      const DequantizedWeight d =
          std::string(scheme) == "nvfp4a16"
              ? dequantize_nvfp4(ckpt.tensor(m + ".weight_packed"), ckpt.tensor(m + ".weight_scale"),
                                 ckpt.tensor(m + ".weight_global_scale").load<float>(0),
                                 GlobalScaleConvention::Divisor, m)
              : dequantize_int4(ckpt.tensor(m + ".weight_packed"), ckpt.tensor(m + ".weight_scale"), nullptr,
                                nullptr, ckpt.tensor(m + ".weight_shape").load<int64_t>(1), 128, m);
      ASSERT_EQ(digest::digest_dtype(golden, m), DType::BF16) << m;
      const digest::DigestComparison r =
          digest::compare_with_digest(golden, m, digest::reference_bytes(DType::BF16, d.values), d.rows, d.cols);
      EXPECT_TRUE(r.shape_equal) << m;
      EXPECT_TRUE(r.hash_equal) << m << ": SHA-256 of our BF16 bytes differs from compressed-tensors'";
      EXPECT_EQ(r.elements_differing, 0) << m << ": first difference at " << r.first_difference;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 28);  // 14 quantized linears of llama-bf16 per scheme
}

}  // namespace
}  // namespace fp4serve::quant
