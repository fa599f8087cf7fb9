// SPDX-License-Identifier: Apache-2.0
// Small readers for optional JSON members shared by the config parsers of this module (internal header).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fp4serve/error.h"

namespace fp4serve::quant::json_fields {

/// The member `key` of `object`, or nullptr when `object` is not an object, lacks the key, or holds null there.
inline const nlohmann::json* member(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

/// The string member `key` ("" when absent or null). Throws FormatError naming `where.key` for another type.
inline std::string get_string(const nlohmann::json& object, const char* key, std::string_view where) {
  const nlohmann::json* v = member(object, key);
  if (v == nullptr) return {};
  if (!v->is_string()) throw FormatError(fmt::format("{}.{} is {}, expected a string", where, key, v->type_name()));
  return v->get<std::string>();
}

}  // namespace fp4serve::quant::json_fields
