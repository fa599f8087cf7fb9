// SPDX-License-Identifier: Apache-2.0
#include "text/chat_template_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "fp4serve/error.h"

namespace fp4serve::text::jinja {

const Value* Mapping::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Mapping::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->items.empty();
    case Kind::Namespace: case Kind::Macro: return true;
  }
  return false;
}

std::string kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Macro: return "Macro";
  }
  return "?";
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  // Shortest round-trip digits in scientific form, then Python's layout rule (repr switches to exponent
  // notation when the decimal exponent is < -4 or >= 16).
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out.append(1, '.').append(digits, 1, std::string::npos);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + e;
  }
  if (exp10 < 0) {
    out.append("0.").append(static_cast<size_t>(-exp10 - 1), '0').append(digits);
  } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
    out.append(digits).append(static_cast<size_t>(exp10) + 1 - digits.size(), '0').append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(exp10) + 1).append(1, '.').append(digits, static_cast<size_t>(exp10) + 1);
  }
  return out;
}

namespace {

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + quote;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\u%04x", u);
          out += hex;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  int indent;
  std::string item_sep, key_sep;
};

void json_dump(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  const int indent = style.indent;
  std::string nl, nl_end;
  if (indent >= 0) {
    nl.append(1, '\n').append(static_cast<size_t>(indent * (depth + 1)), ' ');
    nl_end.append(1, '\n').append(static_cast<size_t>(indent * depth), ' ');
  }
  const std::string& item_sep = style.item_sep;
  switch (v.kind) {
    case Value::Kind::Macro:
      throw UsageError("chat template: Object of type Macro is not JSON serializable");
    case Value::Kind::Undefined:
      throw UsageError("chat template: tojson of an undefined value" +
                       (v.undefined_name.empty() ? std::string() : " ('" + v.undefined_name + "')"));
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : float_repr(v.f);
      return;
    case Value::Kind::String: json_string(out, v.s); return;
    case Value::Kind::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        out += k ? item_sep : "";
        out += nl;
        json_dump(out, (*v.list)[k], style, depth + 1);
      }
      out += nl_end + "]";
      return;
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        out += k ? item_sep : "";
        out += nl;
        json_string(out, v.dict->items[k].first);
        out += style.key_sep;
        json_dump(out, v.dict->items[k].second, style, depth + 1);
      }
      out += nl_end + "}";
      return;
  }
}

double as_double(const Value& v) {
  return v.kind == Value::Kind::Float ? v.f : static_cast<double>(v.kind == Value::Kind::Bool ? v.b : v.i);
}

}  // namespace

std::string to_repr(const Value& v) {
  return v.kind == Value::Kind::String ? string_repr(v.s) : to_str(v);
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + to_repr((*v.list)[k]);
      if (v.tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      std::string out = v.kind == Value::Kind::Namespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        out += (k ? ", " : "") + string_repr(v.dict->items[k].first) + ": " + to_repr(v.dict->items[k].second);
      }
      return out + (v.kind == Value::Kind::Namespace ? "}>" : "}");
    }
    case Value::Kind::Macro: return "<Macro>";
  }
  return "";
}

std::string to_json_text(const Value& v, int indent, const std::string* item_sep, const std::string* key_sep) {
  JsonStyle style{indent, indent >= 0 ? "," : ", ", ": "};
  if (item_sep) style.item_sep = *item_sep;
  if (key_sep) style.key_sep = *key_sep;
  std::string out;
  json_dump(out, v, style, 0);
  return out;
}

namespace {
template <class Json>
Value from_json_any(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Items items;
      for (const auto& e : j) items.push_back(from_json_any(e));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Mapping d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json_any(e));
      return Value::make_dict(std::move(d));
    }
    case nlohmann::json::value_t::binary:
    case nlohmann::json::value_t::discarded:
      break;
  }
  throw UsageError("chat template: extra_context holds a JSON value of unsupported type");
}
}  // namespace

Value from_json(const nlohmann::json& j) { return from_json_any(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_any(j); }

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      return (a.kind == Value::Kind::Bool ? a.b : a.i) == (b.kind == Value::Kind::Bool ? b.b : b.i);
    }
    return as_double(a) == as_double(b);
  }
  const bool a_map = a.kind == Value::Kind::Dict || a.kind == Value::Kind::Namespace;
  const bool b_map = b.kind == Value::Kind::Dict || b.kind == Value::Kind::Namespace;
  if (a.kind != b.kind && !(a_map && b_map)) return false;
  switch (a.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::Bool: case Value::Kind::Int: case Value::Kind::Float: return false;  // handled above
    case Value::Kind::String: return a.s == b.s;
    case Value::Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::Kind::Macro: return a.macro == b.macro;
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
  }
  return false;
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      return (a.kind == Value::Kind::Bool ? a.b : a.i) < (b.kind == Value::Kind::Bool ? b.b : b.i);
    }
    return as_double(a) < as_double(b);
  }
  if (a.kind == Value::Kind::String && b.kind == Value::Kind::String) return a.s < b.s;  // UTF-8 order = code points
  if (a.kind == Value::Kind::List && b.kind == Value::Kind::List) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  throw UsageError("chat template: '<' not supported between instances of '" + kind_name(a) + "' and '" +
                   kind_name(b) + "'");
}

}  // namespace fp4serve::text::jinja
