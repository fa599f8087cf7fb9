// SPDX-License-Identifier: Apache-2.0
// Which tool produced a checkpoint, decided from config.json / hf_quant_config.json only (FORMATS.md §1.1):
// dispatch on `quant_method`, never on tensor names or dtypes (§1.1).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::quant {

enum class Producer {
  CompressedTensors,  ///< quant_method "compressed-tensors" (llm-compressor)
  ModelOpt,           ///< hf_quant_config.json, or quant_method "modelopt"
  GptOssMxfp4,        ///< quant_method "mxfp4" (GPT-OSS native expert blocks)
  OtherQuantized,     ///< some other quant_method (e.g. "fp8", "awq"): named, not supported by the plan
  Unquantized,        ///< no quantization_config and no hf_quant_config.json
};

std::string_view producer_name(Producer p);

struct ProducerInfo {
  Producer producer = Producer::Unquantized;
  std::string quant_method;          ///< as written in the config ("" when unquantized)
  std::vector<std::string> formats;  ///< CT: global + per-group formats; ModelOpt: quant_algo(s); GPT-OSS: "mxfp4"
};

/// Reads the producer facts. `config` is config.json (may be null), `hf_quant_config` the ModelOpt side file
/// (null when absent). Throws FormatError when `quantization_config` is present but not an object, or its
/// `quant_method` is missing or not a string.
ProducerInfo detect_producer(const nlohmann::json& config, const nlohmann::json& hf_quant_config);

}  // namespace fp4serve::quant
