// SPDX-License-Identifier: Apache-2.0
#include "text/chat_template_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <optional>

#include "fp4serve/error.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::jinja {

namespace {

[[noreturn]] void fail(const BuiltinContext& ctx, const std::string& what) {
  throw UsageError("chat template line " + std::to_string(ctx.line) + ": " + what);
}

// Positional argument `index` or keyword `name`, whichever is given.
std::optional<Value> arg(const Args& args, const Kwargs& kwargs, size_t index, const char* name) {
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  if (index < args.size()) return args[index];
  return std::nullopt;
}

const std::string& need_string(const Value& v, const BuiltinContext& ctx, const char* what) {
  if (v.kind != Value::Kind::String) fail(ctx, std::string(what) + " expects a string, found " + kind_name(v));
  return v.s;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = unicode::sequence_length(static_cast<unsigned char>(s[pos]));
    out.push_back(s.substr(pos, len));
    pos += len;
  }
  return out;
}

char32_t cp_of(const std::string& ch) {
  size_t len = 0;
  return unicode::decode_at(ch, 0, len);
}

// Python str.isspace(): White_Space plus the separators U+001C..U+001F.
bool py_space(char32_t c) { return unicode::is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  for (const auto& ch : code_points(s)) {
    const auto c = static_cast<utf8proc_int32_t>(cp_of(ch));
    unicode::append_utf8(out, static_cast<char32_t>(upper ? utf8proc_toupper(c) : utf8proc_tolower(c)));
  }
  return out;
}

bool is_cased_letter(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string py_strip(const std::string& s, const std::optional<Value>& chars, bool left, bool right,
                     const BuiltinContext& ctx) {
  const auto cps = code_points(s);
  std::vector<std::string> set;
  const bool custom = chars && chars->kind != Value::Kind::None;
  if (custom) set = code_points(need_string(*chars, ctx, "strip()"));
  auto strip_it = [&](const std::string& ch) {
    return custom ? std::find(set.begin(), set.end(), ch) != set.end() : py_space(cp_of(ch));
  };
  size_t b = 0, e = cps.size();
  while (left && b < e && strip_it(cps[b])) ++b;
  while (right && e > b && strip_it(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

// Python str.split(sep=None, maxsplit=-1).
Value py_split(const std::string& s, const std::optional<Value>& sep_v, int64_t maxsplit, const BuiltinContext& ctx) {
  Items parts;
  if (!sep_v || sep_v->kind == Value::Kind::None) {
    const auto cps = code_points(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && py_space(cp_of(cps[k]))) ++k;
      if (k == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        std::string rest;
        for (size_t j = k; j < cps.size(); ++j) rest += cps[j];
        // Python keeps trailing whitespace out of the last part only when splitting fully.
        parts.push_back(Value::string(rest));
        break;
      }
      std::string word;
      while (k < cps.size() && !py_space(cp_of(cps[k]))) word += cps[k++];
      parts.push_back(Value::string(word));
    }
    return Value::make_list(std::move(parts));
  }
  const std::string& sep = need_string(*sep_v, ctx, "split()");
  if (sep.empty()) fail(ctx, "split(): empty separator");
  size_t prev = 0;
  for (size_t at = s.find(sep); at != std::string::npos; at = s.find(sep, prev)) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
    parts.push_back(Value::string(s.substr(prev, at - prev)));
    prev = at + sep.size();
  }
  parts.push_back(Value::string(s.substr(prev)));
  return Value::make_list(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts the replacement around every character
    for (const auto& ch : code_points(s)) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += ch;
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t prev = 0;
  for (size_t at = s.find(old); at != std::string::npos && (count < 0 || done < count); at = s.find(old, prev)) {
    out += s.substr(prev, at - prev) + repl;
    prev = at + old.size();
    ++done;
  }
  return out + s.substr(prev);
}

std::string py_capitalize(const std::string& s) {
  const auto cps = code_points(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) out += map_case(cps[k], k == 0);
  return out;
}

// Python str.title(): a cased letter after a non-cased character starts a word.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const auto& ch : code_points(s)) {
    const bool cased = is_cased_letter(cp_of(ch));
    out += cased ? map_case(ch, !prev_cased) : ch;
    prev_cased = cased;
  }
  return out;
}

// jinja2's title filter: words start after whitespace, '-', or an opening bracket.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (const auto& ch : code_points(s)) {
    const char32_t c = cp_of(ch);
    const bool boundary = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += boundary ? ch : map_case(ch, at_start);
    at_start = boundary;
  }
  return out;
}

int64_t py_len(const Value& v, const BuiltinContext& ctx) {
  switch (v.kind) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(code_points(v.s).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list->size());
    case Value::Kind::Dict: case Value::Kind::Namespace: return static_cast<int64_t>(v.dict->items.size());
    case Value::Kind::None: case Value::Kind::Bool: case Value::Kind::Int: case Value::Kind::Float:
    case Value::Kind::Macro:
      break;
  }
  fail(ctx, "object of type '" + kind_name(v) + "' has no len()");
}

Items as_list(const Value& v, const BuiltinContext& ctx) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::String: {
      Items out;
      for (const auto& ch : code_points(v.s)) out.push_back(Value::string(ch));
      return out;
    }
    case Value::Kind::Dict: {
      Items out;
      for (const auto& [k, _] : v.dict->items) out.push_back(Value::string(k));
      return out;
    }
    case Value::Kind::None: case Value::Kind::Bool: case Value::Kind::Int: case Value::Kind::Float:
    case Value::Kind::Namespace: case Value::Kind::Macro:
      break;
  }
  fail(ctx, "'" + kind_name(v) + "' object is not iterable");
}

// jinja2's attribute lookup for filters (map/selectattr/sort attribute=): dotted paths, missing → undefined.
Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const Value* next = (cur.kind == Value::Kind::Dict || cur.kind == Value::Kind::Namespace) ? cur.dict->find(part)
                                                                                               : nullptr;
    if (next == nullptr) return Value::undefined(path);
    cur = *next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value items_of(const Value& v, const BuiltinContext& ctx) {
  if (v.is_undefined()) return Value::make_list();
  if (v.kind != Value::Kind::Dict && v.kind != Value::Kind::Namespace) fail(ctx, "items() of a " + kind_name(v));
  Items out;
  for (const auto& [k, x] : v.dict->items) {
    Value pair = Value::make_list({Value::string(k), x});
    pair.tuple = true;  // dict.items() yields tuples
    out.push_back(std::move(pair));
  }
  return Value::make_list(std::move(out));
}

// select/reject/selectattr/rejectattr: keep items whose test (or truthiness) equals `keep`.
Value filter_items(const Value& v, const Args& args, bool by_attribute, bool keep, const BuiltinContext& ctx) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.empty()) fail(ctx, "selectattr/rejectattr need an attribute name");
    attribute = need_string(args[next++], ctx, "selectattr()");
  }
  std::optional<std::string> test;
  if (next < args.size()) test = need_string(args[next++], ctx, "select test");
  const Args test_args(args.begin() + static_cast<std::ptrdiff_t>(next), args.end());
  Items out;
  for (const auto& item : as_list(v, ctx)) {
    const Value subject = by_attribute ? attribute_of(item, attribute) : item;
    const bool r = test ? apply_test(*test, subject, test_args, ctx) : subject.truthy();
    if (r == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, const Args& args, const Kwargs& kwargs,
                   const BuiltinContext& ctx) {
  // jinja2's do_trim strips str(value), so a list of content parts trims to its repr.
  if (name == "trim") return Value::string(py_strip(to_str(v), arg(args, kwargs, 0, "chars"), true, true, ctx));
  if (name == "length" || name == "count") return Value::integer(py_len(v, ctx));
  if (name == "upper") return Value::string(map_case(to_str(v), true));
  if (name == "lower") return Value::string(map_case(to_str(v), false));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe") return v;
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    const auto ensure_ascii = arg(args, kwargs, 0, "ensure_ascii");
    const auto indent = arg(args, kwargs, 1, "indent");
    const auto separators = arg(args, kwargs, 2, "separators");
    const auto sort_keys = arg(args, kwargs, 3, "sort_keys");
    if (ensure_ascii && ensure_ascii->truthy()) {
      throw UnsupportedError("chat template line " + std::to_string(ctx.line) + ": tojson with ensure_ascii is not supported");
    }
    std::optional<std::string> item_sep, key_sep;
    if (separators && separators->kind != Value::Kind::None) {
      if (separators->kind != Value::Kind::List || separators->list->size() != 2 ||
          (*separators->list)[0].kind != Value::Kind::String || (*separators->list)[1].kind != Value::Kind::String) {
        fail(ctx, "tojson separators must be a pair of strings, found " + to_repr(*separators));
      }
      item_sep = (*separators->list)[0].s;
      key_sep = (*separators->list)[1].s;
    }
    int width = -1;
    if (indent && indent->kind == Value::Kind::Int) width = static_cast<int>(std::clamp<int64_t>(indent->i, 0, 64));
    Value subject = v;
    if (sort_keys && sort_keys->truthy()) {
      // Sorting is recursive in json.dumps.
      std::function<Value(const Value&)> sorted = [&](const Value& x) -> Value {
        if (x.kind == Value::Kind::List) {
          Items items;
          for (const auto& e : *x.list) items.push_back(sorted(e));
          return Value::make_list(std::move(items));
        }
        if (x.kind != Value::Kind::Dict) return x;
        Mapping d;
        for (const auto& [k, e] : x.dict->items) d.items.emplace_back(k, sorted(e));
        std::stable_sort(d.items.begin(), d.items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        return Value::make_dict(std::move(d));
      };
      subject = sorted(v);
    }
    try {
      return Value::string(to_json_text(subject, width, item_sep ? &*item_sep : nullptr, key_sep ? &*key_sep : nullptr));
    } catch (const UsageError& e) {
      fail(ctx, e.what());
    }
  }
  if (name == "default" || name == "d") {
    const Value dflt = arg(args, kwargs, 0, "default_value").value_or(Value::string(""));
    const auto boolean = arg(args, kwargs, 1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_default ? dflt : v;
  }
  if (name == "first" || name == "last") {
    const Items items = as_list(v, ctx);
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const std::string sep = to_str(arg(args, kwargs, 0, "d").value_or(Value::string("")));
    const auto attribute = arg(args, kwargs, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : as_list(v, ctx)) {
      out += (first ? "" : sep) + to_str(attribute ? attribute_of(item, to_str(*attribute)) : item);
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "int" || name == "float") {
    const Value dflt = arg(args, kwargs, 0, "default").value_or(name == "int" ? Value::integer(0) : Value::floating(0));
    double x = 0;
    if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool) {
      x = static_cast<double>(v.kind == Value::Kind::Bool ? v.b : v.i);
      if (name == "int") return Value::integer(v.kind == Value::Kind::Bool ? v.b : v.i);
    } else if (v.kind == Value::Kind::Float) {
      x = v.f;
    } else if (v.kind == Value::Kind::String) {
      try {
        size_t used = 0;
        const std::string t = py_strip(v.s, std::nullopt, true, true, ctx);
        x = std::stod(t, &used);
        if (used != t.size()) return dflt;
      } catch (const std::exception&) {
        return dflt;
      }
    } else {
      return dflt;
    }
    return name == "int" ? Value::integer(static_cast<int64_t>(std::trunc(x))) : Value::floating(x);
  }
  if (name == "list") return Value::make_list(as_list(v, ctx));
  if (name == "items") return items_of(v, ctx);
  if (name == "dictsort") {
    // dictsort(case_sensitive=False, by='key', reverse=False): (key, value) pairs sorted by key or value.
    const auto case_sensitive = arg(args, kwargs, 0, "case_sensitive");
    const auto by = arg(args, kwargs, 1, "by");
    const auto reverse = arg(args, kwargs, 2, "reverse");
    const bool by_value = by && to_str(*by) == "value";
    if (by && !by_value && to_str(*by) != "key") fail(ctx, "dictsort: You can only sort by either 'key' or 'value'");
    Items pairs = *items_of(v, ctx).list;
    auto key = [&](const Value& pair) {
      Value k = (*pair.list)[by_value ? 1 : 0];
      if (k.kind == Value::Kind::String && !(case_sensitive && case_sensitive->truthy())) k.s = map_case(k.s, false);
      return k;
    };
    try {
      std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) { return less(key(a), key(b)); });
    } catch (const UsageError& e) {
      fail(ctx, e.what());
    }
    if (reverse && reverse->truthy()) std::reverse(pairs.begin(), pairs.end());
    return Value::make_list(std::move(pairs));
  }
  if (name == "indent") {
    // indent(width=4, first=False, blank=False): indents every line after the first (and blank lines only
    // when asked), as jinja2's do_indent.
    const auto width_v = arg(args, kwargs, 0, "width");
    const auto first = arg(args, kwargs, 1, "first");
    const auto blank = arg(args, kwargs, 2, "blank");
    std::string pad = "    ";
    if (width_v && width_v->kind == Value::Kind::String) pad = width_v->s;
    if (width_v && width_v->kind == Value::Kind::Int) pad.assign(static_cast<size_t>(std::clamp<int64_t>(width_v->i, 0, 256)), ' ');
    std::string text = to_str(v);
    std::string out;
    const bool indent_blank = blank && blank->truthy();
    size_t start = 0;
    bool first_line = true;
    while (true) {
      const size_t nl = text.find('\n', start);
      const std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool pad_it = first_line ? (first && first->truthy()) : (indent_blank || !line.empty());
      if (pad_it) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    const auto old_v = arg(args, kwargs, 0, "old"), new_v = arg(args, kwargs, 1, "new");
    if (!old_v || !new_v) fail(ctx, "replace needs old and new strings");
    const auto count = arg(args, kwargs, 2, "count");
    return Value::string(py_replace(to_str(v), to_str(*old_v), to_str(*new_v),
                                    count && count->kind == Value::Kind::Int ? count->i : -1));
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::Float) return Value::floating(std::fabs(v.f));
    if (v.is_number()) return Value::integer(std::llabs(v.kind == Value::Kind::Bool ? v.b : v.i));
    fail(ctx, "abs of a " + kind_name(v));
  }
  if (name == "reverse") {
    Items items = as_list(v, ctx);
    std::reverse(items.begin(), items.end());
    if (v.kind != Value::Kind::String) return Value::make_list(std::move(items));
    std::string s;
    for (const auto& c : items) s += c.s;
    return Value::string(std::move(s));
  }
  if (name == "map") {
    Items out;
    const auto attribute = arg({}, kwargs, 0, "attribute");
    for (const auto& item : as_list(v, ctx)) {
      if (attribute) {
        Value x = attribute_of(item, to_str(*attribute));
        if (x.is_undefined()) x = arg({}, kwargs, 0, "default").value_or(x);
        out.push_back(std::move(x));
      } else {
        if (args.empty()) fail(ctx, "map needs a filter name or attribute=");
        const std::string filter = need_string(args[0], ctx, "map()");
        if (filter == "map") fail(ctx, "map(\"map\") is not supported");
        out.push_back(apply_filter(filter, item, Args(args.begin() + 1, args.end()), {}, ctx));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "select" || name == "reject") return filter_items(v, args, false, name == "select", ctx);
  if (name == "selectattr" || name == "rejectattr") return filter_items(v, args, true, name == "selectattr", ctx);
  if (name == "sort" || name == "unique") {
    const auto reverse = name == "sort" ? arg(args, kwargs, 0, "reverse") : std::nullopt;
    const auto case_sensitive = arg(args, kwargs, name == "sort" ? 1 : 0, "case_sensitive");
    const auto attribute = arg(args, kwargs, name == "sort" ? 2 : 1, "attribute");
    auto key = [&](const Value& x) {
      Value k = attribute ? attribute_of(x, to_str(*attribute)) : x;
      if (k.kind == Value::Kind::String && !(case_sensitive && case_sensitive->truthy())) k.s = map_case(k.s, false);
      return k;
    };
    Items items = as_list(v, ctx);
    if (name == "unique") {
      Items out;
      std::vector<Value> seen;
      for (const auto& x : items) {
        const Value k = key(x);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return Value::make_list(std::move(out));
    }
    try {
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) { return less(key(a), key(b)); });
    } catch (const UsageError& e) {
      fail(ctx, e.what());
    }
    if (reverse && reverse->truthy()) std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  throw UnsupportedError("chat template line " + std::to_string(ctx.line) + ": filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const Args& args, const BuiltinContext& ctx) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == K::None;
  if (name == "callable") return v.kind == K::Macro;
  if (name == "sameas") {
    if (args.empty()) fail(ctx, "'sameas' test needs an argument");
    const Value& o = args[0];
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case K::Undefined: case K::None: return true;
      case K::Bool: return v.b == o.b;
      case K::Int: return v.i == o.i;
      case K::Float: return v.f == o.f;
      case K::String: return v.s == o.s;
      case K::List: return v.list == o.list;
      case K::Dict: case K::Namespace: return v.dict == o.dict;
      case K::Macro: return v.macro == o.macro;
    }
    return false;
  }
  if (name == "string") return v.kind == K::String;
  if (name == "number") return v.kind == K::Int || v.kind == K::Float || v.kind == K::Bool;
  if (name == "integer") return v.kind == K::Int;
  if (name == "float") return v.kind == K::Float;
  if (name == "boolean") return v.kind == K::Bool;
  if (name == "true") return v.kind == K::Bool && v.b;
  if (name == "false") return v.kind == K::Bool && !v.b;
  if (name == "mapping") return v.kind == K::Dict;
  if (name == "iterable") return v.kind == K::List || v.kind == K::Dict || v.kind == K::String;
  if (name == "sequence") return v.kind == K::List || v.kind == K::Dict || v.kind == K::String;
  if (name == "lower" || name == "upper") {
    if (v.kind != K::String) return false;
    bool any_cased = false;
    for (const auto& ch : code_points(v.s)) {
      const char32_t c = cp_of(ch);
      if (!is_cased_letter(c)) continue;
      any_cased = true;
      if (map_case(ch, name == "upper") != ch) return false;
    }
    return any_cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != K::Int) fail(ctx, "test '" + name + "' needs an integer, found " + kind_name(v));
    int64_t d = 2;
    if (name == "divisibleby") {
      if (args.empty() || args[0].kind != K::Int || args[0].i == 0) fail(ctx, "divisibleby needs a non-zero integer");
      d = args[0].i;
    }
    const bool divisible = v.i % d == 0;
    return name == "odd" ? !divisible : divisible;
  }
  if (name == "eq" || name == "equalto" || name == "ne") {
    if (args.empty()) fail(ctx, "test '" + name + "' needs an argument");
    return equals(v, args[0]) == (name != "ne");
  }
  if (name == "in") {
    if (args.empty()) fail(ctx, "test 'in' needs an argument");
    const Value& seq = args[0];
    if (seq.kind == K::String) return v.kind == K::String && seq.s.find(v.s) != std::string::npos;
    if (seq.kind == K::Dict) return v.kind == K::String && seq.dict->find(v.s) != nullptr;
    for (const auto& x : as_list(seq, ctx)) {
      if (equals(x, v)) return true;
    }
    return false;
  }
  throw UnsupportedError("chat template line " + std::to_string(ctx.line) + ": test '" + name + "'");
}

Value call_method(const Value& obj, const std::string& name, const Args& args, const Kwargs& kwargs,
                  const BuiltinContext& ctx) {
  if (obj.kind == Value::Kind::Dict || obj.kind == Value::Kind::Namespace) {
    if (name == "get") {
      const auto key = arg(args, kwargs, 0, "key");
      if (!key) fail(ctx, "get() needs a key");
      const Value* found = key->kind == Value::Kind::String ? obj.dict->find(key->s) : nullptr;
      return found ? *found : arg(args, kwargs, 1, "default").value_or(Value::none());
    }
    if (name == "items") return items_of(obj, ctx);
    if (name == "keys" || name == "values") {
      Items out;
      for (const auto& [k, x] : obj.dict->items) out.push_back(name == "keys" ? Value::string(k) : x);
      return Value::make_list(std::move(out));
    }
    fail(ctx, "'dict' object has no method " + name + "()");
  }
  if (obj.kind != Value::Kind::String) fail(ctx, "'" + kind_name(obj) + "' object has no method " + name + "()");
  const std::string& s = obj.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::string(py_strip(s, arg(args, kwargs, 0, "chars"), name != "rstrip", name != "lstrip", ctx));
  }
  if (name == "upper" || name == "lower") return Value::string(map_case(s, name == "upper"));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "startswith" || name == "endswith") {
    const auto what = arg(args, kwargs, 0, "prefix");
    if (!what) fail(ctx, name + "() needs an argument");
    Items options = what->kind == Value::Kind::List ? *what->list : Items{*what};
    for (const auto& o : options) {
      const std::string& p = need_string(o, ctx, "startswith()/endswith()");
      if (p.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "split") {
    const auto maxsplit = arg(args, kwargs, 1, "maxsplit");
    return py_split(s, arg(args, kwargs, 0, "sep"), maxsplit && maxsplit->kind == Value::Kind::Int ? maxsplit->i : -1, ctx);
  }
  if (name == "replace") {
    const auto old_v = arg(args, kwargs, 0, "old"), new_v = arg(args, kwargs, 1, "new");
    if (!old_v || !new_v) fail(ctx, "replace() needs two arguments");
    const auto count = arg(args, kwargs, 2, "count");
    return Value::string(py_replace(s, need_string(*old_v, ctx, "replace()"), need_string(*new_v, ctx, "replace()"),
                                    count && count->kind == Value::Kind::Int ? count->i : -1));
  }
  if (name == "find") {
    const auto sub = arg(args, kwargs, 0, "sub");
    if (!sub) fail(ctx, "find() needs an argument");
    const size_t at = s.find(need_string(*sub, ctx, "find()"));
    return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(code_points(s.substr(0, at)).size()));
  }
  if (name == "join") {
    const auto items = arg(args, kwargs, 0, "iterable");
    if (!items) fail(ctx, "join() needs an argument");
    std::string out;
    bool first = true;
    for (const auto& x : as_list(*items, ctx)) {
      out += (first ? "" : s) + need_string(x, ctx, "str.join()");
      first = false;
    }
    return Value::string(std::move(out));
  }
  fail(ctx, "'str' object has no method " + name + "()");
}

Value call_function(const std::string& name, const Args& args, const Kwargs& kwargs, const BuiltinContext& ctx) {
  if (name == "raise_exception") {
    throw UsageError("chat template raised an exception (line " + std::to_string(ctx.line) +
                     "): " + (args.empty() ? std::string() : to_str(args[0])));
  }
  if (name == "range") {
    if (args.empty() || args.size() > 3) fail(ctx, "range() takes 1 to 3 integers");
    for (const auto& a : args) {
      if (a.kind != Value::Kind::Int) fail(ctx, "range() arguments must be integers");
    }
    const int64_t start = args.size() > 1 ? args[0].i : 0, stop = args.size() > 1 ? args[1].i : args[0].i;
    const int64_t step = args.size() > 2 ? args[2].i : 1;
    if (step == 0) fail(ctx, "range() step must not be zero");
    Items out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (out.size() >= 100000) fail(ctx, "range() longer than 100000 items (the sandbox limit)");
      out.push_back(Value::integer(k));
    }
    return Value::make_list(std::move(out));
  }
  if (name == "namespace" || name == "dict") {
    Mapping d;
    for (const auto& a : args) {
      if (a.kind != Value::Kind::Dict) fail(ctx, name + "() positional arguments must be dicts");
      for (const auto& [k, x] : a.dict->items) d.set(k, x);
    }
    for (const auto& [k, x] : kwargs) d.set(k, x);
    return name == "namespace" ? Value::make_namespace(std::move(d)) : Value::make_dict(std::move(d));
  }
  if (name == "strftime_now") {
    if (args.empty() || args[0].kind != Value::Kind::String) fail(ctx, "strftime_now() needs a format string");
    std::tm local{};
    if (ctx.now_unix) {
      const auto fixed = static_cast<std::time_t>(*ctx.now_unix);
      gmtime_r(&fixed, &local);
    } else {
      const std::time_t now = std::time(nullptr);
      localtime_r(&now, &local);
    }
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), args[0].s.c_str(), &local);
    return Value::string(std::string(buf, n));
  }
  throw UnsupportedError("chat template line " + std::to_string(ctx.line) + ": function " + name + "()");
}

}  // namespace fp4serve::text::jinja
