// SPDX-License-Identifier: Apache-2.0
// A chat request's `tools`, `tool_choice` and `parallel_tool_calls` (OpenAI's function tools), checked, and the
// structured output that enforces a forced choice: `required` → a JSON array of {"name", "parameters"} items,
// each name one of the tools and its parameters valid against that tool's schema (vLLM's schema for required);
// a named function → its parameters object. So even a small model returns arguments that parse.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/structured_request.h"

namespace fp4serve::server {

struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  Choice choice = Choice::kAuto;
  std::string function;             ///< kNamed: the function's name
  bool parallel = true;             ///< parallel_tool_calls: false keeps one call
  std::vector<std::string> names;   ///< the tools' function names, in order
  std::vector<nlohmann::ordered_json> parameters;  ///< their parameter schemas, keys in the client's order
};

/// nullopt when the body has no tools (absent, null or []) and no tool_choice other than "none"/"auto". Throws
/// ApiError(400) naming the field: a tool that is not {"type": "function", "function": {"name", …}}, duplicate
/// names, parameters that are not an object, a tool_choice naming no tool, required or named without tools.
std::optional<ToolRequest> parse_tool_request(const nlohmann::ordered_json& body);

/// The constraint of a forced choice (kRequired, kNamed), param "tool_choice".
OutputConstraint forced_tool_constraint(const ToolRequest& tools);

}  // namespace fp4serve::server
