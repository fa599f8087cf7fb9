// SPDX-License-Identifier: Apache-2.0
// RoPE against (1) cos/sin tables written by transformers' own rotary modules (tools/gen_rope_reference.py →
// tests/data/rope/hf_rope_reference.json), which also checks parse_rope_scaling on those config blocks, and
// (2) a float64 re-derivation of the inverse-frequency formulas written here, and (3) hand-checked values. The
// table is model::RopeCache (model/rope_table.h, device-neutral); the rotation is the CPU kernel apply_rope.
#include <cmath>
#include <fstream>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels/ops_test_util.h"
#include "backends/cpu/kernels/rope.h"
#include "fp4serve/error.h"
#include "model/rope_table.h"

namespace fp4serve::kernels {
namespace {

using model::parse_rope_scaling;
using model::parse_rope_theta;
using model::rope_attention_factor;
using model::rope_inv_freq;
using model::RopeCache;
using model::RopeScaling;
using nlohmann::json;
using testing::random_nonzero;

// The CPU rotation's view of a table.
RopeTable rope_table_of(const RopeCache& c) { return {c.cos(0), c.sin(0), c.rotary_dim(), c.max_positions()}; }

json load_reference() {
  std::ifstream in(std::string(FP4SERVE_TEST_DATA) + "/rope/hf_rope_reference.json");
  EXPECT_TRUE(in.good());
  return json::parse(in);
}

TEST(Rope, CacheMatchesTransformersTables) {
  const json ref = load_reference();
  ASSERT_EQ(ref["cases"].size(), 6u);
  for (const json& c : ref["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const RopeScaling s = parse_rope_scaling(c["config"]);
    const double theta = parse_rope_theta(c["config"]);
    const int64_t rd = c["rotary_dim"];
    const std::vector<int64_t> positions = c["positions"];
    EXPECT_NEAR(rope_attention_factor(s), c["attention_scaling"].get<double>(), 1e-12);
    // inv_freq: transformers evaluates the formulas in fp32 (llama3's smoothing band loses ~2 ulp to
    // cancellation); ours is float64 rounded once. Allow 4 fp32 ulp.
    const std::vector<double> inv = rope_inv_freq(rd, theta, s);
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double hf = c["inv_freq"][i];
      ASSERT_NEAR(inv[i], hf, std::abs(hf) * 4.8e-7) << "inv_freq " << i;
    }
    const RopeCache cache(rd, theta, s, positions.back() + 1);
    for (size_t p = 0; p < positions.size(); ++p) {
      const float* cs = cache.cos(positions[p]);
      const float* sn = cache.sin(positions[p]);
      for (int64_t i = 0; i < rd / 2; ++i) {
        // Both sides round the angle to fp32 the same way; what remains is the inv_freq difference (≤ 4 ulp,
        // times the position), one angle rounding that may go the other way, and ~1 ulp of cos/sin.
        const double angle_ulp = 5 * std::ldexp(1.0, -24) * std::abs(inv[i]) * double(positions[p]);
        const double tol = (2.5e-7 + angle_ulp) * cache.attention_factor();
        ASSERT_NEAR(cs[i], c["cos"][p][i].get<double>(), tol) << "pos " << positions[p] << " i " << i;
        ASSERT_NEAR(sn[i], c["sin"][p][i].get<double>(), tol) << "pos " << positions[p] << " i " << i;
      }
    }
  }
}

// Float64 re-derivation of transformers' inverse frequencies (modeling_rope_utils.py), written as the paper
// formulas: wavelength bands for llama3, correction-dimension ramp for yarn.
std::vector<double> inv_freq_ref(int64_t dim, double theta, const RopeScaling& s) {
  std::vector<double> out;
  for (int64_t k = 0; k < dim; k += 2) {
    const double base = std::pow(theta, -double(k) / double(dim));
    double f = base;
    if (s.kind == RopeScaling::Kind::Linear) f = base / s.factor;
    if (s.kind == RopeScaling::Kind::Llama3) {
      const double wl = 2 * std::numbers::pi / base;
      const double lo_wl = s.original_max_position_embeddings / s.low_freq_factor;
      const double hi_wl = s.original_max_position_embeddings / s.high_freq_factor;
      if (wl > lo_wl) {
        f = base / s.factor;
      } else if (wl >= hi_wl) {
        const double t = (s.original_max_position_embeddings / wl - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
        f = t * base + (1 - t) * base / s.factor;
      }
    }
    if (s.kind == RopeScaling::Kind::Yarn) {
      auto dim_for = [&](double rot) {
        return double(dim) * std::log(s.original_max_position_embeddings / (2 * std::numbers::pi * rot)) /
               (2 * std::log(theta));
      };
      double a = dim_for(s.beta_fast), b = dim_for(s.beta_slow);
      if (s.truncate) a = std::floor(a), b = std::ceil(b);
      a = std::max(a, 0.0);
      b = std::min(b, double(dim - 1));
      if (a == b) b += 0.001;
      const double ramp = std::min(1.0, std::max(0.0, (double(k / 2) - a) / (b - a)));
      f = ramp * base / s.factor + (1 - ramp) * base;
    }
    out.push_back(f);
  }
  return out;
}

TEST(Rope, InvFreqMatchesFloat64Rederivation) {
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::Llama3;
  llama3.factor = 8, llama3.low_freq_factor = 1, llama3.high_freq_factor = 4;
  llama3.original_max_position_embeddings = 8192;
  RopeScaling yarn;
  yarn.kind = RopeScaling::Kind::Yarn;
  yarn.factor = 32, yarn.original_max_position_embeddings = 4096;
  RopeScaling yarn_nt = yarn;
  yarn_nt.truncate = false;
  RopeScaling linear;
  linear.kind = RopeScaling::Kind::Linear;
  linear.factor = 2.5;
  for (const auto& [s, theta, dim] : {std::tuple{RopeScaling{}, 10000.0, 64}, std::tuple{linear, 10000.0, 46},
                                      std::tuple{llama3, 500000.0, 128}, std::tuple{yarn, 150000.0, 64},
                                      std::tuple{yarn_nt, 150000.0, 64}}) {
    const std::vector<double> got = rope_inv_freq(dim, theta, s);
    const std::vector<double> want = inv_freq_ref(dim, theta, s);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-13 * want[i]) << dim << " " << i;
  }
  // llama3 bands of Llama-3.1 (theta 5e5, dim 128): frequency 0 is high (kept), 63 low (÷8), 30 in between.
  const std::vector<double> l3 = rope_inv_freq(128, 500000.0, llama3);
  EXPECT_DOUBLE_EQ(l3[0], 1.0);
  EXPECT_DOUBLE_EQ(l3[63], std::pow(500000.0, -126.0 / 128) / 8);
  const double b30 = std::pow(500000.0, -60.0 / 128);
  EXPECT_GT(l3[30], b30 / 8);
  EXPECT_LT(l3[30], b30);
}

TEST(Rope, HandCheckedPositionsZeroAndOne) {
  // Default theta 10000, rotary_dim 4: inv_freq = [1, 0.01]. Position 0 → cos 1, sin 0; position 1 →
  // cos(1) = 0.540302306, sin(1) = 0.841470985, cos(0.01) = 0.999950000, sin(0.01) = 0.009999833.
  const RopeCache c(4, 10000.0, RopeScaling{}, 2);
  EXPECT_EQ(c.cos(0)[0], 1.0f);
  EXPECT_EQ(c.sin(0)[1], 0.0f);
  EXPECT_NEAR(c.cos(1)[0], 0.540302306f, 1e-7f);
  EXPECT_NEAR(c.sin(1)[0], 0.841470985f, 1e-7f);
  EXPECT_NEAR(c.cos(1)[1], 0.999950000f, 1e-7f);
  EXPECT_NEAR(c.sin(1)[1], 0.009999833f, 1e-9f);
  // GPT-OSS yarn: attention factor 0.1·ln 32 + 1 = 1.346573590 multiplies cos and sin; position 0 → (1.3466, 0).
  RopeScaling y;
  y.kind = RopeScaling::Kind::Yarn;
  y.factor = 32, y.original_max_position_embeddings = 4096, y.truncate = false;
  const RopeCache g(64, 150000.0, y, 2);
  EXPECT_NEAR(g.attention_factor(), 1.346573590f, 1e-7f);
  EXPECT_NEAR(g.cos(0)[0], 1.346573590f, 1e-6f);
  EXPECT_EQ(g.sin(0)[5], 0.0f);
  EXPECT_NEAR(g.cos(1)[0], 0.540302306 * 1.346573590, 2e-7);  // frequency 0 is never interpolated
  EXPECT_THROW(g.cos(2), UsageError);
  EXPECT_THROW(g.sin(-1), UsageError);
}

// apply_rope against float64 rotation with transformers' own cos/sin, both layouts, partial rotary.
TEST(Rope, ApplyRotatesLikeTransformers) {
  const json ref = load_reference();
  for (const json& c : ref["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t rd = c["rotary_dim"];
    const int64_t half = rd / 2, head_dim = rd + 6, heads = 3;
    const std::vector<int64_t> positions = c["positions"];
    const int64_t tokens = static_cast<int64_t>(positions.size());
    const RopeCache cache(rd, parse_rope_theta(c["config"]), parse_rope_scaling(c["config"]), positions.back() + 1);
    const std::vector<float> x = random_nonzero(tokens * heads * head_dim, 3);
    for (RopeLayout layout : {RopeLayout::NeoX, RopeLayout::GptJ}) {
      std::vector<float> y = x;
      apply_rope(y.data(), tokens, heads, head_dim, positions.data(), rope_table_of(cache), layout);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const float* in = x.data() + (t * heads + h) * head_dim;
          const float* out = y.data() + (t * heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const double cs = c["cos"][t][i], sn = c["sin"][t][i];
            const int64_t a = layout == RopeLayout::NeoX ? i : 2 * i;
            const int64_t b = layout == RopeLayout::NeoX ? i + half : 2 * i + 1;
            const double want_a = in[a] * cs - in[b] * sn, want_b = in[b] * cs + in[a] * sn;
            // |x| ≤ 1, attention factor ≤ 1.35: the table difference bound above times |x_a| + |x_b|, plus
            // fp32 rounding of the rotation.
            const double angle_ulp = std::ldexp(1.0, -23) * double(positions[t]);
            const double tol = 2 * 1.35 * (2.5e-7 + angle_ulp) + 3e-7;
            ASSERT_NEAR(out[a], want_a, tol) << "token " << t << " head " << h << " i " << i;
            ASSERT_NEAR(out[b], want_b, tol) << "token " << t << " head " << h << " i " << i;
          }
          for (int64_t i = rd; i < head_dim; ++i) ASSERT_EQ(out[i], in[i]) << "pass-through dim " << i;
        }
      }
    }
  }
}

TEST(Rope, ParsesConfigVariants) {
  // rope_parameters (transformers v5 spelling) with the theta inside; legacy "type"; null block.
  const json v5 = json::parse(R"({"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  EXPECT_EQ(parse_rope_scaling(v5).kind, RopeScaling::Kind::None);
  EXPECT_EQ(parse_rope_theta(v5), 1e6);
  EXPECT_EQ(parse_rope_theta(json::parse(R"({"rope_scaling": null})")), 10000.0);
  const json llama3_default_ctx = json::parse(
      R"({"max_position_embeddings": 4096, "rope_theta": 5e5,
          "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}})");
  EXPECT_EQ(parse_rope_scaling(llama3_default_ctx).original_max_position_embeddings, 4096);
  const json yarn_no_factor = json::parse(
      R"({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": null,
          "original_max_position_embeddings": 4096, "beta_fast": null, "mscale": 0.707}})");
  const RopeScaling y = parse_rope_scaling(yarn_no_factor);
  EXPECT_EQ(y.factor, 8.0);
  EXPECT_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(y.mscale_all_dim, 0.0);  // mscale alone does not enable the ratio
  EXPECT_NEAR(rope_attention_factor(y), 0.1 * std::log(8.0) + 1, 1e-15);

  EXPECT_THROW(parse_rope_scaling(json::parse(R"({"rope_scaling": {"rope_type": "dynamic", "factor": 2}})")),
               UnsupportedError);
  EXPECT_THROW(parse_rope_scaling(json::parse(R"({"rope_scaling": {"rope_type": "longrope"}})")), UnsupportedError);
  EXPECT_THROW(parse_rope_scaling(json::parse(
                   R"({"rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {}}})")),
               UnsupportedError);
  EXPECT_THROW(parse_rope_scaling(json::parse(R"({"rope_scaling": {"rope_type": "linear"}})")), FormatError);
  EXPECT_THROW(parse_rope_scaling(json::parse(R"({"rope_scaling": {"rope_type": "linear", "factor": "2"}})")),
               FormatError);
  EXPECT_THROW(parse_rope_scaling(json::parse(R"({"rope_scaling": 3})")), FormatError);
}

TEST(Rope, RejectsBadArguments) {
  EXPECT_THROW(RopeCache(5, 10000.0, RopeScaling{}, 8), UsageError);
  EXPECT_THROW(RopeCache(8, 0.0, RopeScaling{}, 8), UsageError);
  const RopeCache c(8, 10000.0, RopeScaling{}, 8);
  std::vector<float> x(2 * 8, 1.0f);
  const int64_t bad[2] = {3, 8};
  EXPECT_THROW(apply_rope(x.data(), 2, 1, 8, bad, rope_table_of(c), RopeLayout::NeoX), UsageError);
  const int64_t ok[2] = {3, 7};
  // rotary_dim > head_dim
  EXPECT_THROW(apply_rope(x.data(), 2, 1, 6, ok, rope_table_of(c), RopeLayout::NeoX), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels
