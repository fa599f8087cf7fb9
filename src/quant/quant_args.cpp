// SPDX-License-Identifier: Apache-2.0
#include "quant/quant_config.h"  // QuantArgs and the enum names live here; configs in quant_config.cpp

#include <fmt/format.h>


#include "fp4serve/error.h"
#include "quant/json_fields.h"

namespace fp4serve::quant {
namespace {

using nlohmann::json;

using json_fields::get_string;
using json_fields::member;

// --- QuantizationArgs --------------------------------------------------------------------------------------

Strategy parse_strategy(const std::string& s, std::string_view where) {
  if (s == "tensor") return Strategy::Tensor;
  if (s == "channel") return Strategy::Channel;
  if (s == "group") return Strategy::Group;
  if (s == "tensor_group") return Strategy::TensorGroup;
  if (s == "block") return Strategy::Block;
  if (s == "token") return Strategy::Token;
  if (s == "attn_head") return Strategy::AttnHead;
  throw FormatError(fmt::format("{}.strategy is '{}', expected one of tensor, channel, group, tensor_group, block, "
                                "token, attn_head", where, s));
}

ScaleDtype parse_scale_dtype(const json& v, std::string_view where) {
  if (v.is_null()) return ScaleDtype::Unspecified;
  if (!v.is_string()) throw FormatError(fmt::format("{}.scale_dtype is {}, expected a string", where, v.type_name()));
  std::string s = v.get<std::string>();
  if (s.starts_with("torch.")) s = s.substr(6);
  if (s == "float8_e4m3fn") return ScaleDtype::E4M3;
  if (s == "uint8" || s == "float8_e8m0fnu") return ScaleDtype::E8M0;
  if (s == "bfloat16") return ScaleDtype::BF16;
  if (s == "float16" || s == "half") return ScaleDtype::F16;
  if (s == "float32" || s == "float") return ScaleDtype::F32;
  throw FormatError(fmt::format("{}.scale_dtype '{}' is not a known scale dtype (float8_e4m3fn, uint8, "
                                "float8_e8m0fnu, bfloat16, float16, float32)", where, v.get<std::string>()));
}

ActOrder parse_actorder(const json& v, std::string_view where) {
  if (v.is_null()) return ActOrder::None;
  if (v.is_boolean()) return v.get<bool>() ? ActOrder::Group : ActOrder::None;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "group" || s == "dynamic") return ActOrder::Group;
    if (s == "weight" || s == "static") return ActOrder::Weight;
  }
  throw FormatError(fmt::format("{}.actorder is {}, expected null, true/false, \"group\", \"weight\", \"dynamic\" or "
                                "\"static\"", where, v.dump()));
}

int64_t get_int(const json& v, std::string_view where, const char* key) {
  if (!v.is_number_integer()) throw FormatError(fmt::format("{}.{} is {}, expected an integer", where, key, v.dump()));
  return v.get<int64_t>();
}

}  // namespace

std::string_view quant_type_name(QuantType t) {
  switch (t) {
    case QuantType::Int: return "int";
    case QuantType::Float: return "float";
  }
  return "?";
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::Tensor: return "tensor";
    case Strategy::Channel: return "channel";
    case Strategy::Group: return "group";
    case Strategy::TensorGroup: return "tensor_group";
    case Strategy::Block: return "block";
    case Strategy::Token: return "token";
    case Strategy::AttnHead: return "attn_head";
  }
  return "?";
}

std::string_view dynamic_name(Dynamic d) {
  switch (d) {
    case Dynamic::Static: return "false";
    case Dynamic::Dynamic: return "true";
    case Dynamic::Local: return "local";
  }
  return "?";
}

std::string_view actorder_name(ActOrder a) {
  switch (a) {
    case ActOrder::None: return "none";
    case ActOrder::Group: return "group";
    case ActOrder::Weight: return "weight";
  }
  return "?";
}

std::string_view scale_dtype_name(ScaleDtype s) {
  switch (s) {
    case ScaleDtype::Unspecified: return "unspecified";
    case ScaleDtype::E4M3: return "float8_e4m3fn";
    case ScaleDtype::E8M0: return "uint8(E8M0)";
    case ScaleDtype::BF16: return "bfloat16";
    case ScaleDtype::F16: return "float16";
    case ScaleDtype::F32: return "float32";
  }
  return "?";
}

std::string_view storage_format_name(StorageFormat f) {
  switch (f) {
    case StorageFormat::Dense: return "dense";
    case StorageFormat::Nvfp4Packed: return "nvfp4-packed";
    case StorageFormat::Mxfp4Packed: return "mxfp4-packed";
    case StorageFormat::IntPacked: return "int-packed";
    case StorageFormat::Fp8: return "fp8";
    case StorageFormat::Mxfp8: return "mxfp8";
    case StorageFormat::Int8: return "int8";
    case StorageFormat::GptOssMxfp4Blocks: return "gpt-oss-mxfp4-blocks";
  }
  return "?";
}

std::string_view match_origin_name(MatchOrigin o) {
  switch (o) {
    case MatchOrigin::NotQuantized: return "not quantized";
    case MatchOrigin::Group: return "group";
    case MatchOrigin::Ignored: return "ignored";
    case MatchOrigin::Excluded: return "excluded";
    case MatchOrigin::NotTargeted: return "not targeted";
    case MatchOrigin::NotListed: return "not listed";
  }
  return "?";
}

std::string QuantArgs::describe() const {
  std::string s = fmt::format("{}{} {}", quant_type_name(type), num_bits, strategy_name(strategy));
  if (group_size) s += fmt::format(" group_size={}", *group_size);
  if (block) s += fmt::format(" block={}x{}", (*block)[0], (*block)[1]);
  s += symmetric ? " symmetric" : " asymmetric";
  s += fmt::format(" dynamic={}", dynamic_name(dynamic));
  if (actorder != ActOrder::None) s += fmt::format(" actorder={}", actorder_name(actorder));
  s += fmt::format(" scale_dtype={}", scale_dtype_name(scale_dtype));
  return s;
}

QuantArgs parse_quant_args(const json& args, std::string_view where) {
  if (!args.is_object()) throw FormatError(fmt::format("{} is {}, expected an object", where, args.type_name()));
  QuantArgs q;
  if (const json* v = member(args, "num_bits")) q.num_bits = static_cast<int>(get_int(*v, where, "num_bits"));
  if (q.num_bits < 1 || q.num_bits > 16) throw FormatError(fmt::format("{}.num_bits is {}, expected 1..16", where, q.num_bits));
  const std::string type = get_string(args, "type", where);
  if (type.empty() || type == "int") {
    q.type = QuantType::Int;
  } else if (type == "float") {
    q.type = QuantType::Float;
  } else {
    throw FormatError(fmt::format("{}.type is '{}', expected \"int\" or \"float\"", where, type));
  }
  if (const json* v = member(args, "symmetric")) {
    if (!v->is_boolean()) throw FormatError(fmt::format("{}.symmetric is {}, expected true or false", where, v->dump()));
    q.symmetric = v->get<bool>();
  }
  if (const json* v = member(args, "group_size")) q.group_size = get_int(*v, where, "group_size");
  const std::string strategy = get_string(args, "strategy", where);
  if (!strategy.empty()) {
    q.strategy = parse_strategy(strategy, where);
  } else if (!q.group_size) {
    q.strategy = Strategy::Tensor;  // CT's inference when strategy is null (FORMATS.md §1.3)
  } else if (*q.group_size > 0) {
    q.strategy = Strategy::Group;
  } else if (*q.group_size == -1) {
    q.strategy = Strategy::Channel;
  } else {
    throw FormatError(fmt::format("{}.group_size is {}, expected a positive integer or -1", where, *q.group_size));
  }
  if (q.group_size && *q.group_size == -1) q.group_size.reset();  // -1 means "channel"
  if ((q.strategy == Strategy::Group || q.strategy == Strategy::TensorGroup) && (!q.group_size || *q.group_size <= 0)) {
    throw FormatError(fmt::format("{}: strategy '{}' needs a positive group_size", where, strategy_name(q.strategy)));
  }
  if (const json* v = member(args, "block_structure")) {
    std::array<int64_t, 2> block{};
    if (v->is_array() && v->size() == 2 && (*v)[0].is_number_integer() && (*v)[1].is_number_integer()) {
      block = {(*v)[0].get<int64_t>(), (*v)[1].get<int64_t>()};
    } else if (v->is_string() && std::sscanf(v->get<std::string>().c_str(), "%ldx%ld", &block[0], &block[1]) == 2) {
      // legacy "RxC" string form
    } else {
      throw FormatError(fmt::format("{}.block_structure is {}, expected [rows, cols]", where, v->dump()));
    }
    if (block[0] <= 0 || block[1] <= 0) throw FormatError(fmt::format("{}.block_structure {} has a non-positive side", where, v->dump()));
    q.block = block;
  }
  if (q.strategy == Strategy::Block && !q.block) {
    throw FormatError(fmt::format("{}: strategy 'block' needs block_structure", where));
  }
  if (const json* v = member(args, "dynamic")) {
    if (v->is_boolean()) {
      q.dynamic = v->get<bool>() ? Dynamic::Dynamic : Dynamic::Static;
    } else if (v->is_string() && v->get<std::string>() == "local") {
      q.dynamic = Dynamic::Local;
    } else {
      throw FormatError(fmt::format("{}.dynamic is {}, expected true, false or \"local\"", where, v->dump()));
    }
  }
  if (q.dynamic == Dynamic::Local && q.strategy != Strategy::TensorGroup) {
    throw FormatError(fmt::format("{}: dynamic \"local\" is only defined for strategy tensor_group, found '{}'", where,
                                  strategy_name(q.strategy)));
  }
  q.actorder = parse_actorder(args.value("actorder", json()), where);
  q.scale_dtype = parse_scale_dtype(args.value("scale_dtype", json()), where);
  return q;
}

}  // namespace fp4serve::quant
