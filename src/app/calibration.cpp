// SPDX-License-Identifier: Apache-2.0
#include "app/calibration.h"

#include <fmt/format.h>

#include "fp4serve/error.h"

namespace fp4serve::app {

std::map<std::string, float> observe_input_amax(const checkpoint::Checkpoint& source,
                                                const std::vector<std::string>& modules,
                                                const std::filesystem::path& calibration_text, int64_t max_tokens) {
  (void)modules;
  (void)calibration_text;
  (void)max_tokens;
  // Observing activations needs the tokenizer and the forward pass (src/model, src/runtime), which this build
  // does not link yet. Refusing is the honest answer: a W4A4 checkpoint without calibrated input scales would
  // load and run but produce wrong activations.
  throw UnsupportedError(fmt::format("{}: --scheme nvfp4 (W4A4) needs activation calibration, and W4A4 calibration "
                                     "needs the model runtime: not available in this build (use nvfp4a16, "
                                     "mxfp4a16, mxfp4 or w4a16)", source.root().string()));
}

}  // namespace fp4serve::app
