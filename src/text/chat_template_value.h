// SPDX-License-Identifier: Apache-2.0
// Values of the chat-template interpreter, with the Python semantics jinja2 gives them: truthiness, str() and
// repr() formatting, ==/< comparisons, arithmetic, and JSON conversion (json.dumps style for `tojson`).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp4serve::text::jinja {

struct Value;
struct Node;
using Items = std::vector<Value>;
/// Insertion-ordered mapping (Python dicts keep insertion order; dict literals in templates rely on it).
struct Mapping {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Macro };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::shared_ptr<Items> list;  // Items
  bool tuple = false;           // a List that Python would hold as a tuple: only its repr differs, "(a, b)"
  std::shared_ptr<Mapping> dict;  // Mapping and Namespace (a namespace is mutable through `set ns.x = ...`)
  std::string undefined_name;  // for "'x' is undefined" messages
  // Macro: the {% macro %} (or {% call %} block, for `caller`) node it runs, and for `caller` the scope depth
  // of the call site whose variables its body sees. Nodes outlive values (the template owns its tree).
  const Node* macro = nullptr;
  size_t macro_scope = 0;

  static Value undefined(std::string name = "") {
    Value v;
    v.undefined_name = std::move(name);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(Kind::String);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(Items items = {}) {
    Value v = make(Kind::List);
    v.list = std::make_shared<Items>(std::move(items));
    return v;
  }
  static Value make_dict(Mapping d = {}) {
    Value v = make(Kind::Dict);
    v.dict = std::make_shared<Mapping>(std::move(d));
    return v;
  }
  static Value make_macro(const Node* node, size_t scope) {
    Value v = make(Kind::Macro);
    v.macro = node;
    v.macro_scope = scope;
    return v;
  }
  static Value make_namespace(Mapping d = {}) {
    Value v = make(Kind::Namespace);
    v.dict = std::make_shared<Mapping>(std::move(d));
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  /// Python truthiness (undefined is false).
  bool truthy() const;

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

/// Python str(): None → "None", True → "True", 0.5 → "0.5", 3.0 → "3.0", lists/dicts as repr; undefined → "".
std::string to_str(const Value& v);
/// Python repr(): strings quoted ('a' / "it's"), otherwise as to_str.
std::string to_repr(const Value& v);
/// Python float repr (shortest round-trip digits; exponent form outside 1e-4 <= |x| < 1e16).
std::string float_repr(double x);

/// json.dumps(v, ensure_ascii=False, indent=indent, separators=(item_sep, key_sep), sort_keys=false) as
/// transformers' tojson filter calls it. `indent` < 0 means None; null separators mean json.dumps' defaults
/// ("," with an indent, ", " without; ": "). Throws UsageError for undefined values and macros.
std::string to_json_text(const Value& v, int indent, const std::string* item_sep = nullptr,
                         const std::string* key_sep = nullptr);

/// nlohmann::json → Value (objects keep nlohmann's key order, which is sorted).
Value from_json(const nlohmann::json& j);
/// nlohmann::ordered_json → Value, objects in their insertion (file) order, as Python's json.loads keeps them.
Value from_json(const nlohmann::ordered_json& j);

/// Python ==, with 1 == 1.0 == True and element-wise containers; undefined equals only undefined.
bool equals(const Value& a, const Value& b);
/// Python <; throws UsageError ("'<' not supported between str and int") for unordered kinds.
bool less(const Value& a, const Value& b);

/// Name of a value's kind for messages ("str", "int", "list", ...).
std::string kind_name(const Value& v);

}  // namespace fp4serve::text::jinja
