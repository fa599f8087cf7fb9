// SPDX-License-Identifier: Apache-2.0
// `quantize --scheme nvfp4 --hadamard b` calibration: the observed amax of every layer input must be the amax of
// the input AFTER the online transform the checkpoint declares. Reference: the raw inputs recorded from the same
// model, rotated here in float64 by an explicitly built normalized Sylvester matrix.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/calibration.h"
#include "backends/load_model.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {
namespace {

namespace fs = std::filesystem;
const fs::path kLlama = fs::path(FP4SERVE_TEST_DATA) / "ref" / "llama-bf16";
const fs::path kText = fs::path(FP4SERVE_TEST_DATA) / "tokenizers" / "multilingual.txt";

// amax over every input of each module, rotated in float64 by H_b/√b per b-wide block (b = 0: raw).
class RotatedAmaxReference final : public model::ActivationObserver {
 public:
  explicit RotatedAmaxReference(int64_t b) : b_(b) {
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < b; ++j) {
        const bool odd = std::popcount(static_cast<uint64_t>(i & j)) % 2 != 0;
        h_.push_back((odd ? -1.0 : 1.0) / std::sqrt(double(b)));
      }
    }
  }
  void observe(const std::vector<std::string>& modules, const float* x, int64_t m, int64_t k) override {
    double amax = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t blk = 0; blk < k; blk += b_) {
        for (int64_t j = 0; j < b_; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < b_; ++i) acc += double(x[r * k + blk + i]) * h_[size_t(i * b_ + j)];
          amax = std::max(amax, std::fabs(acc));
        }
      }
    }
    for (const auto& name : modules) amax_[name] = std::max(amax_[name], amax);
  }
  std::map<std::string, double> amax_;

 private:
  int64_t b_;
  std::vector<double> h_;
};

TEST(Calibration, HadamardAmaxIsTheAmaxOfTheRotatedInput) {
  const auto source = checkpoint::Checkpoint::open(kLlama);
  const std::vector<std::string> modules = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                                            "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.gate_proj"};
  constexpr int64_t kTokens = 200, kBlock = 32;
  const auto rotated = observe_input_amax(source, modules, kText, kTokens, kBlock);
  const auto raw = observe_input_amax(source, modules, kText, kTokens, 0);

  // Same tokens through the same model, recorded by the reference observer (one 200-token sample).
  model::LoadOptions options;
  const model::LoadedModel loaded = model::load_model(kLlama, options);
  std::ifstream in(kText, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> tokens = runtime::load_tokenizer(loaded.checkpoint).encode(text, true);
  tokens.resize(kTokens);
  RotatedAmaxReference reference(kBlock);
  loaded.decoder->set_observer(&reference);
  model::KvCache cache = loaded.decoder->make_cache(kTokens, 1);
  const model::SequenceChunk chunk{cache.acquire(), 0, tokens, false};
  loaded.decoder->forward(std::span(&chunk, 1), cache);
  loaded.decoder->set_observer(nullptr);

  for (const auto& name : modules) {
    const double want = reference.amax_.at(name);
    EXPECT_NEAR(rotated.at(name), want, 1e-5 * want) << name;
    // The rotation moves the amax on these inputs: a calibration that ignored it would fail above.
    EXPECT_GT(std::fabs(raw.at(name) - want), 1e-3 * want) << name;
  }
}

}  // namespace
}  // namespace fp4serve::app
