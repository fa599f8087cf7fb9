// SPDX-License-Identifier: Apache-2.0
// Calibration for `fp4serve quantize` (W4A4 input scales of `--scheme nvfp4`, GPTQ Hessians of `--method gptq`):
// the one step of quantization that needs to run the model. Kept apart from the weight math so the model runtime can be wired in here without touching quant/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "plan/device_caps.h"
#include "quant/quantize_checkpoint.h"

namespace fp4serve::app {

/// Called with (done, total) decoder-layer passes of calibration, total = samples × layers; the caller draws it.
using CalibrationProgress = std::function<void(int64_t done, int64_t total)>;

/// What one calibration pass observes for the requested modules.
struct CalibrationStats {
  std::map<std::string, float> input_amax;  ///< as observe_input_amax
  /// With `hessians`: 2·Σ x·xᵀ per sample (quant::GptqHessian, one per distinct input, shared by the modules that
  /// read it: q|k|v, gate|up), after the same Hadamard transform as the amax, for `quantize --method gptq`.
  quant::HessianMap hessians;
};

/// One calibration pass (observe_input_amax's text, samples and errors) that records the input amaxes and, when
/// `hessians` is true, the GPTQ Hessians. Each 512-token sample adds one sample to a Hessian, as llm-compressor
/// counts a calibration sequence.
CalibrationStats observe_inputs(const checkpoint::Checkpoint& source, const std::vector<std::string>& modules,
                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                int64_t hadamard_block, bool hessians,
                                plan::DeviceChoice device = plan::DeviceChoice::Cpu,
                                const CalibrationProgress& progress = {});

/// Runs the first `max_tokens` tokens of the text file `calibration_text` through the unquantized model in
/// `source` and returns, for every linear module named in `modules`, the largest |input activation| seen
/// (static min-max over all calibration tokens, as llm-compressor's `static_minmax` observer keeps it).
/// These amaxes become `input_global_scale` = 448·6/amax, jointly over fused groups (quant::plan_quantization).
/// Calibration samples are independent sequences of 512 tokens. With `hadamard_block` b > 0 (`quantize
/// --hadamard b`) the observer sees each input after the online QuIP transform the written checkpoint will
/// declare (x · H_b/√b per b-wide block, kernels::fwht_blocks), as llm-compressor's observer sees it behind the
/// transform's pre-hook (compressed-tensors registers it with prepend=True). Throws UsageError when the text file is
/// unreadable, empty or yields fewer than 2 tokens; what load_model throws for the source model on `device`;
/// FormatError when a requested module is never run by the model. `progress` (optional) is called as each
/// decoder layer of each sample finishes, with (done, total) layer passes, total = samples × layers; the
/// caller draws it.
std::map<std::string, float> observe_input_amax(const checkpoint::Checkpoint& source,
                                                const std::vector<std::string>& modules,
                                                const std::filesystem::path& calibration_text, int64_t max_tokens,
                                                int64_t hadamard_block = 0,
                                                plan::DeviceChoice device = plan::DeviceChoice::Cpu,
                                                const CalibrationProgress& progress = {});

}  // namespace fp4serve::app
