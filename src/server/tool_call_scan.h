// SPDX-License-Identifier: Apache-2.0
// Reading tool calls out of a model's JSON as it is written, for the parsers of tool_calls.h (whole and streamed)
// and the forced choices: where a call object's name and arguments value start and end in the text so far, so that
// a stream can send the name once it is complete and the arguments' bytes as they arrive, and the whole parse can
// return exactly the same arguments text. Internal to the server module.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"

namespace fp4serve::server::scan {

bool is_space(char c);
std::string_view trim(std::string_view s);
size_t skip_space(std::string_view s, size_t i);
/// End (one past) of the JSON object or array starting at s[start] ('{' or '['), by bracket depth outside
/// strings; npos when it does not end within s.
size_t json_value_end(std::string_view s, size_t start);
/// End (one past) of the JSON string starting at s[start] ('"'); npos when it does not end within s.
size_t json_string_end(std::string_view s, size_t start);
/// End of any JSON value starting at s[start]; npos when it may continue past s.
size_t any_value_end(std::string_view s, size_t start);

// Where one call object of a body stands, as far as the text goes (the streaming and the whole parsers read
// calls through it, so both give the same arguments text).
struct CallSpan {
  std::optional<std::string> name;  // once its string is complete
  size_t args_begin = std::string_view::npos;  // the arguments value (an object, or a string holding one)
  size_t args_end = std::string_view::npos;    // npos while it runs on
  bool args_string = false;
  bool complete = false;  // the object closed
  size_t end = 0;         // one past the object (complete) or the text's end
};


/// The call object at s[at] == '{': {"name": …, "arguments" | "parameters": …, …}, keys in any order.
CallSpan scan_call_object(std::string_view s, size_t at);
/// The call objects of a body: one, or several in an array or separated by ',' / ';' (llama3_json), after an
/// optional <|python_tag|>. Stops at anything else.
std::vector<CallSpan> scan_call_objects(std::string_view s);
/// Mistral v11: name[ARGS]{…}, several joined by [TOOL_CALLS] (a name may carry [CALL_ID]…).
std::vector<CallSpan> scan_mistral_v11(std::string_view s);
/// The arguments text of a complete call as both parsers give it: the value's JSON text; the string's contents
/// when the model wrote the arguments as a JSON string; "{}" when it wrote none (or null).
std::string arguments_text(std::string_view s, const CallSpan& span);
/// {"name": string, "arguments" | "parameters": a JSON value} → a call (arguments re-serialized; an object's JSON
/// text given as a string is that object); nullopt when `obj` is not an object with a string name.
std::optional<ToolCall> call_of(const nlohmann::json& obj);

}  // namespace fp4serve::server::scan
