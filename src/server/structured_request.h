// SPDX-License-Identifier: Apache-2.0
// The structured-output fields of a request, as OpenAI and vLLM spell them, read into one runtime::GrammarSpec:
//  - OpenAI `response_format`: {"type": "text"} (none), {"type": "json_object"}, {"type": "json_schema",
//    "json_schema": {"name", "schema", "strict", "description"}}, and vLLM's {"type": "structural_tag", …}
//    (xgrammar's "format" form, or the older "structures" + "triggers" form vLLM also takes);
//  - vLLM `structured_outputs`: exactly one of json (object or JSON text), regex, choice, grammar (EBNF or Lark),
//    json_object (true), structural_tag (JSON text), with disable_any_whitespace, disable_additional_properties,
//    disable_fallback (one engine here: no effect) and backend ("xgrammar" or "auto"); as in vLLM, a
//    structured_outputs holding only options may accompany response_format, whose constraint they then shape;
//  - vLLM's older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (+ guided_decoding_backend).
// A request sets at most one of these. Errors are ApiError(400) naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "runtime/structured_output.h"

namespace fp4serve::server {

struct OutputConstraint {
  runtime::GrammarSpec spec;
  std::string param;  ///< the request field it came from ("response_format", "structured_outputs", "guided_json")
};

/// The constraint `body` asks for, or nullopt. Throws ApiError(400) naming the field for wrong types, unknown
/// keys, two constraints at once, a schema that is not a JSON object or boolean, an empty choice list, and
/// options the engine does not implement (whitespace_pattern).
/// `body` is read with its keys in the order the client sent them: a schema's properties keep their order, which
/// the engine follows when it writes the object (as vLLM, whose JSON objects keep insertion order).
std::optional<OutputConstraint> parse_output_constraint(const nlohmann::ordered_json& body);

/// The names parse_output_constraint reads (for the request's list of known fields).
bool is_output_constraint_field(const std::string& name);

/// vLLM's older structural tag form {"structures": [{"begin", "schema", "end"}], "triggers": [...]} in xgrammar's
/// format form; a body that already has "format" is returned unchanged (as text).
std::string structural_tag_json(const nlohmann::ordered_json& tag, const char* param);

}  // namespace fp4serve::server
