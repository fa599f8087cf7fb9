// SPDX-License-Identifier: Apache-2.0
#include "app/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "fp4serve/error.h"
#include "kernels/hadamard.h"
#include "model/loader.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {
namespace {

// Keeps max |x| of the input of every linear module (static min-max: one amax over all calibration tokens),
// after the online Hadamard transform when the checkpoint being written declares one.
class AmaxObserver final : public model::ActivationObserver {
 public:
  AmaxObserver(int64_t hadamard_block, bool hessians) : hadamard_block_(hadamard_block), hessians_(hessians) {}

  void observe(const std::vector<std::string>& modules, const float* x, int64_t m, int64_t k) override {
    // A layer whose width the block does not divide cannot be quantized with the transform (the quantize plan
    // refuses it before calibration), so an unrotated input here belongs to an unquantized layer.
    if (hadamard_block_ > 0 && k % hadamard_block_ == 0) {
      rotated_.assign(x, x + m * k);
      kernels::fwht_blocks(rotated_.data(), m, k, hadamard_block_);
      x = rotated_.data();
    }
    float amax = 0.0f;
    for (int64_t i = 0; i < m * k; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (const std::string& name : modules) {
      float& slot = amax_[name];
      slot = std::max(slot, amax);
    }
    if (!hessians_ || modules.empty()) return;
    // One accumulator per distinct input (a fused group's modules all read this x).
    std::shared_ptr<quant::GptqHessian>& h = shared_[modules.front()];
    if (h == nullptr) h = std::make_shared<quant::GptqHessian>(k);
    h->add(x, m);
    for (const std::string& name : modules) hessian_[name] = h;
  }
  const std::map<std::string, float>& amax() const { return amax_; }
  const quant::HessianMap& hessians() const { return hessian_; }

 private:
  int64_t hadamard_block_;
  bool hessians_;
  std::vector<float> rotated_;
  std::map<std::string, float> amax_;
  std::map<std::string, std::shared_ptr<quant::GptqHessian>> shared_;
  quant::HessianMap hessian_;
};

// Calibration samples are independent sequences of this many tokens, as llm-compressor feeds its dataset.
constexpr int64_t kSampleTokens = 512;

}  // namespace

std::map<std::string, float> observe_input_amax(const checkpoint::Checkpoint& source,
                                                const std::vector<std::string>& modules,
                                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                                int64_t hadamard_block) {
  return observe_inputs(source, modules, calibration_text, max_tokens, hadamard_block, false).input_amax;
}

CalibrationStats observe_inputs(const checkpoint::Checkpoint& source, const std::vector<std::string>& modules,
                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                int64_t hadamard_block, bool hessians) {
  std::ifstream in(calibration_text, std::ios::binary);
  if (!in) throw UsageError(fmt::format("--calibration {}: cannot open for reading", calibration_text.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw UsageError(fmt::format("--calibration {}: the file is empty", calibration_text.string()));

  model::LoadOptions options;
  options.progress = false;
  const model::LoadedModel loaded = model::load_model(source.root(), options);
  const runtime::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::vector<int32_t> tokens = tokenizer.encode(text.str(), true);
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(static_cast<size_t>(max_tokens));
  if (tokens.size() < 2) {
    throw UsageError(fmt::format("--calibration {}: {} token(s) are too few to calibrate on", calibration_text.string(),
                                 tokens.size()));
  }

  AmaxObserver observer(hadamard_block, hessians);
  loaded.decoder->set_observer(&observer);
  model::KvCache cache = loaded.decoder->make_cache(kSampleTokens, 1);
  for (size_t begin = 0; begin < tokens.size(); begin += kSampleTokens) {
    const size_t count = std::min<size_t>(kSampleTokens, tokens.size() - begin);
    const int slot = cache.acquire();
    const model::SequenceChunk chunk{slot, 0, std::span(tokens).subspan(begin, count), false};
    loaded.decoder->forward(std::span(&chunk, 1), cache);
    cache.release(slot);
  }
  loaded.decoder->set_observer(nullptr);

  CalibrationStats out;
  for (const std::string& name : modules) {
    const auto it = observer.amax().find(name);
    if (it == observer.amax().end()) {
      throw FormatError(fmt::format("calibration: module '{}' was never run by the model, so its input was not observed",
                                    name));
    }
    out.input_amax[name] = it->second;
    if (hessians) out.hessians[name] = observer.hessians().at(name);
  }
  return out;
}

}  // namespace fp4serve::app
