// SPDX-License-Identifier: Apache-2.0
#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "fp4serve/error.h"
#include "text/chat_template_ast.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text {

using nlohmann::json;

ChatTemplate::ChatTemplate(std::shared_ptr<const std::string> source,
                           std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body, std::string name)
    : source_(std::move(source)), body_(std::move(body)), name_(std::move(name)),
      content_format_(detect_content_format(*body_)) {}

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
    throw UnsupportedError("no chat_template in tokenizer_config.json; give one with --chat-template FILE");
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

std::string ChatTemplate::render_messages(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                          const nlohmann::ordered_json& variables,
                                          std::optional<int64_t> now_unix) const {
  if (!messages.is_array()) {
    throw UsageError(name_ + ": messages must be a JSON list, found " + std::string(messages.type_name()));
  }
  if (!variables.is_null() && !variables.is_object()) {
    throw UsageError(name_ + ": template variables must be a JSON object, found " + std::string(variables.type_name()));
  }
  jinja::Mapping context;
  context.set("tools", jinja::Value::none());
  context.set("documents", jinja::Value::none());
  if (variables.is_object()) {
    for (const auto& [k, v] : variables.items()) context.set(k, jinja::from_json(v));
  }
  static const char* const kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};
  jinja::Items list;
  for (const auto& m : messages) {
    if (!m.is_object()) throw UsageError(name_ + ": each message must be a JSON object, found " + m.dump());
    jinja::Value d = jinja::from_json(m);
    // transformers 5's _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* f : kReasoningFields) {
      if (m.contains(f) && !m[f].is_null()) {
        reasoning = &m[f];
        break;
      }
    }
    if (reasoning != nullptr) {
      jinja::Mapping aliased;
      aliased.set("thinking", jinja::from_json(*reasoning));
      for (auto& [k, v] : d.dict->items) aliased.set(k, v);
      aliased.set("reasoning_content", jinja::from_json(*reasoning));
      d = jinja::Value::make_dict(std::move(aliased));
    }
    list.push_back(std::move(d));
  }
  context.set("messages", jinja::Value::make_list(std::move(list)));
  context.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  try {
    return jinja::render_template(*body_, std::move(context), now_unix);
  } catch (const UsageError& e) {
    throw UsageError(name_ + ": " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------- ChatTemplates

ChatTemplates ChatTemplates::load(const std::filesystem::path& model_dir, const json& tokenizer_config,
                                  const std::string& override_spec) {
  ChatTemplates out;
  // tokenizer_config.json's templates; a list gives named ones.
  std::map<std::string, ChatTemplate> config_named;
  const std::string where = (model_dir / "tokenizer_config.json").string() + " chat_template";
  if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template") &&
      !tokenizer_config.at("chat_template").is_null()) {
    const json& t = tokenizer_config.at("chat_template");
    if (t.is_string()) {
      config_named.emplace("", ChatTemplate::from_string(t.get<std::string>(), where));
    } else if (t.is_array()) {
      for (const auto& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
            !entry["template"].is_string()) {
          throw FormatError(where + ": each entry of the list must be {\"name\": string, \"template\": string}, found " +
                            entry.dump());
        }
        const std::string name = entry["name"].get<std::string>();
        config_named.emplace(name, ChatTemplate::from_string(entry["template"].get<std::string>(), where + "[" + name + "]"));
      }
    } else {
      throw FormatError(where + ": expected a string or a list of {name, template}, found " + t.dump());
    }
  }
  if (!override_spec.empty()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(override_spec, ec)) {
      out.named_.emplace("", ChatTemplate::from_file(override_spec));
      out.origin_ = "--chat-template " + override_spec;
      return out;
    }
    const auto it = config_named.find(override_spec);
    if (it == config_named.end() || override_spec.empty()) {
      std::string names;
      for (const auto& [k, _] : config_named) {
        if (!k.empty()) names += (names.empty() ? "" : ", ") + k;
      }
      throw UnsupportedError("--chat-template " + override_spec + ": no such file, and not the name of a template in " +
                             where + (names.empty() ? " (it has no named templates)" : " (names: " + names + ")"));
    }
    out.named_.emplace("", it->second);
    out.origin_ = where + "[" + override_spec + "] (--chat-template)";
    return out;
  }
  const auto jinja_file = model_dir / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::is_regular_file(jinja_file, ec)) {
    out.named_.emplace("", ChatTemplate::from_file(jinja_file));
    out.origin_ = jinja_file.string();
    // Named templates of tokenizer_config.json stay selectable for tool use.
    for (auto& [k, v] : config_named) {
      if (!k.empty()) out.named_.emplace(k, v);
    }
    return out;
  }
  if (config_named.empty()) {
    throw UnsupportedError(model_dir.string() + ": no chat template (neither chat_template.jinja nor a chat_template in "
                           "tokenizer_config.json); give one with --chat-template FILE");
  }
  out.named_ = std::move(config_named);
  out.origin_ = where;
  return out;
}

const ChatTemplate& ChatTemplates::select(bool with_tools) const {
  if (with_tools) {
    if (const auto it = named_.find("tool_use"); it != named_.end()) return it->second;
  }
  if (const auto it = named_.find(""); it != named_.end()) return it->second;
  if (const auto it = named_.find("default"); it != named_.end()) return it->second;
  std::string names;
  for (const auto& [k, _] : named_) names += (names.empty() ? "" : ", ") + k;
  throw UnsupportedError(origin_ + ": named templates (" + names + ") without one named \"default\"" +
                         (with_tools ? "" : " or a request with tools for \"tool_use\"") +
                         "; choose one with --chat-template NAME");
}

std::string ChatTemplates::describe() const {
  const auto it = named_.find("");
  const ChatTemplate* main = it != named_.end() ? &it->second : nullptr;
  std::string names;
  for (const auto& [k, _] : named_) {
    if (!k.empty()) names += (names.empty() ? "" : ", ") + k;
  }
  std::string line = "chat template: " + origin_;
  if (main) line += " (" + std::to_string(main->source().size()) + " bytes)";
  if (!names.empty()) line += "; named templates: " + names;
  return line;
}

}  // namespace fp4serve::text
