// SPDX-License-Identifier: Apache-2.0
// Tree-walking evaluator for the chat-template subset: statements, scoping (each loop iteration is a fresh
// scope, as in jinja2), expressions and Python operator semantics. Filters, tests and methods live in
// chat_template_builtins.cpp.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "fp4serve/error.h"
#include "text/chat_template_ast.h"
#include "text/chat_template_builtins.h"
#include "text/chat_template_names.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::jinja {

namespace {

enum class Flow { Normal, Break, Continue };

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

class Interpreter {
 public:
  Interpreter(Mapping context, std::optional<int64_t> now_unix) {
    ctx_.now_unix = now_unix;
    scopes_.emplace_back();
    for (auto& [k, v] : context.items) scopes_.back()[k] = std::move(v);
  }

  std::string render(const Body& body) {
    std::string out;
    exec(body, out);
    return out;
  }

 private:
  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec_node(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n, std::string& out) {
    line_ = n.line;
    switch (n.kind) {
      case Node::Kind::Text:
        out += n.text;
        return Flow::Normal;
      case Node::Kind::Output:
        out += to_str(eval(*n.expr));
        return Flow::Normal;
      case Node::Kind::If:
        for (size_t k = 0; k < n.conditions.size(); ++k) {
          if (eval(*n.conditions[k]).truthy()) return exec(n.bodies[k], out);
        }
        return exec(n.else_body, out);
      case Node::Kind::For:
        exec_for(n, out);
        return Flow::Normal;
      case Node::Kind::Set:
        assign(n, eval(*n.expr));
        return Flow::Normal;
      case Node::Kind::SetBlock: {
        std::string captured;
        exec(n.body, captured);
        assign(n, Value::string(std::move(captured)));
        return Flow::Normal;
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
      case Node::Kind::Block:
        return exec(n.body, out);
      case Node::Kind::Macro:
        scopes_.back()[n.targets[0]] = Value::make_macro(&n, 0);
        return Flow::Normal;
      case Node::Kind::CallBlock: {
        // `caller` is the block's body; it sees the variables of this call site.
        const Value caller = Value::make_macro(&n, scopes_.size());
        out += to_str(call(*n.expr, &caller));
        return Flow::Normal;
      }
    }
    return Flow::Normal;
  }

  // Runs a macro (or a call block's body, for `caller`) in a fresh frame: its parameters over the template's
  // top-level variables (a call block's body sees its call site instead), as jinja2 scopes macros.
  Value invoke(const Value& m, const std::string& name, const std::vector<Value>& args,
               const std::vector<std::pair<std::string, Value>>& kwargs, const Value* caller) {
    const Node& def = *m.macro;
    const bool is_caller = def.kind == Node::Kind::CallBlock;
    if (args.size() > def.params.size()) {
      fail("macro '" + name + "' takes not more than " + std::to_string(def.params.size()) + " argument(s)");
    }
    for (const auto& [key, value] : kwargs) {
      if (std::find(def.params.begin(), def.params.end(), key) == def.params.end()) {
        fail("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
    }
    frames_.push_back({scopes_.size(), is_caller ? m.macro_scope : size_t{1}});
    scopes_.emplace_back();
    for (size_t k = 0; k < def.params.size(); ++k) {
      const std::string& param = def.params[k];
      Value v = Value::undefined(param);
      if (k < args.size()) {
        v = args[k];
      } else if (auto kw = std::find_if(kwargs.begin(), kwargs.end(), [&](const auto& p) { return p.first == param; });
                 kw != kwargs.end()) {
        v = kw->second;
      } else if (def.defaults[k]) {
        v = eval(*def.defaults[k]);  // defaults see the parameters bound before them
      }
      scopes_.back()[param] = std::move(v);
    }
    if (caller) scopes_.back()["caller"] = *caller;
    std::string out;
    const int saved_line = line_;
    exec(def.body, out);
    line_ = saved_line;
    scopes_.pop_back();
    frames_.pop_back();
    return Value::string(std::move(out));
  }

  void assign(const Node& n, Value v) {
    if (!n.attr.empty()) {
      Value target = lookup(n.targets[0]);
      if (target.kind != Value::Kind::Namespace) {
        fail("cannot assign attribute '" + n.attr + "' on non-namespace object '" + n.targets[0] + "'");
      }
      target.dict->set(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return;
    }
    const Items items = iterate(v);
    if (items.size() != n.targets.size()) {
      fail("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n.targets.size()));
    }
    for (size_t k = 0; k < items.size(); ++k) scopes_.back()[n.targets[k]] = items[k];
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    const Items parts = iterate(item);
    if (parts.size() != n.targets.size()) {
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(n.targets.size()) +
           " loop variables");
    }
    for (size_t k = 0; k < parts.size(); ++k) scopes_.back()[n.targets[k]] = parts[k];
  }

  void exec_for(const Node& n, std::string& out) {
    const Items all = iterate(eval(*n.expr));
    Items items;
    if (n.filter) {
      // The inline filter sees each candidate bound to the loop variables, before `loop` exists.
      for (const auto& item : all) {
        scopes_.emplace_back();
        bind_targets(n, item);
        const bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (keep) items.push_back(item);
      }
    } else {
      items = all;
    }
    if (items.empty()) {
      exec(n.else_body, out);
      return;
    }
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < length; ++k) {
      scopes_.emplace_back();
      Mapping loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(length - k));
      loop.set("revindex0", Value::integer(length - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k + 1 == length));
      loop.set("length", Value::integer(length));
      loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("loop.previtem"));
      loop.set("nextitem", k + 1 < length ? items[static_cast<size_t>(k + 1)] : Value::undefined("loop.nextitem"));
      scopes_.back()["loop"] = Value::make_dict(std::move(loop));
      bind_targets(n, items[static_cast<size_t>(k)]);
      const Flow f = exec(n.body, out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  Value lookup(const std::string& name) const {
    // Inside a macro: its own scopes, then the scopes below its frame's visibility limit.
    const size_t own_start = frames_.empty() ? 0 : frames_.back().start;
    for (size_t k = scopes_.size(); k-- > own_start;) {
      const auto found = scopes_[k].find(name);
      if (found != scopes_[k].end()) return found->second;
    }
    if (!frames_.empty()) {
      for (size_t k = std::min(frames_.back().outer_limit, own_start); k-- > 0;) {
        const auto found = scopes_[k].find(name);
        if (found != scopes_[k].end()) return found->second;
      }
    }
    // The global functions are defined names too (`{% if strftime_now is defined %}`).
    if (kFunctions.count(name)) return Value::make_macro(nullptr, 0);
    return Value::undefined(name);
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError("chat template line " + std::to_string(line_) + ": " + what);
  }

  Items iterate(const Value& v) const {
    switch (v.kind) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::List: return *v.list;
      case Value::Kind::Dict: {
        Items keys;
        for (const auto& [k, _] : v.dict->items) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::String: {
        Items chars;
        for (size_t pos = 0; pos < v.s.size();) {
          const size_t len = unicode::sequence_length(static_cast<unsigned char>(v.s[pos]));
          chars.push_back(Value::string(v.s.substr(pos, len)));
          pos += len;
        }
        return chars;
      }
      case Value::Kind::None: case Value::Kind::Bool: case Value::Kind::Int: case Value::Kind::Float:
      case Value::Kind::Namespace: case Value::Kind::Macro:
        break;
    }
    fail("'" + kind_name(v) + "' object is not iterable");
  }

  void require_defined(const Value& v) const {
    if (v.is_undefined()) fail("'" + (v.undefined_name.empty() ? "value" : v.undefined_name) + "' is undefined");
  }

  // ------------------------------------------------------------------------------------------ expressions

  Value eval(const Expr& e) {
    line_ = e.line ? e.line : line_;
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::ListLit: {
        Items items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        Value list = Value::make_list(std::move(items));
        list.tuple = e.is_tuple;
        return list;
      }
      case Expr::Kind::DictLit: {
        Mapping d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (key.kind != Value::Kind::String) fail("dict literal keys must be strings, found " + kind_name(key));
          d.set(key.s, eval(*e.args[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
      case Expr::Kind::GetAttr: return get_attr(eval(*e.args[0]), e.name, *e.args[0]);
      case Expr::Kind::GetItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), *e.args[0]);
      case Expr::Kind::Slice: return slice(e);
      case Expr::Kind::Call: return call(e, nullptr);
      case Expr::Kind::Filter: {
        std::vector<Value> args;
        for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        return apply_filter(e.name, eval(*e.args[0]), args, eval_kwargs(e), *this_context());
      }
      case Expr::Kind::Test: {
        std::vector<Value> args;
        for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        const bool r = apply_test(e.name, eval(*e.args[0]), args, *this_context());
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Kind::Not: return Value::boolean(!eval(*e.args[0]).truthy());
      case Expr::Kind::Negate: {
        const Value v = eval(*e.args[0]);
        if (v.kind == Value::Kind::Float) return Value::floating(-v.f);
        if (v.is_number()) return Value::integer(-(v.kind == Value::Kind::Bool ? v.b : v.i));
        fail("bad operand type for unary -: '" + kind_name(v) + "'");
      }
      case Expr::Kind::Binary: return binary(e);
      case Expr::Kind::Compare: return compare(e);
      case Expr::Kind::Conditional:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined();
    }
    return Value::undefined();
  }

  const BuiltinContext* this_context() {
    ctx_.line = line_;
    return &ctx_;
  }

  std::vector<std::pair<std::string, Value>> eval_kwargs(const Expr& e) {
    std::vector<std::pair<std::string, Value>> out;
    for (const auto& [k, v] : e.kwargs) out.emplace_back(k, eval(*v));
    return out;
  }

  static std::string describe(const Expr& e) {
    if (e.kind == Expr::Kind::Name) return e.name;
    if (e.kind == Expr::Kind::GetAttr) return describe(*e.args[0]) + "." + e.name;
    return "value";
  }

  Value get_attr(const Value& obj, const std::string& name, const Expr& obj_expr) {
    if (obj.is_undefined()) fail("'" + describe(obj_expr) + "' is undefined (reading ." + name + ")");
    if (obj.kind == Value::Kind::Dict || obj.kind == Value::Kind::Namespace) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
    return Value::undefined(describe(obj_expr) + "." + name);
  }

  Value get_item(const Value& obj, const Value& key, const Expr& obj_expr) {
    if (obj.is_undefined()) fail("'" + describe(obj_expr) + "' is undefined (subscripted)");
    if ((obj.kind == Value::Kind::Dict || obj.kind == Value::Kind::Namespace) && key.kind == Value::Kind::String) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      return Value::undefined(describe(obj_expr) + "['" + key.s + "']");
    }
    if ((obj.kind == Value::Kind::List || obj.kind == Value::Kind::String) && key.kind == Value::Kind::Int) {
      const Items items = iterate(obj);
      const int64_t n = static_cast<int64_t>(items.size());
      const int64_t idx = key.i < 0 ? key.i + n : key.i;
      if (idx < 0 || idx >= n) return Value::undefined(describe(obj_expr) + "[" + std::to_string(key.i) + "]");
      return items[static_cast<size_t>(idx)];
    }
    return Value::undefined(describe(obj_expr) + "[" + to_repr(key) + "]");
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    if (obj.kind != Value::Kind::List && obj.kind != Value::Kind::String) fail("cannot slice a " + kind_name(obj));
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      const Value v = eval(*e.args[k]);
      if (v.kind == Value::Kind::None) return std::nullopt;
      if (v.kind != Value::Kind::Int) fail("slice indices must be integers");
      return v.i;
    };
    const auto start = bound(1), stop = bound(2), step_opt = bound(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) fail("slice step cannot be zero");
    const Items items = iterate(obj);
    const auto n = static_cast<int64_t>(items.size());
    // Python's slice.indices().
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t b = clamp(start, step > 0 ? 0 : n - 1), en = clamp(stop, step > 0 ? n : -1);
    Items out;
    for (int64_t k = b; step > 0 ? k < en : k > en; k += step) out.push_back(items[static_cast<size_t>(k)]);
    if (obj.kind == Value::Kind::List) return Value::make_list(std::move(out));
    std::string s;
    for (const auto& c : out) s += c.s;
    return Value::string(std::move(s));
  }

  Value call(const Expr& e, const Value* caller) {
    std::vector<Value> args;
    for (size_t k = e.is_method ? 1 : 0; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    const auto kwargs = eval_kwargs(e);
    if (e.is_macro) {
      const Value m = lookup(e.name);
      if (m.kind != Value::Kind::Macro || m.macro == nullptr) {
        fail(m.is_undefined() ? "'" + e.name + "' is undefined" : "'" + kind_name(m) + "' object is not callable");
      }
      return invoke(m, e.name, args, kwargs, caller);
    }
    if (e.is_method) {
      const Value obj = eval(*e.args[0]);
      if (obj.is_undefined()) fail("'" + describe(*e.args[0]) + "' is undefined (calling ." + e.name + "())");
      return call_method(obj, e.name, args, kwargs, *this_context());
    }
    return call_function(e.name, args, kwargs, *this_context());
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0]);
      return l.truthy() ? eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0]);
      return l.truthy() ? l : eval(*e.args[1]);
    }
    const Value l = eval(*e.args[0]), r = eval(*e.args[1]);
    if (op == "~") return Value::string(to_str(l) + to_str(r));
    if (l.is_undefined()) require_defined(l);
    if (r.is_undefined()) require_defined(r);
    const auto bad = [&]() -> Value {
      fail("unsupported operand types for " + op + ": '" + kind_name(l) + "' and '" + kind_name(r) + "'");
    };
    if (op == "+") {
      if (l.kind == Value::Kind::String && r.kind == Value::Kind::String) return Value::string(l.s + r.s);
      if (l.kind == Value::Kind::List && r.kind == Value::Kind::List) {
        Items items = *l.list;
        items.insert(items.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(items));
      }
    }
    if (op == "*" && l.kind == Value::Kind::String && r.kind == Value::Kind::Int) {
      std::string s;
      for (int64_t k = 0; k < r.i && k < 1000000; ++k) s += l.s;
      return Value::string(std::move(s));
    }
    if (!l.is_number() || !r.is_number()) return bad();
    const bool ints = l.kind != Value::Kind::Float && r.kind != Value::Kind::Float;
    const int64_t li = l.kind == Value::Kind::Bool ? l.b : l.i, ri = r.kind == Value::Kind::Bool ? r.b : r.i;
    const double lf = l.kind == Value::Kind::Float ? l.f : static_cast<double>(li);
    const double rf = r.kind == Value::Kind::Float ? r.f : static_cast<double>(ri);
    if (op == "+") return ints ? Value::integer(li + ri) : Value::floating(lf + rf);
    if (op == "-") return ints ? Value::integer(li - ri) : Value::floating(lf - rf);
    if (op == "*") return ints ? Value::integer(li * ri) : Value::floating(lf * rf);
    if (op == "/") {
      if (rf == 0.0) fail("division by zero");
      return Value::floating(lf / rf);
    }
    if (op == "//" || op == "%") {
      if (rf == 0.0) fail("integer division or modulo by zero");
      if (ints) return Value::integer(op == "//" ? floor_div(li, ri) : li - floor_div(li, ri) * ri);
      const double q = std::floor(lf / rf);
      return Value::floating(op == "//" ? q : lf - q * rf);
    }
    if (op == "**") {
      if (ints && ri >= 0) {
        int64_t result = 1;
        for (int64_t k = 0; k < ri && k < 64; ++k) result *= li;
        return Value::integer(result);
      }
      return Value::floating(std::pow(lf, rf));
    }
    return bad();
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Value::Kind::String:
        if (item.kind != Value::Kind::String) fail("'in <string>' requires string as left operand");
        return container.s.find(item.s) != std::string::npos;
      case Value::Kind::List:
        for (const auto& x : *container.list) {
          if (equals(x, item)) return true;
        }
        return false;
      case Value::Kind::Dict:
      case Value::Kind::Namespace:
        return item.kind == Value::Kind::String && container.dict->find(item.s) != nullptr;
      case Value::Kind::Undefined:  // jinja2's Undefined iterates as empty: `x in undefined` is False
        return false;
      case Value::Kind::None: case Value::Kind::Bool: case Value::Kind::Int: case Value::Kind::Float:
      case Value::Kind::Macro:
        break;
    }
    fail("argument of type '" + kind_name(container) + "' is not iterable");
  }

  Value compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t k = 0; k < e.ops.size(); ++k) {
      Value right = eval(*e.args[k + 1]);
      const std::string& op = e.ops[k];
      bool r = false;
      if (op == "==") {
        r = equals(left, right);
      } else if (op == "!=") {
        r = !equals(left, right);
      } else if (op == "in" || op == "not in") {
        r = contains(right, left) == (op == "in");
      } else {
        require_defined(left);
        require_defined(right);
        try {
          if (op == "<") r = less(left, right);
          if (op == ">") r = less(right, left);
          if (op == "<=") r = !less(right, left);
          if (op == ">=") r = !less(left, right);
        } catch (const UsageError& err) {
          fail(err.what());
        }
      }
      if (!r) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }

  using Scope = std::unordered_map<std::string, Value>;
  struct Frame {
    size_t start;        // first scope of the running macro
    size_t outer_limit;  // scopes [0, outer_limit) stay visible below it
  };
  std::vector<Scope> scopes_;
  std::vector<Frame> frames_;
  int line_ = 0;
  BuiltinContext ctx_;
};

}  // namespace

std::string render_template(const Body& body, Mapping context, std::optional<int64_t> now_unix) {
  Interpreter interpreter(std::move(context), now_unix);
  return interpreter.render(body);
}

}  // namespace fp4serve::text::jinja
