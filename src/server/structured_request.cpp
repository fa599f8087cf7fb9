// SPDX-License-Identifier: Apache-2.0
#include "server/structured_request.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

#include "server/openai_api.h"

namespace fp4serve::server {
namespace {

using json = nlohmann::ordered_json;
using Kind = runtime::GrammarSpec::Kind;

[[noreturn]] void bad(const std::string& param, const std::string& what) {
  throw ApiError(400, fmt::format("'{}' {}", param, what), param);
}

const json* field(const json& obj, const char* name) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string string_of(const json& v, const std::string& param, const char* what) {
  if (!v.is_string()) bad(param, fmt::format("{} must be a string, got {}", what, v.type_name()));
  return v.get<std::string>();
}

bool bool_of(const json& v, const std::string& param, const char* what) {
  if (!v.is_boolean()) bad(param, fmt::format("{} must be a boolean, got {}", what, v.type_name()));
  return v.get<bool>();
}

// vLLM's disable_additional_properties: every object schema without an explicit additionalProperties gets false.
void close_objects(json& schema) {
  if (schema.is_array()) {
    for (auto& x : schema) close_objects(x);
    return;
  }
  if (!schema.is_object()) return;
  if ((schema.value("type", json()) == "object" || schema.contains("properties")) &&
      !schema.contains("additionalProperties")) {
    schema["additionalProperties"] = false;
  }
  for (auto& [key, value] : schema.items()) {
    if (key != "enum" && key != "const" && key != "default" && key != "examples") close_objects(value);
  }
}

// A JSON schema given as an object or as JSON text (vLLM takes both); must be an object or a boolean.
std::string schema_text(const json& v, const std::string& param, bool close) {
  json schema = v;
  if (v.is_string()) {
    // Measured before parsing: close_objects and dump() walk the document recursively.
    if (const int depth = runtime::json_nesting(v.get_ref<const std::string&>()); depth > kMaxRequestNesting) {
      bad(param, fmt::format("holds a schema nested {} levels deep; at most {} are accepted", depth, kMaxRequestNesting));
    }
    schema = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) bad(param, "holds a schema that is not valid JSON");
  }
  if (!schema.is_object() && !schema.is_boolean()) {
    bad(param, fmt::format("must be a JSON schema (an object or a boolean), got {}", schema.type_name()));
  }
  if (close) close_objects(schema);
  return schema.dump();
}

std::vector<std::string> choices_of(const json& v, const std::string& param) {
  if (!v.is_array()) bad(param, fmt::format("must be a list of strings, got {}", v.type_name()));
  if (v.empty()) bad(param, "must hold at least one string");
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(string_of(x, param, "each choice"));
  return out;
}

void check_backend(const json* backend, const std::string& param) {
  if (backend == nullptr) return;
  const std::string name = string_of(*backend, param, "the backend");
  if (name != "xgrammar" && name != "auto") {
    bad(param, fmt::format("asks for backend '{}'; fp4serve's grammar engine is xgrammar ('xgrammar' or 'auto')", name));
  }
}

OutputConstraint from_response_format(const json& rf) {
  const std::string param = "response_format";
  if (!rf.is_object()) bad(param, fmt::format("must be an object, got {}", rf.type_name()));
  const json* type = field(rf, "type");
  if (type == nullptr) bad(param, "needs a 'type' (text, json_object, json_schema, structural_tag)");
  const std::string t = string_of(*type, param, "'type'");
  OutputConstraint out;
  out.param = param;
  if (t == "json_object") {
    for (const auto& [key, value] : rf.items()) {
      if (key != "type") bad(param, fmt::format("of type json_object takes no '{}'", key));
    }
    out.spec.kind = Kind::kJsonObject;
  } else if (t == "json_schema") {
    const json* js = field(rf, "json_schema");
    if (js == nullptr || !js->is_object()) bad(param, "of type json_schema needs a 'json_schema' object");
    for (const auto& [key, value] : js->items()) {
      if (key != "name" && key != "schema" && key != "strict" && key != "description") {
        bad(param, fmt::format("json_schema has no field '{}' (name, schema, strict, description)", key));
      }
    }
    if (const json* n = field(*js, "name")) string_of(*n, param, "json_schema.name");
    if (const json* d = field(*js, "description")) string_of(*d, param, "json_schema.description");
    // strict: OpenAI's promise that the output follows the schema exactly, which constrained decoding keeps
    // either way (vLLM too decodes every json_schema strictly).
    if (const json* s = field(*js, "strict")) bool_of(*s, param, "json_schema.strict");
    const json* schema = field(*js, "schema");
    if (schema == nullptr) bad(param, "json_schema needs a 'schema'");
    out.spec.kind = Kind::kJsonSchema;
    out.spec.source = schema_text(*schema, param, false);
  } else if (t == "structural_tag") {
    out.spec.kind = Kind::kStructuralTag;
    out.spec.source = structural_tag_json(rf, "response_format");
  } else {
    bad(param, fmt::format("type '{}' is unknown (text, json_object, json_schema, structural_tag)", t));
  }
  return out;
}

bool options_only(const json& so) {
  for (const auto& [key, value] : so.items()) {
    if (!value.is_null() && (key == "json" || key == "regex" || key == "choice" || key == "grammar" ||
                             key == "json_object" || key == "structural_tag")) {
      return false;
    }
  }
  return true;
}

OutputConstraint from_structured_outputs(const json& so) {
  const std::string param = "structured_outputs";
  if (!so.is_object()) bad(param, fmt::format("must be an object, got {}", so.type_name()));
  static const std::vector<std::string> kinds = {"json", "regex", "choice", "grammar", "json_object", "structural_tag"};
  static const std::vector<std::string> options = {"disable_any_whitespace", "disable_additional_properties",
                                                   "disable_fallback", "whitespace_pattern", "backend", "_backend"};
  std::vector<std::string> given;
  for (const auto& [key, value] : so.items()) {
    const bool kind = std::find(kinds.begin(), kinds.end(), key) != kinds.end();
    if (!kind && std::find(options.begin(), options.end(), key) == options.end()) {
      bad(param, fmt::format("has no field '{}' (json, regex, choice, grammar, json_object, structural_tag, "
                             "disable_any_whitespace, disable_additional_properties, disable_fallback, backend)", key));
    }
    if (kind && !value.is_null() && !(key == "json_object" && value == false)) given.push_back(key);
  }
  if (given.size() != 1) {
    bad(param, given.empty() ? "needs one of json, regex, choice, grammar, json_object, structural_tag"
                             : fmt::format("sets {} constraints ({}); give exactly one", given.size(), fmt::join(given, ", ")));
  }
  if (const json* w = field(so, "whitespace_pattern")) {
    string_of(*w, param, "whitespace_pattern");
    bad(param, "whitespace_pattern is not supported by the xgrammar engine (use disable_any_whitespace)");
  }
  check_backend(field(so, "backend"), param);
  check_backend(field(so, "_backend"), param);
  if (const json* f = field(so, "disable_fallback")) bool_of(*f, param, "disable_fallback");
  const bool compact = field(so, "disable_any_whitespace") != nullptr &&
                       bool_of(*field(so, "disable_any_whitespace"), param, "disable_any_whitespace");
  const bool close = field(so, "disable_additional_properties") != nullptr &&
                     bool_of(*field(so, "disable_additional_properties"), param, "disable_additional_properties");
  OutputConstraint out;
  out.param = param;
  out.spec.any_whitespace = !compact;
  const std::string& k = given.front();
  const json& v = so.at(k);
  if (k == "json") {
    out.spec.kind = Kind::kJsonSchema;
    out.spec.source = schema_text(v, param, close);
  } else if (k == "regex") {
    out.spec.kind = Kind::kRegex;
    out.spec.source = string_of(v, param, "regex");
  } else if (k == "choice") {
    out.spec.kind = Kind::kChoice;
    out.spec.choices = choices_of(v, param);
  } else if (k == "grammar") {
    out.spec.kind = Kind::kGrammar;
    out.spec.source = string_of(v, param, "grammar");
  } else if (k == "json_object") {
    bool_of(v, param, "json_object");
    out.spec.kind = Kind::kJsonObject;
  } else {  // structural_tag: JSON text in vLLM's StructuredOutputsParams
    const json tag = json::parse(string_of(v, param, "structural_tag"), nullptr, false);
    if (tag.is_discarded() || !tag.is_object()) bad(param, "structural_tag must be the text of a JSON object");
    out.spec.kind = Kind::kStructuralTag;
    out.spec.source = structural_tag_json(tag, "structured_outputs");
  }
  return out;
}

std::optional<OutputConstraint> from_guided(const json& body) {
  std::optional<OutputConstraint> out;
  auto set = [&](const char* name, Kind kind) -> OutputConstraint& {
    if (out) bad(name, fmt::format("cannot be combined with '{}': give one constraint", out->param));
    out.emplace();
    out->param = name;
    out->spec.kind = kind;
    return *out;
  };
  if (const json* j = field(body, "guided_json")) set("guided_json", Kind::kJsonSchema).spec.source = schema_text(*j, "guided_json", false);
  if (const json* r = field(body, "guided_regex")) set("guided_regex", Kind::kRegex).spec.source = string_of(*r, "guided_regex", "the regex");
  if (const json* c = field(body, "guided_choice")) set("guided_choice", Kind::kChoice).spec.choices = choices_of(*c, "guided_choice");
  if (const json* g = field(body, "guided_grammar")) set("guided_grammar", Kind::kGrammar).spec.source = string_of(*g, "guided_grammar", "the grammar");
  check_backend(field(body, "guided_decoding_backend"), "guided_decoding_backend");
  if (const json* w = field(body, "guided_whitespace_pattern")) {
    string_of(*w, "guided_whitespace_pattern", "the pattern");
    bad("guided_whitespace_pattern", "is not supported by the xgrammar engine");
  }
  return out;
}

}  // namespace

bool is_output_constraint_field(const std::string& name) {
  return name == "response_format" || name == "structured_outputs" || name == "guided_json" ||
         name == "guided_regex" || name == "guided_choice" || name == "guided_grammar" ||
         name == "guided_decoding_backend" || name == "guided_whitespace_pattern";
}

std::string structural_tag_json(const json& tag, const char* param) {
  if (tag.contains("format")) return tag.dump();
  const json* structures = field(tag, "structures");
  const json* triggers = field(tag, "triggers");
  if (structures == nullptr || triggers == nullptr || !structures->is_array() || !triggers->is_array()) {
    bad(param, "structural_tag needs 'format', or 'structures' and 'triggers' lists");
  }
  json tags = json::array();
  for (const auto& s : *structures) {
    if (!s.is_object() || !s.contains("begin") || !s.contains("end") || !s.contains("schema")) {
      bad(param, "each structure needs 'begin', 'schema' and 'end'");
    }
    json content = {{"type", "json_schema"}, {"json_schema", s.at("schema")}};
    tags.push_back({{"type", "tag"}, {"begin", s.at("begin")}, {"content", content}, {"end", s.at("end")}});
  }
  const json format = {{"type", "triggered_tags"}, {"triggers", *triggers}, {"tags", tags}};
  return json{{"type", "structural_tag"}, {"format", format}}.dump();
}

std::optional<OutputConstraint> parse_output_constraint(const json& body) {
  std::optional<OutputConstraint> out;
  if (const json* rf = field(body, "response_format")) {
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!(type != nullptr && type->is_string() && type->get<std::string>() == "text")) out = from_response_format(*rf);
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (out && so->is_object() && options_only(*so)) {
      // vLLM merges response_format into structured_outputs: the options shape response_format's constraint.
      json merged = *so;
      if (out->spec.kind == Kind::kJsonObject) {
        merged["json_object"] = true;
      } else if (out->spec.kind == Kind::kJsonSchema) {
        merged["json"] = json::parse(out->spec.source);
      } else {
        merged["structural_tag"] = out->spec.source;
      }
      out = from_structured_outputs(merged);
      out->param = "response_format";
    } else {
      if (out) bad("structured_outputs", fmt::format("cannot be combined with '{}': give one constraint", out->param));
      out = from_structured_outputs(*so);
    }
  }
  std::optional<OutputConstraint> guided = from_guided(body);
  if (guided) {
    if (out) bad(guided->param, fmt::format("cannot be combined with '{}': give one constraint", out->param));
    out = std::move(guided);
  }
  return out;
}

}  // namespace fp4serve::server
