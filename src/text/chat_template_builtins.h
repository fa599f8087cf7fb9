// SPDX-License-Identifier: Apache-2.0
// Filters, tests, global functions and string/dict methods of the chat-template interpreter, with jinja2 3.1
// and Python 3 semantics. The names each dispatcher accepts are exactly those in chat_template_names.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/chat_template_value.h"

namespace fp4serve::text::jinja {

struct BuiltinContext {
  int line = 0;  // template line, for error messages
  std::optional<int64_t> now_unix;  // fixed clock for strftime_now (formatted as UTC); unset: local time now
};

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

/// `value | name(args, kwargs)`. Throws UsageError when the value or arguments do not fit the filter.
Value apply_filter(const std::string& name, const Value& value, const Args& args, const Kwargs& kwargs,
                   const BuiltinContext& ctx);
/// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, const Args& args, const BuiltinContext& ctx);
/// `obj.name(args, kwargs)` for strings and dicts.
Value call_method(const Value& obj, const std::string& name, const Args& args, const Kwargs& kwargs,
                  const BuiltinContext& ctx);
/// Global functions: raise_exception, range, namespace, dict, strftime_now.
Value call_function(const std::string& name, const Args& args, const Kwargs& kwargs, const BuiltinContext& ctx);

}  // namespace fp4serve::text::jinja
