// SPDX-License-Identifier: Apache-2.0
#include "app/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "fp4serve/error.h"
#include "backends/cpu/kernels/hadamard.h"
#include "backends/load_model.h"
#include "runtime/text_setup.h"

namespace fp4serve::app {
namespace {

// Keeps max |x| of the input of every linear module (static min-max: one amax over all calibration tokens),
// after the online Hadamard transform when the checkpoint being written declares one.
class AmaxObserver final : public model::ActivationObserver {
 public:
  AmaxObserver(int64_t hadamard_block, bool hessians, int64_t layers, const CalibrationProgress& progress)
      : hadamard_block_(hadamard_block), hessians_(hessians), layers_(layers), progress_(progress) {}

  /// Starts sample `index` of `count` (progress counts layer passes).
  void start_sample(int64_t index, int64_t count) {
    sample_ = index;
    samples_ = count;
    layer_ = -1;
  }
  /// The sample's last layer has run.
  void finish_sample() {
    if (progress_) progress_((sample_ + 1) * layers_, samples_ * layers_);
  }

  void observe(const std::vector<std::string>& modules, const float* x, int64_t m, int64_t k) override {
    report_layer(modules.empty() ? std::string() : modules.front());
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
  // The first input seen of layer L (model.layers.L.…) means layers 0 … L−1 of this sample are done.
  void report_layer(const std::string& module) {
    constexpr std::string_view kPrefix = "model.layers.";
    if (!progress_ || !module.starts_with(kPrefix)) return;
    const int64_t layer = std::strtoll(module.c_str() + kPrefix.size(), nullptr, 10);
    if (layer <= layer_) return;
    layer_ = layer;
    progress_(sample_ * layers_ + layer, samples_ * layers_);
  }

  int64_t hadamard_block_;
  bool hessians_;
  int64_t layers_;
  const CalibrationProgress& progress_;
  int64_t sample_ = 0, samples_ = 1, layer_ = -1;
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
                                                int64_t hadamard_block, plan::DeviceChoice device,
                                                const CalibrationProgress& progress) {
  return observe_inputs(source, modules, calibration_text, max_tokens, hadamard_block, false, device, progress)
      .input_amax;
}

CalibrationStats observe_inputs(const checkpoint::Checkpoint& source, const std::vector<std::string>& modules,
                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                int64_t hadamard_block, bool hessians, plan::DeviceChoice device,
                                const CalibrationProgress& progress) {
  std::ifstream in(calibration_text, std::ios::binary);
  if (!in) throw UsageError(fmt::format("--calibration {}: cannot open for reading", calibration_text.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw UsageError(fmt::format("--calibration {}: the file is empty", calibration_text.string()));

  model::LoadOptions options;
  options.device = device;
  const model::LoadedModel loaded = model::load_model(source.root(), options);
  const text::Tokenizer tokenizer = runtime::load_tokenizer(loaded.checkpoint);
  std::vector<int32_t> tokens = tokenizer.encode(text.str(), true);
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(static_cast<size_t>(max_tokens));
  if (tokens.size() < 2) {
    throw UsageError(fmt::format("--calibration {}: {} token(s) are too few to calibrate on", calibration_text.string(),
                                 tokens.size()));
  }

  AmaxObserver observer(hadamard_block, hessians, loaded.config.num_layers, progress);
  loaded.decoder->set_observer(&observer);
  model::KvCache cache = loaded.decoder->make_cache(kSampleTokens, 1);
  const int64_t samples = (static_cast<int64_t>(tokens.size()) + kSampleTokens - 1) / kSampleTokens;
  for (size_t begin = 0; begin < tokens.size(); begin += kSampleTokens) {
    observer.start_sample(static_cast<int64_t>(begin) / kSampleTokens, samples);
    const size_t count = std::min<size_t>(kSampleTokens, tokens.size() - begin);
    const int slot = cache.acquire();
    const model::SequenceChunk chunk{slot, 0, std::span(tokens).subspan(begin, count), false};
    loaded.decoder->forward(std::span(&chunk, 1), cache);
    cache.release(slot);
    observer.finish_sample();
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
