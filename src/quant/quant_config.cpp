// SPDX-License-Identifier: Apache-2.0
// Config-level parsing (compressed-tensors, ModelOpt, GPT-OSS) and per-module resolution. QuantizationArgs
// parsing and the enum names are in quant_args.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "fp4serve/error.h"
#include "quant/block_format.h"
#include "quant/json_fields.h"
#include "quant/quant_config.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

using json_fields::get_string;
using json_fields::member;

std::vector<CtTarget> parse_target_list(const json& list, std::string_view where) {
  if (list.is_null()) return {};
  if (!list.is_array()) throw FormatError(fmt::format("{} is {}, expected a list of strings", where, list.type_name()));
  std::vector<CtTarget> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item_where = fmt::format("{}[{}]", where, i);
    if (!list[i].is_string()) throw FormatError(fmt::format("{} is {}, expected a string", item_where, list[i].type_name()));
    out.emplace_back(list[i].get<std::string>(), item_where);
  }
  return out;
}

std::vector<std::string> parse_string_list(const json& list, std::string_view where) {
  std::vector<std::string> out;
  if (list.is_null()) return out;
  if (!list.is_array()) throw FormatError(fmt::format("{} is {}, expected a list of strings", where, list.type_name()));
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) throw FormatError(fmt::format("{}[{}] is {}, expected a string", where, i, list[i].type_name()));
    out.push_back(list[i].get<std::string>());
  }
  return out;
}

// --- compressed-tensors presets (CT quant_scheme.py; FORMATS.md §1.2) ---------------------------------------

json int_args(int bits, const char* strategy, std::optional<int> group, bool symmetric = true) {
  json a = {{"num_bits", bits}, {"type", "int"}, {"symmetric", symmetric}, {"strategy", strategy}, {"dynamic", false}};
  if (group) a["group_size"] = *group;
  return a;
}

json float_args(int bits, const char* strategy, std::optional<int> group, json dynamic, const char* scale_dtype) {
  json a = {{"num_bits", bits}, {"type", "float"}, {"symmetric", true}, {"strategy", strategy}, {"dynamic", dynamic}};
  if (group) a["group_size"] = *group;
  if (scale_dtype != nullptr) a["scale_dtype"] = scale_dtype;
  return a;
}

struct Preset {
  json weights;
  json input;  // null: weight-only
};

std::optional<Preset> ct_preset(const std::string& name) {
  const json none;
  const json int8_token = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "token"}, {"dynamic", true}};
  const json fp8_token = float_args(8, "token", std::nullopt, true, nullptr);
  if (name == "W4A16") return Preset{int_args(4, "group", 128), none};
  if (name == "W4A16_ASYM") return Preset{int_args(4, "group", 128, false), none};
  if (name == "W8A16") return Preset{int_args(8, "channel", std::nullopt), none};
  if (name == "W8A8" || name == "INT8" || name == "INT8_W8A8") return Preset{int_args(8, "channel", std::nullopt), int8_token};
  if (name == "W4A8" || name == "INT8_W4A8") return Preset{int_args(4, "group", 128), int8_token};
  if (name == "W4AFP8") return Preset{int_args(4, "group", 128), fp8_token};
  if (name == "FP8") {
    return Preset{float_args(8, "tensor", std::nullopt, false, nullptr), float_args(8, "tensor", std::nullopt, false, nullptr)};
  }
  if (name == "FP8_DYNAMIC") return Preset{float_args(8, "channel", std::nullopt, false, nullptr), fp8_token};
  if (name == "FP8_BLOCK") {
    json w = float_args(8, "block", std::nullopt, false, nullptr);
    w["block_structure"] = {128, 128};
    return Preset{w, float_args(8, "group", 128, true, nullptr)};
  }
  for (const BlockFormatTraits& f : kBlockFormats) {  // "NVFP4" = W4A4, "NVFP4A16" = weight-only
    if (name != f.name && name != std::string(f.name) + "A16") continue;
    const std::string strategy(strategy_name(f.strategy));
    const char* scale = f.scale == ElementFormat::E4M3 ? "torch.float8_e4m3fn" : "torch.uint8";
    const int group = static_cast<int>(f.group_size);
    const json input_dynamic = f.input_dynamic == Dynamic::Local ? json("local") : json(true);
    return Preset{float_args(4, strategy.c_str(), group, false, scale),
                  name == f.name ? float_args(4, strategy.c_str(), group, input_dynamic, scale) : none};
  }
  if (name == "MXFP8A16") return Preset{float_args(8, "group", 32, false, "torch.uint8"), none};
  if (name == "MXFP8") return Preset{float_args(8, "group", 32, false, "torch.uint8"), float_args(8, "group", 32, true, "torch.uint8")};
  return std::nullopt;
}

// The writer's first-match order when a config names no format (CT compressors/format.py, FORMATS.md §1.5).
std::string infer_ct_format(const std::optional<QuantArgs>& w, const std::optional<QuantArgs>& a) {
  if (!w) return "dense";
  const bool fp = w->type == QuantType::Float;
  for (const BlockFormatTraits& f : kBlockFormats) {  // NVFP4's row is last in the writer's order: any other FP4
    if (f.format == BlockFormat::Nvfp4) continue;
    if (fp && w->num_bits == 4 && w->strategy == f.strategy && w->group_size == f.group_size) return std::string(f.ct_format);
  }
  if (fp && w->num_bits == 8 && w->strategy == Strategy::Group && w->group_size == 32) return "mxfp8-quantized";
  if (fp && w->num_bits == 4) return std::string(block_format_traits(BlockFormat::Nvfp4).ct_format);
  if (!fp && w->num_bits == 8 && a) return "int-quantized";
  if (!fp && w->num_bits <= 8 && !a) return "pack-quantized";
  if (fp && w->num_bits == 8) return "float-quantized";
  return "naive-quantized";
}

// Format string → storage. Sparse and legacy layouts are refused here, by name.
StorageFormat storage_of(const std::string& format, const std::optional<QuantArgs>& w, std::string_view where) {
  if (format == "dense") return StorageFormat::Dense;
  for (const BlockFormatTraits& f : kBlockFormats) {
    if (format == f.ct_format) return f.storage;
  }
  if (format == "pack-quantized") return StorageFormat::IntPacked;
  if (format == "float-quantized") return StorageFormat::Fp8;
  if (format == "int-quantized") return StorageFormat::Int8;
  if (format == "mxfp8-quantized") return StorageFormat::Mxfp8;
  if (format == "naive-quantized") {
    return (w && w->type == QuantType::Float) ? StorageFormat::Fp8 : StorageFormat::Int8;
  }
  if (format == "marlin-24" || format == "sparse-bitmask" || format == "sparse-24-bitmask") {
    throw UnsupportedError(fmt::format("{}: format '{}' is a sparse layout; fp4serve does not load sparse checkpoints",
                                       where, format));
  }
  if (format == "mixed-precision") {
    throw FormatError(fmt::format("{}: 'mixed-precision' is a global marker, a group needs its own format", where));
  }
  throw UnsupportedError(fmt::format("{}: unknown compressed-tensors format '{}'", where, format));
}

void parse_compressed_tensors(const json& qc, QuantConfig& out) {
  const std::string where = "config.json: quantization_config";
  out.version = get_string(qc, "version", where);
  out.global_format = get_string(qc, "format", where);
  out.quantization_status = get_string(qc, "quantization_status", where);
  if (const json* sparsity = member(qc, "sparsity_config")) {
    if (!sparsity->is_object()) throw FormatError(where + ".sparsity_config is not an object");
    const std::string sf = get_string(*sparsity, "format", where + ".sparsity_config");
    if (!sf.empty() && sf != "dense") {
      throw UnsupportedError(fmt::format("{}.sparsity_config: sparse format '{}' (structure '{}') is not supported; "
                                         "fp4serve loads dense quantized weights only", where, sf,
                                         sparsity->value("sparsity_structure", json("?")).dump()));
    }
  }
  if (const json* groups = member(qc, "config_groups")) {
    if (!groups->is_object()) throw FormatError(where + ".config_groups is not an object");
    for (const auto& [name, value] : groups->items()) {
      const std::string gwhere = fmt::format("{}.config_groups.{}", where, name);
      QuantGroup group;
      group.name = name;
      if (value.is_array()) {  // {"NVFP4": ["Linear"]}: the key is a preset name
        const auto preset = ct_preset(name);
        if (!preset) throw UnsupportedError(fmt::format("{}: unknown compressed-tensors preset scheme '{}'", gwhere, name));
        group.targets = parse_target_list(value, gwhere);
        group.weights = parse_quant_args(preset->weights, gwhere + "(preset weights)");
        if (!preset->input.is_null()) group.input = parse_quant_args(preset->input, gwhere + "(preset input_activations)");
      } else if (value.is_object()) {
        group.targets = parse_target_list(value.value("targets", json()), gwhere + ".targets");
        if (const json* w = member(value, "weights")) group.weights = parse_quant_args(*w, gwhere + ".weights");
        if (const json* a = member(value, "input_activations")) group.input = parse_quant_args(*a, gwhere + ".input_activations");
        group.has_output_quant = member(value, "output_activations") != nullptr;
        group.format = get_string(value, "format", gwhere);
      } else {
        throw FormatError(fmt::format("{} is {}, expected a scheme object or a list of targets", gwhere, value.type_name()));
      }
      if (group.format.empty() && out.global_format != "mixed-precision") group.format = out.global_format;
      if (group.format.empty()) group.format = infer_ct_format(group.weights, group.input);
      storage_of(group.format, group.weights, gwhere);  // refuses sparse / unknown formats now, not per layer
      out.groups.push_back(std::move(group));
    }
  }
  out.ignore = parse_target_list(qc.value("ignore", json()), where + ".ignore");
  if (const json* kv = member(qc, "kv_cache_scheme")) out.kv_cache = parse_quant_args(*kv, where + ".kv_cache_scheme");
  if (const json* tc = member(qc, "transform_config")) {
    if (!tc->is_object()) throw FormatError(where + ".transform_config is not an object");
    const json groups = tc->value("config_groups", json::object());
    if (!groups.is_object()) throw FormatError(where + ".transform_config.config_groups is not an object");
    for (const auto& [name, scheme] : groups.items()) {
      const std::string twhere = fmt::format("{}.transform_config.config_groups.{}", where, name);
      if (!scheme.is_object()) throw FormatError(twhere + " is not an object");
      TransformGroup t;
      t.name = name;
      t.type = get_string(scheme, "type", twhere);
      if (const json* r = member(scheme, "randomize"); r != nullptr && r->is_boolean()) t.randomize = r->get<bool>();
      if (const json* h = member(scheme, "head_dim"); h != nullptr && h->is_number_integer()) t.head_dim = h->get<int64_t>();
      const json apply = scheme.value("apply", json::array());
      if (!apply.is_array()) throw FormatError(twhere + ".apply is not a list");
      for (size_t i = 0; i < apply.size(); ++i) {
        const std::string awhere = fmt::format("{}.apply[{}]", twhere, i);
        TransformGroup::Apply a;
        a.targets = parse_target_list(apply[i].value("targets", json()), awhere + ".targets");
        a.ignore = parse_target_list(apply[i].value("ignore", json()), awhere + ".ignore");
        a.location = get_string(apply[i], "location", awhere);
        if (const json* inv = member(apply[i], "inverse"); inv != nullptr && inv->is_boolean()) a.inverse = inv->get<bool>();
        t.apply.push_back(std::move(a));
      }
      out.transforms.push_back(std::move(t));
    }
  }
}

// --- ModelOpt (FORMATS.md §3) ---------------------------------------------------------------------------------

// One ModelOpt algorithm as producer-neutral args. `group_size` is the config's value (NVFP4 default 16).
LayerQuant modelopt_algo(const std::string& written, std::optional<int64_t> group_size, std::string_view where) {
  std::string algo = written;
  std::transform(algo.begin(), algo.end(), algo.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  LayerQuant lq;
  lq.producer = Producer::ModelOpt;
  lq.origin = MatchOrigin::Group;
  lq.source = written;
  lq.format_name = written;
  const std::string e4m3 = "torch.float8_e4m3fn";
  if (algo == "NVFP4" || algo == "W4A16_NVFP4") {
    const int g = static_cast<int>(group_size.value_or(block_format_traits(BlockFormat::Nvfp4).group_size));
    lq.format = StorageFormat::Nvfp4Packed;
    lq.weights = parse_quant_args(float_args(4, "tensor_group", g, false, e4m3.c_str()), where);
    if (algo == "NVFP4") lq.input = parse_quant_args(float_args(4, "tensor_group", g, "local", e4m3.c_str()), where);
    return lq;
  }
  if (algo == "FP8") {
    lq.format = StorageFormat::Fp8;
    lq.weights = parse_quant_args(float_args(8, "tensor", std::nullopt, false, "torch.float32"), where);
    lq.input = parse_quant_args(float_args(8, "tensor", std::nullopt, false, "torch.float32"), where);
    return lq;
  }
  if (algo == "FP8_PER_CHANNEL_PER_TOKEN") {
    lq.format = StorageFormat::Fp8;
    lq.weights = parse_quant_args(float_args(8, "channel", std::nullopt, false, "torch.float32"), where);
    lq.input = parse_quant_args(float_args(8, "token", std::nullopt, true, nullptr), where);
    return lq;
  }
  if (algo == "FP8_PB_WO") {
    json w = float_args(8, "block", std::nullopt, false, "torch.float32");
    w["block_structure"] = {128, 128};
    lq.format = StorageFormat::Fp8;
    lq.weights = parse_quant_args(w, where);
    return lq;
  }
  if (algo.find("AWQ") != std::string::npos || algo.starts_with("W4A8")) {
    throw UnsupportedError(fmt::format("{}: ModelOpt algorithm '{}' is not supported (AWQ and W4A8 checkpoints have no "
                                       "fp4serve scheme); supported: NVFP4, W4A16_NVFP4, FP8, "
                                       "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MIXED_PRECISION", where, written));
  }
  throw UnsupportedError(fmt::format("{}: ModelOpt algorithm '{}' is not supported; supported: NVFP4, W4A16_NVFP4, "
                                     "FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MIXED_PRECISION", where, written));
}

std::optional<int64_t> optional_int(const json& object, const char* key, std::string_view where) {
  const json* v = member(object, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) throw FormatError(fmt::format("{}.{} is {}, expected an integer", where, key, v->dump()));
  return v->get<int64_t>();
}

// `q` is hf_quant_config.json → quantization, or config.json's converted quantization_config.
void parse_modelopt(const json& q, std::string_view where, QuantConfig& out) {
  if (!q.is_object()) throw FormatError(fmt::format("{} is not an object", where));
  const std::string algo = get_string(q, "quant_algo", where);
  if (algo.empty()) throw FormatError(fmt::format("{} has no 'quant_algo'", where));
  out.global_format = algo;
  if (const json* ex = member(q, "exclude_modules")) {
    out.exclude = parse_string_list(*ex, std::string(where) + ".exclude_modules");
  } else if (const json* ig = member(q, "ignore")) {
    out.exclude = parse_string_list(*ig, std::string(where) + ".ignore");
  }
  if (const json* kv = member(q, "kv_cache_quant_algo"); kv != nullptr && kv->is_string()) {
    out.kv_cache_algo = kv->get<std::string>();
    std::string kv_upper = out.kv_cache_algo;
    std::transform(kv_upper.begin(), kv_upper.end(), kv_upper.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (kv_upper != "FP8") {
      throw UnsupportedError(fmt::format("{}.kv_cache_quant_algo '{}' is not supported (only FP8 KV-cache scales)", where,
                                         out.kv_cache_algo));
    }
    out.kv_cache = parse_quant_args(float_args(8, "tensor", std::nullopt, false, "torch.float32"), where);
  }
  std::string upper = algo;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "MIXED_PRECISION") {
    out.mixed_precision = true;
    const json* layers = member(q, "quantized_layers");
    if (layers == nullptr || !layers->is_object()) {
      throw FormatError(fmt::format("{}: MIXED_PRECISION needs a 'quantized_layers' object", where));
    }
    for (const auto& [name, spec] : layers->items()) {
      const std::string lwhere = fmt::format("{}.quantized_layers.{}", where, name);
      const std::string layer_algo = get_string(spec, "quant_algo", lwhere);
      if (layer_algo.empty()) throw FormatError(lwhere + " has no 'quant_algo'");
      LayerQuant lq = modelopt_algo(layer_algo, optional_int(spec, "group_size", lwhere), lwhere);
      lq.source = "quantized_layers: " + layer_algo;
      lq.match_kind = MatchKind::Exact;
      out.quantized_layers.emplace(name, std::move(lq));
    }
    return;
  }
  const LayerQuant lq = modelopt_algo(algo, optional_int(q, "group_size", where), where);
  QuantGroup group;
  group.name = algo;
  group.targets.emplace_back("Linear", where);
  group.weights = lq.weights;
  group.input = lq.input;
  group.format = algo;
  out.groups.push_back(std::move(group));
}

}  // namespace

QuantConfig parse_quant_config(const json& config, const json& hf_quant_config) {
  QuantConfig out;
  out.producer = detect_producer(config, hf_quant_config);
  switch (out.producer.producer) {
    case Producer::Unquantized:
      return out;
    case Producer::OtherQuantized:
      throw UnsupportedError(fmt::format("config.json: quant_method '{}' is not supported; fp4serve reads "
                                         "compressed-tensors, modelopt and mxfp4 (GPT-OSS) checkpoints",
                                         out.producer.quant_method));
    case Producer::CompressedTensors:
      parse_compressed_tensors(config["quantization_config"], out);
      return out;
    case Producer::ModelOpt:
      if (hf_quant_config.is_object()) {
        parse_modelopt(hf_quant_config.value("quantization", json()), "hf_quant_config.json: quantization", out);
      } else {
        parse_modelopt(config["quantization_config"], "config.json: quantization_config", out);
      }
      return out;
    case Producer::GptOssMxfp4: {
      const json& qc = config["quantization_config"];
      out.global_format = "mxfp4";
      out.exclude = parse_string_list(qc.value("modules_to_not_convert", json()),
                                      "config.json: quantization_config.modules_to_not_convert");
      return out;
    }
  }
  return out;
}

namespace {

// Groups-and-ignore resolution shared by compressed-tensors and single-algorithm ModelOpt configs.
void resolve_groups(const QuantConfig& config, const ModuleRef& module, LayerQuant& lq) {
  const QuantGroup* best = nullptr;
  MatchKind best_kind = MatchKind::ClassName;
  for (const QuantGroup& group : config.groups) {
    for (const CtTarget& target : group.targets) {
      const auto kind = target.match(module.name, module.class_names);
      // Lower enum value = stronger match; the first group wins among equals.
      if (kind && (best == nullptr || static_cast<int>(*kind) < static_cast<int>(best_kind))) {
        best = &group;
        best_kind = *kind;
      }
    }
  }
  if (best == nullptr) {
    lq.origin = MatchOrigin::NotTargeted;
    return;
  }
  lq.origin = MatchOrigin::Group;
  lq.source = best->name;
  lq.match_kind = best_kind;
  lq.format_name = best->format;
  lq.weights = best->weights;
  lq.input = best->input;
  lq.has_output_quant = best->has_output_quant;
  if (config.producer.producer == Producer::ModelOpt) {
    lq.format = best->weights && best->weights->num_bits == 4 ? StorageFormat::Nvfp4Packed : StorageFormat::Fp8;
  } else {
    lq.format = storage_of(best->format, best->weights, "config_groups." + best->name);
  }
}

bool excluded_by(const std::vector<std::string>& patterns, std::string_view name, bool prefix, std::string& which) {
  for (const std::string& p : patterns) {
    // GPT-OSS lists parents ("model.layers.*.self_attn"); a module below a listed parent is not converted.
    if (fnmatch_case(p, name) || (prefix && fnmatch_case(p + ".*", name))) {
      which = p;
      return true;
    }
  }
  return false;
}

}  // namespace

LayerQuant resolve_layer_quant(const QuantConfig& config, const ModuleRef& module) {
  LayerQuant lq;
  lq.producer = config.producer.producer;
  switch (config.producer.producer) {
    case Producer::Unquantized:
    case Producer::OtherQuantized:
      lq.origin = MatchOrigin::NotQuantized;
      return lq;
    case Producer::CompressedTensors:
      for (const CtTarget& target : config.ignore) {
        if (auto kind = target.match(module.name, module.class_names)) {
          lq.origin = MatchOrigin::Ignored;
          lq.source = target.text();
          lq.match_kind = kind;
          break;
        }
      }
      if (lq.origin != MatchOrigin::Ignored) resolve_groups(config, module, lq);
      break;
    case Producer::ModelOpt: {
      std::string which;
      if (excluded_by(config.exclude, module.name, false, which)) {
        lq.origin = MatchOrigin::Excluded;
        lq.source = which;
      } else if (config.mixed_precision) {
        auto it = config.quantized_layers.find(module.name);
        if (it == config.quantized_layers.end()) {
          lq.origin = MatchOrigin::NotListed;  // never inherits a sibling's algorithm (SCHEMES.md rule 5)
        } else {
          lq = it->second;
        }
      } else {
        resolve_groups(config, module, lq);
      }
      break;
    }
    case Producer::GptOssMxfp4: {
      const bool experts = std::find(module.class_names.begin(), module.class_names.end(), "GptOssExperts") !=
                           module.class_names.end();
      std::string which;
      if (!experts) {
        lq.origin = MatchOrigin::NotTargeted;
      } else if (excluded_by(config.exclude, module.name, true, which)) {
        lq.origin = MatchOrigin::Excluded;
        lq.source = which;
      } else {
        lq.origin = MatchOrigin::Group;
        lq.source = "mxfp4";
        lq.format_name = "mxfp4";
        lq.format = StorageFormat::GptOssMxfp4Blocks;
        lq.weights = parse_quant_args(
            float_args(4, "group", static_cast<int>(block_format_traits(BlockFormat::Mxfp4).group_size), false, "torch.uint8"),
            "GPT-OSS mxfp4");
      }
      break;
    }
  }
  for (const TransformGroup& t : config.transforms) {
    for (const TransformGroup::Apply& a : t.apply) {
      const auto hit = [&](const CtTarget& x) { return x.match(module.name, module.class_names).has_value(); };
      if (!std::any_of(a.targets.begin(), a.targets.end(), hit) || std::any_of(a.ignore.begin(), a.ignore.end(), hit)) continue;
      TransformUse use{t.name, t.type, a.location, false, a.inverse, t.randomize, t.head_dim};
      use.online = !(a.location == "weight_input" || a.location == "weight_output");
      lq.transforms.push_back(std::move(use));
    }
  }
  return lq;
}

}  // namespace fp4serve::quant
