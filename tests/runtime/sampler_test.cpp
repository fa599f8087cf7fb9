// SPDX-License-Identifier: Apache-2.0
// The sampler against transformers' own logits processors and warpers (tools/reference/fx_sampling.py writes
// tests/data/sampling/sampling.json): the filtered, penalized distribution of every case matches within 1e-6,
// greedy picks the lowest id among ties, seeded draws follow the reference distribution (chi-square over 20k
// draws at a fixed seed), and the same seed gives the same tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "fp4serve/error.h"
#include "runtime/sampler.h"

namespace fp4serve::runtime {
namespace {

using nlohmann::json;

struct Case {
  std::string name;
  std::vector<float> logits;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  SamplingParams params;
  std::vector<double> probs;  // the reference distribution
};

const json& fixture() {
  static const json j = checkpoint::read_json_object_file(std::string(FP4SERVE_TEST_DATA) + "/sampling/sampling.json");
  return j;
}

std::vector<Case> cases() {
  const json& j = fixture();
  std::vector<Case> out;
  for (size_t i = 0; i < j.at("cases").size(); ++i) {
    const json& c = j["cases"][i];
    const json& row = j.at("rows").at(c.at("row").get<std::string>());
    Case k;
    k.logits = row.at("logits").get<std::vector<float>>();
    for (int64_t t : row.at("neg_inf").get<std::vector<int64_t>>()) {
      k.logits.at(static_cast<size_t>(t)) = -std::numeric_limits<float>::infinity();
    }
    k.prompt = c.at("prompt").get<std::vector<int32_t>>();
    k.output = c.at("output").get<std::vector<int32_t>>();
    const json& p = c.at("params");
    k.params.temperature = p.at("temperature").get<float>();
    k.params.top_k = p.at("top_k").get<int>();
    k.params.top_p = p.at("top_p").get<float>();
    k.params.min_p = p.at("min_p").get<float>();
    k.params.repetition_penalty = p.at("repetition_penalty").get<float>();
    k.params.presence_penalty = p.at("presence_penalty").get<float>();
    k.params.frequency_penalty = p.at("frequency_penalty").get<float>();
    k.params.seed = 1234 + i;
    k.probs = c.at("probs").get<std::vector<double>>();
    k.name = "case" + std::to_string(i) + "_" + c["row"].get<std::string>() + "_" + p.dump();
    out.push_back(std::move(k));
  }
  return out;
}

// A sampler that has seen the case's prompt and output, as generate() feeds it.
Sampler primed(const Case& c) {
  Sampler s(c.params);
  s.observe_prompt(c.prompt);
  for (int32_t t : c.output) s.observe(t);
  return s;
}

TEST(SamplerFixture, CoversTheEdgeCases) {
  const auto all = cases();
  ASSERT_GE(all.size(), 30u);
  int with_ties_kept = 0, greedy = 0, with_neg_inf = 0;
  for (const auto& c : all) {
    int support = 0;
    for (double p : c.probs) support += p > 0 ? 1 : 0;
    if (c.params.top_k > 0 && support > c.params.top_k) ++with_ties_kept;
    if (c.params.temperature == 0.0f) ++greedy;
    for (float x : c.logits) {
      if (std::isinf(x)) {
        ++with_neg_inf;
        break;
      }
    }
  }
  EXPECT_GE(with_ties_kept, 2);
  EXPECT_GE(greedy, 4);
  EXPECT_GE(with_neg_inf, 8);
}

TEST(Sampler, DistributionMatchesTransformersWarpers) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Sampler s = primed(c);
    std::vector<float> logits = c.logits;
    const std::vector<float> got = s.distribution(logits);
    ASSERT_EQ(got.size(), c.probs.size());
    double sum = 0.0;
    for (size_t v = 0; v < got.size(); ++v) {
      EXPECT_NEAR(got[v], c.probs[v], 1e-6) << "token " << v;
      EXPECT_EQ(got[v] > 0.0f, c.probs[v] > 0.0) << "token " << v << " kept/filtered differently";
      sum += got[v];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST(Sampler, GreedyIsTheReferenceArgmax) {
  for (const Case& c : cases()) {
    if (c.params.temperature != 0.0f) continue;
    SCOPED_TRACE(c.name);
    Sampler s = primed(c);
    std::vector<float> logits = c.logits;
    const int32_t token = s.sample(logits);
    EXPECT_EQ(c.probs.at(static_cast<size_t>(token)), 1.0);
  }
}

TEST(Sampler, GreedyTiesGoToTheLowestId) {
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  std::vector<float> a = {-inf, 0.5f, 3.0f, -1.0f, 3.0f, 3.0f};
  EXPECT_EQ(s.sample(a), 2);
  std::vector<float> b = {7.0f, 7.0f};
  EXPECT_EQ(s.sample(b), 0);
  std::vector<float> c = {-inf, -inf, -2.0f};
  EXPECT_EQ(s.sample(c), 2);
}

// Upper 0.9999 quantile of chi-square with k degrees of freedom, Wilson & Hilferty (1931) cube-root normal
// approximation (within a few percent even for k = 1, 2). The draws are seeded, so the test is deterministic;
// the 1e-4 level keeps it passing on another standard library, whose uniform_real_distribution may differ.
double chi_square_bound(int k) {
  const double z = 3.719016;  // standard normal 0.9999 quantile
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Pearson chi-square of `counts` against `probs` over `draws`, bins with an expected count under 5 pooled.
// Returns {statistic, degrees of freedom}.
std::pair<double, int> chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int draws) {
  double stat = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
  int bins = 0;
  for (size_t v = 0; v < probs.size(); ++v) {
    const double expected = probs[v] * draws;
    if (probs[v] == 0.0) continue;
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_observed += counts[v];
      continue;
    }
    stat += (counts[v] - expected) * (counts[v] - expected) / expected;
    ++bins;
  }
  if (pooled_expected >= 5.0) {
    stat += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++bins;
  } else {
    // Too rare to test as a bin; Poisson(< 5) exceeds 20 with probability < 1e-6.
    EXPECT_LE(pooled_observed, 20.0) << "rare tokens drawn far too often";
  }
  return {stat, bins - 1};
}

TEST(Sampler, SeededDrawsFollowTheReferenceDistribution) {
  constexpr int kDraws = 20000;
  int checked = 0;
  for (const Case& c : cases()) {
    if (c.params.temperature == 0.0f) continue;
    int support = 0;
    for (double p : c.probs) support += p > 0 ? 1 : 0;
    if (support < 2 || c.probs.size() > 100) continue;  // the vocab-1000 rows would need far more draws per bin
    SCOPED_TRACE(c.name);
    Sampler s = primed(c);
    std::vector<int> counts(c.probs.size(), 0);
    for (int d = 0; d < kDraws; ++d) {
      std::vector<float> logits = c.logits;
      counts.at(static_cast<size_t>(s.sample(logits))) += 1;
    }
    for (size_t v = 0; v < counts.size(); ++v) {
      if (c.probs[v] == 0.0) {
        EXPECT_EQ(counts[v], 0) << "filtered token " << v << " was drawn";
      }
    }
    const auto [stat, dof] = chi_square(counts, c.probs, kDraws);
    ASSERT_GE(dof, 1);
    EXPECT_LT(stat, chi_square_bound(dof)) << "dof " << dof;
    // The bound has power: the same draws are rejected against the reference with 10% of the most likely
    // token's probability moved to the least likely kept token.
    std::vector<double> shifted = c.probs;
    size_t top = 0, least = 0;
    for (size_t v = 0; v < shifted.size(); ++v) {
      if (shifted[v] > shifted[top]) top = v;
      if (shifted[v] > 0 && (shifted[least] == 0 || shifted[v] <= shifted[least])) least = v;  // the last minimum
    }
    shifted[least] += 0.1 * shifted[top];
    shifted[top] *= 0.9;
    const auto [wrong, wrong_dof] = chi_square(counts, shifted, kDraws);
    EXPECT_GT(wrong, chi_square_bound(wrong_dof)) << "the test could not tell a 10% shift";
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(Sampler, NanLogitsAreNeverSampledAndNothingFiniteGivesTheLowestId) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.seed = 3;
  Sampler s(p);
  std::vector<float> row = {nan, 1.0f, nan, 2.0f, -inf};
  std::vector<float> probs = s.distribution(row);
  const double e = std::exp(1.0);  // softmax of {1, 2}
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_EQ(probs[2], 0.0f);
  EXPECT_NEAR(probs[1], 1.0 / (1.0 + e), 1e-7);
  EXPECT_NEAR(probs[3], e / (1.0 + e), 1e-7);
  for (int i = 0; i < 200; ++i) {
    row = {nan, 1.0f, nan, 2.0f, -inf};
    const int32_t t = s.sample(row);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  p.temperature = 0.0f;
  Sampler greedy(p);
  row = {nan, 1.0f, nan, 2.0f, -inf};
  EXPECT_EQ(greedy.sample(row), 3);
  for (float fill : {-inf, nan}) {
    std::vector<float> none(6, fill);
    EXPECT_EQ(s.sample(none), 0);
    none.assign(6, fill);
    EXPECT_EQ(s.distribution(none), (std::vector<float>{1, 0, 0, 0, 0, 0}));
    none.assign(6, fill);
    EXPECT_EQ(greedy.sample(none), 0);
  }
  // Many NaNs in a large row with top-k and top-p: no crash, only finite tokens drawn.
  SamplingParams q;
  q.seed = 4;
  q.top_k = 50;
  q.top_p = 0.9f;
  Sampler big(q);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> wide(4096);
    for (size_t v = 0; v < wide.size(); ++v) wide[v] = v % 3 == 0 ? nan : std::sin(static_cast<float>(v) * 0.37f) * 4.0f;
    const int32_t t = big.sample(wide);
    EXPECT_NE(t % 3, 0) << t;
  }
}

TEST(Sampler, SameSeedSameTokens) {
  const Case c = cases().at(1);  // vocab 7, plain temperature 1
  auto draw = [&](uint64_t seed) {
    SamplingParams p = c.params;
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> logits = c.logits;
      tokens.push_back(s.sample(logits));
    }
    return tokens;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, DistributionConsumesNoRandomness) {
  const Case c = cases().at(1);
  SamplingParams p = c.params;
  p.seed = 5;
  Sampler a(p), b(p);
  std::vector<float> scratch = c.logits;
  (void)a.distribution(scratch);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> la = c.logits, lb = c.logits;
    ASSERT_EQ(a.sample(la), b.sample(lb)) << "draw " << i;
  }
}

TEST(Sampler, PenaltiesCountOutputOnlyAndRepetitionAlsoThePrompt) {
  // Hand-computed: repetition 2 on prompt token 0 (positive: halved) and output token 1 (negative: doubled);
  // frequency 0.5 × 2 occurrences + presence 0.25 on token 1 only.
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  Sampler s(p);
  const std::vector<int32_t> prompt = {0};
  s.observe_prompt(prompt);
  s.observe(1);
  s.observe(1);
  std::vector<float> logits = {4.0f, -1.0f, 1.0f};
  (void)s.sample(logits);
  EXPECT_FLOAT_EQ(logits[0], 2.0f);
  EXPECT_FLOAT_EQ(logits[1], -1.0f * 2.0f - 0.25f - 2 * 0.5f);
  EXPECT_FLOAT_EQ(logits[2], 1.0f);
}

TEST(Sampler, RejectsBadParametersAndEmptyLogits) {
  auto bad = [](auto set) {
    SamplingParams p;
    set(p);
    EXPECT_THROW(Sampler{p}, UsageError);
  };
  bad([](SamplingParams& p) { p.temperature = -0.1f; });
  bad([](SamplingParams& p) { p.temperature = std::numeric_limits<float>::quiet_NaN(); });
  bad([](SamplingParams& p) { p.top_p = 0.0f; });
  bad([](SamplingParams& p) { p.top_p = 1.5f; });
  bad([](SamplingParams& p) { p.min_p = -0.5f; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; });
  bad([](SamplingParams& p) { p.presence_penalty = 2.5f; });
  bad([](SamplingParams& p) { p.frequency_penalty = -3.0f; });
  Sampler s(SamplingParams{});
  std::vector<float> empty;
  EXPECT_THROW(s.sample(empty), UsageError);
  EXPECT_THROW(s.distribution(empty), UsageError);
}

TEST(Sampler, GenerationConfigDefaults) {
  EXPECT_EQ(sampling_defaults(json::parse(R"({"do_sample": false, "temperature": 0.6})")).temperature, 0.0f);
  EXPECT_EQ(sampling_defaults(json::parse(R"({"temperature": 0.6})")).temperature, 0.0f);
  const SamplingParams p =
      sampling_defaults(json::parse(R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05})"));
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
}

// The server's defaults follow vLLM (ModelConfig.get_diff_sampling_param): the sampling fields a generation config
// sets to a non-default value, whatever do_sample says; OpenAI's neutral values (temperature 1) for the rest.
TEST(Sampler, ServingDefaultsFollowVllm) {
  const ServingDefaults none = serving_defaults(json());  // --generation-config vllm, or no file
  EXPECT_EQ(none.sampling.temperature, 1.0f);
  EXPECT_EQ(none.sampling.top_k, 0);
  EXPECT_EQ(none.max_tokens, std::nullopt);
  EXPECT_TRUE(none.taken.empty());
  // SmolLM2's file sets no sampling field: a request without temperature samples at 1.0, as under vLLM.
  EXPECT_EQ(serving_defaults(json::parse(R"({"bos_token_id": 1, "eos_token_id": 2})")).sampling.temperature, 1.0f);
  // do_sample: false does not make it greedy (transformers' rule, sampling_defaults, is not vLLM's).
  const ServingDefaults qwen3 = serving_defaults(json::parse(
      R"({"do_sample": false, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0, "max_new_tokens": 512})"));
  EXPECT_FLOAT_EQ(qwen3.sampling.temperature, 0.6f);
  EXPECT_EQ(qwen3.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(qwen3.sampling.top_p, 0.95f);
  EXPECT_EQ(qwen3.max_tokens, 512);
  EXPECT_EQ(qwen3.taken, (std::vector<std::string>{"temperature=0.6", "top_k=20", "top_p=0.95", "min_p=0",
                                                   "max_new_tokens=512"}));
  // Values equal to transformers' GenerationConfig defaults never reach vLLM (to_diff_dict drops them): top_k 50
  // is not applied, temperature 1.0 and repetition_penalty 1.0 change nothing.
  const ServingDefaults plain = serving_defaults(json::parse(R"({"top_k": 50, "temperature": 1.0, "repetition_penalty": 1.1})"));
  EXPECT_EQ(plain.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(plain.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(plain.taken, (std::vector<std::string>{"repetition_penalty=1.1"}));
  EXPECT_THROW(serving_defaults(json::parse(R"({"temperature": -1})")), UsageError);
}

}  // namespace
}  // namespace fp4serve::runtime
