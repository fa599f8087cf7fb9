// SPDX-License-Identifier: Apache-2.0
#include "server/tool_request.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/openai_api.h"

namespace fp4serve::server {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const char* param, const std::string& what) {
  throw ApiError(400, fmt::format("'{}' {}", param, what), param);
}

const json* field(const json& obj, const char* name) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

std::optional<ToolRequest> parse_tool_request(const json& body) {
  ToolRequest out;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad("tools", fmt::format("must be a list, got {}", tools->type_name()));
    for (const auto& t : *tools) {
      if (!t.is_object() || t.value("type", json()) != "function") {
        bad("tools", "each tool must be {\"type\": \"function\", \"function\": {...}}");
      }
      const json* f = field(t, "function");
      if (f == nullptr || !f->is_object()) bad("tools", "each tool needs a 'function' object");
      const json* name = field(*f, "name");
      if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
        bad("tools", "each function needs a non-empty string 'name'");
      }
      const std::string n = name->get<std::string>();
      if (std::find(out.names.begin(), out.names.end(), n) != out.names.end()) {
        bad("tools", fmt::format("function '{}' is defined twice", n));
      }
      const json* params = field(*f, "parameters");
      if (params != nullptr && !params->is_object()) {
        bad("tools", fmt::format("the parameters of '{}' must be a JSON schema object, got {}", n, params->type_name()));
      }
      out.names.push_back(n);
      out.parameters.push_back(params != nullptr ? *params : json{{"type", "object"}});
    }
  }
  if (const json* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) bad("parallel_tool_calls", fmt::format("must be a boolean, got {}", p->type_name()));
    out.parallel = p->get<bool>();
  }
  if (const json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string c = tc->get<std::string>();
      if (c == "none") {
        out.choice = ToolRequest::Choice::kNone;
      } else if (c == "auto") {
        out.choice = ToolRequest::Choice::kAuto;
      } else if (c == "required") {
        out.choice = ToolRequest::Choice::kRequired;
      } else {
        bad("tool_choice", fmt::format("'{}' is not a choice (none, auto, required, or {{\"type\": \"function\", "
                                       "\"function\": {{\"name\": …}}}})", c));
      }
    } else if (tc->is_object()) {
      const json* f = field(*tc, "function");
      const json* name = f != nullptr && f->is_object() ? field(*f, "name") : nullptr;
      if (tc->value("type", json()) != "function" || name == nullptr || !name->is_string()) {
        bad("tool_choice", "a named choice is {\"type\": \"function\", \"function\": {\"name\": …}}");
      }
      out.choice = ToolRequest::Choice::kNamed;
      out.function = name->get<std::string>();
      if (std::find(out.names.begin(), out.names.end(), out.function) == out.names.end()) {
        bad("tool_choice", fmt::format("names function '{}', which is not among the tools", out.function));
      }
    } else {
      bad("tool_choice", fmt::format("must be a string or an object, got {}", tc->type_name()));
    }
  }
  if (out.names.empty()) {
    if (out.choice == ToolRequest::Choice::kRequired) bad("tool_choice", "is 'required' but the request has no tools");
    return std::nullopt;
  }
  return out;
}

OutputConstraint forced_tool_constraint(const ToolRequest& tools) {
  OutputConstraint c;
  c.param = "tool_choice";
  c.spec.kind = runtime::GrammarSpec::Kind::kJsonSchema;
  if (tools.choice == ToolRequest::Choice::kNamed) {
    const auto at = std::find(tools.names.begin(), tools.names.end(), tools.function) - tools.names.begin();
    c.spec.source = tools.parameters[static_cast<size_t>(at)].dump();
    return c;
  }
  json any = json::array();
  for (size_t i = 0; i < tools.names.size(); ++i) {
    any.push_back({{"properties", {{"name", {{"type", "string"}, {"enum", {tools.names[i]}}}},
                                   {"parameters", tools.parameters[i]}}},
                   {"required", {"name", "parameters"}}});
  }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", any}}}};
  if (!tools.parallel) schema["maxItems"] = 1;
  c.spec.source = schema.dump();
  return c;
}

}  // namespace fp4serve::server
