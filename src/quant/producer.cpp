// SPDX-License-Identifier: Apache-2.0
#include "quant/producer.h"

#include <algorithm>

#include "fp4serve/error.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

void add_unique(std::vector<std::string>& list, const std::string& value) {
  if (!value.empty() && std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

std::string string_or_empty(const json& object, const char* key) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_string()) return {};
  return object[key].get<std::string>();
}

// ModelOpt names its algorithm in hf_quant_config.json → quantization, or in config.json's converted block.
void collect_modelopt_algos(const json& quantization, std::vector<std::string>& formats) {
  add_unique(formats, string_or_empty(quantization, "quant_algo"));
  if (quantization.is_object() && quantization.contains("quantized_layers") &&
      quantization["quantized_layers"].is_object()) {
    for (const auto& [layer, spec] : quantization["quantized_layers"].items()) {
      add_unique(formats, string_or_empty(spec, "quant_algo"));
    }
  }
}

}  // namespace

std::string_view producer_name(Producer p) {
  switch (p) {
    case Producer::CompressedTensors: return "compressed-tensors";
    case Producer::ModelOpt: return "modelopt";
    case Producer::GptOssMxfp4: return "gpt-oss mxfp4";
    case Producer::OtherQuantized: return "other";
    case Producer::Unquantized: return "unquantized";
  }
  return "?";
}

ProducerInfo detect_producer(const json& config, const json& hf_quant_config) {
  ProducerInfo info;
  if (hf_quant_config.is_object()) {
    info.producer = Producer::ModelOpt;
    info.quant_method = "modelopt";
    collect_modelopt_algos(hf_quant_config.value("quantization", json::object()), info.formats);
    return info;
  }
  if (!config.is_object() || !config.contains("quantization_config")) return info;
  const json& qc = config["quantization_config"];
  if (!qc.is_object()) {
    throw FormatError("config.json: quantization_config is " + std::string(qc.type_name()) + ", expected an object");
  }
  if (!qc.contains("quant_method") || !qc["quant_method"].is_string()) {
    throw FormatError("config.json: quantization_config has no string 'quant_method'");
  }
  info.quant_method = qc["quant_method"].get<std::string>();
  if (info.quant_method == "compressed-tensors") {
    info.producer = Producer::CompressedTensors;
    add_unique(info.formats, string_or_empty(qc, "format"));
    if (qc.contains("config_groups") && qc["config_groups"].is_object()) {
      for (const auto& [name, group] : qc["config_groups"].items()) add_unique(info.formats, string_or_empty(group, "format"));
    }
  } else if (info.quant_method == "modelopt") {
    info.producer = Producer::ModelOpt;
    collect_modelopt_algos(qc, info.formats);
  } else if (info.quant_method == "mxfp4") {
    info.producer = Producer::GptOssMxfp4;
    info.formats.push_back("mxfp4");
  } else {
    info.producer = Producer::OtherQuantized;
  }
  return info;
}

}  // namespace fp4serve::quant
