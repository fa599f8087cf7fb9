// SPDX-License-Identifier: Apache-2.0
// The filters, tests, global functions and methods the chat-template interpreter implements. The parser
// rejects any other name up front (UnsupportedError), so a template either renders or fails at load time.
#pragma once

#include <set>
#include <string>

namespace fp4serve::text::jinja {

inline const std::set<std::string> kFilters = {
    "abs",   "capitalize", "count", "d",       "default", "dictsort", "indent", "first",   "float",  "int",        "items",
    "join",  "last",       "length", "list",   "lower",   "map",     "reject", "rejectattr", "replace",
    "reverse", "safe",     "select", "selectattr", "sort", "string", "title",  "tojson",     "trim",
    "unique", "upper"};

inline const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "sameas", "divisibleby", "eq",     "equalto",  "even",   "false",  "float", "in",
    "integer", "iterable", "lower",      "mapping", "ne",      "none",   "number", "odd",   "sequence",
    "string",  "true",    "undefined",   "upper"};

inline const std::set<std::string> kFunctions = {"dict", "namespace", "raise_exception", "range", "strftime_now"};

inline const std::set<std::string> kMethods = {
    "capitalize", "endswith", "find",  "get",     "items", "join",  "keys",  "lower", "lstrip",
    "replace",    "rstrip",   "split", "startswith", "strip", "title", "upper", "values"};

}  // namespace fp4serve::text::jinja
