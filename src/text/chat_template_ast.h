// SPDX-License-Identifier: Apache-2.0
// Syntax tree of the Jinja subset chat templates use, and the parser that builds it from template source with
// the environment transformers renders chat templates in (trim_blocks, lstrip_blocks, keep_trailing_newline
// off, loopcontrols). Constructs outside the subset are rejected at parse time with UnsupportedError naming them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/chat_template_value.h"

namespace fp4serve::text::jinja {

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    ListLit,    // args
    DictLit,    // args = key0, value0, key1, value1, ...
    GetAttr,    // args[0].name
    GetItem,    // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]]; absent bounds are nullptr
    Call,       // name(args, kwargs) for a global function or a macro (is_macro), or args[0].name(args[1..], kwargs)
                // when is_method
    Filter,     // args[0] | name(args[1..], kwargs)
    Test,       // args[0] is [not] name(args[1..])
    Not,        // not args[0]
    Negate,     // -args[0]
    Binary,     // args[0] op args[1]: or and + - * / // % ** ~ in "not in"
    Compare,    // args[0] ops[0] args[1] ops[1] args[2] ... (chained as in Python)
    Conditional,  // args[1] if args[0] else args[2] (args[2] may be nullptr)
  };
  Kind kind = Kind::Literal;
  Value value;
  std::string name;
  std::vector<std::string> ops;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  bool is_method = false;
  bool is_tuple = false;  // ListLit written as a tuple: (a, b)
  bool is_macro = false;  // Call of a {% macro %} (or `caller`), looked up by name when rendered
  bool negated = false;
  int line = 0;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // conditions[k] → bodies[k]; else_body
    For,       // {% for targets in expr [if filter] %} body {% else %} else_body
    Set,       // {% set targets = expr %} or {% set targets[0].attr = expr %}
    SetBlock,  // {% set targets[0] %} body {% endset %}
    Break,
    Continue,
    Block,     // {% generation %} body: rendered as is
    Macro,     // {% macro targets[0](params = defaults) %} body: binds a macro value to the name
    CallBlock, // {% call(params) expr %} body {% endcall %}: expr (a macro Call) runs with `caller` = body
  };
  Kind kind = Kind::Text;
  std::string text;
  std::unique_ptr<Expr> expr, filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::unique_ptr<Expr>> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::string> params;                // Macro / CallBlock parameters
  std::vector<std::unique_ptr<Expr>> defaults;    // aligned with params; nullptr where there is none
  int line = 0;
};

/// Parses `source`. Throws FormatError for syntax errors and UnsupportedError for Jinja features outside the
/// subset (include, import, extends, unknown filters, tests, functions or methods, calls of names that are
/// neither a global function nor a macro the template defines), each naming the construct and the line.
Body parse_template(std::string_view source);

/// Renders a parsed template with `context` as its outermost scope. Throws UsageError for raise_exception and
/// for errors the data causes (undefined attribute access, type errors), naming the template line.
/// `now_unix` fixes the clock strftime_now reads (formatted as UTC), for reproducible renders.
std::string render_template(const Body& body, Mapping context, std::optional<int64_t> now_unix = std::nullopt);

}  // namespace fp4serve::text::jinja
