// SPDX-License-Identifier: Apache-2.0
// W4A4 calibration for `fp4serve quantize --scheme nvfp4`: the one step of quantization that needs to run the
// model. Kept apart from the weight math so the model runtime can be wired in here without touching quant/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace fp4serve::app {

/// Runs the first `max_tokens` tokens of the text file `calibration_text` through the unquantized model in
/// `source` and returns, for every linear module named in `modules`, the largest |input activation| seen
/// (static min-max over all calibration tokens, as llm-compressor's `static_minmax` observer keeps it).
/// These amaxes become `input_global_scale` = 448·6/amax, jointly over fused groups (quant::plan_quantization).
/// Calibration samples are independent sequences of 512 tokens. With `hadamard_block` b > 0 (`quantize
/// --hadamard b`) the observer sees each input after the online QuIP transform the written checkpoint will
/// declare (x · H_b/√b per b-wide block, kernels::fwht_blocks), as llm-compressor's observer sees it behind the
/// transform's pre-hook (compressed-tensors registers it with prepend=True). Throws UsageError when the text file is
/// unreadable, empty or yields fewer than 2 tokens; what load_model throws for the source model on `device`
/// (cpu or cuda); FormatError when a requested module is never run by the model. `progress` (optional) is called
/// as each decoder layer of each sample finishes, with (done, total) layer passes, total = samples × layers; the
/// caller draws it.
using CalibrationProgress = std::function<void(int64_t done, int64_t total)>;
std::map<std::string, float> observe_input_amax(const checkpoint::Checkpoint& source,
                                                const std::vector<std::string>& modules,
                                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                                int64_t hadamard_block = 0, const std::string& device = "cpu",
                                                const CalibrationProgress& progress = {});

}  // namespace fp4serve::app
