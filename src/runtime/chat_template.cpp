// SPDX-License-Identifier: Apache-2.0
#include "runtime/chat_template.h"

#include <fstream>
#include <sstream>

#include "fp4serve/error.h"
#include "runtime/chat_template_ast.h"
#include "runtime/tokenizer_unicode.h"

namespace fp4serve::runtime {

using nlohmann::json;

ChatTemplate ChatTemplate::from_string(std::string source, std::string name) {
  if (unicode::find_invalid_utf8(source)) throw FormatError(name + ": the template is not valid UTF-8");
  auto body = std::make_shared<jinja::Body>();
  try {
    *body = jinja::parse_template(source);
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(name + ": " + e.what());
  } catch (const FormatError& e) {
    throw FormatError(name + ": " + e.what());
  }
  return ChatTemplate(std::make_shared<const std::string>(std::move(source)), std::move(body), std::move(name));
}

ChatTemplate ChatTemplate::from_tokenizer_config(const json& config) {
  const std::string where = "tokenizer_config.json chat_template";
  if (!config.is_object() || !config.contains("chat_template") || config.at("chat_template").is_null()) {
    throw UnsupportedError("no chat_template in tokenizer_config.json; give a template file instead");
  }
  const json& t = config.at("chat_template");
  if (t.is_string()) return from_string(t.get<std::string>(), where);
  if (t.is_array()) {
    // Named templates (e.g. "default", "tool_use", "rag"): a plain conversation uses "default".
    for (const auto& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry.at("template").is_string()) {
        return from_string(entry.at("template").get<std::string>(), where + "[default]");
      }
    }
    throw UnsupportedError(where + ": a list of named templates without one named \"default\"");
  }
  throw FormatError(where + ": expected a string or a list of {name, template}, found " + t.dump());
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open chat template file " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_string(buffer.str(), path.string());
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const json& extra_context) const {
  if (!extra_context.is_null() && !extra_context.is_object()) {
    throw UsageError("ChatTemplate::render: extra_context must be a JSON object or null, found " +
                     std::string(extra_context.type_name()));
  }
  jinja::Mapping context;
  if (extra_context.is_object()) {
    for (const auto& [k, v] : extra_context.items()) context.set(k, jinja::from_json(v));
  }
  jinja::Items list;
  for (const auto& m : messages) {
    jinja::Mapping d;
    d.set("role", jinja::Value::string(m.role));
    d.set("content", jinja::Value::string(m.content));
    list.push_back(jinja::Value::make_dict(std::move(d)));
  }
  context.set("messages", jinja::Value::make_list(std::move(list)));
  context.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  try {
    return jinja::render_template(*body_, std::move(context));
  } catch (const UsageError& e) {
    throw UsageError(name_ + ": " + e.what());
  }
}

}  // namespace fp4serve::runtime
