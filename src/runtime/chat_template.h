// SPDX-License-Identifier: Apache-2.0
// Chat templates: renders tokenizer_config.json's Jinja `chat_template` with a small interpreter for the subset
// real HF chat templates use, in the environment transformers' apply_chat_template sets up (jinja2
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; globals raise_exception,
// strftime_now, range, namespace, dict; tojson = json.dumps(ensure_ascii=False)).
//
// Supported: {% if/elif/else %}, {% for x in xs [if cond] %} with else/break/continue and loop.index, index0,
// revindex, revindex0, first, last, length, previtem, nextitem; {% set %} (names, tuples, namespace attributes,
// set blocks); {% generation %}; {# #}; whitespace control {%- -%} {%+ +%}; expressions with literals
// (strings, numbers, lists, dicts, tuples), + - * / // % ** ~, comparisons, and/or/not, in/not in,
// `a if b else c`, subscripts and slices, attributes; the filters, tests, functions and methods listed in
// chat_template_names.h. Anything else is rejected when the template is loaded.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace fp4serve::runtime {

namespace jinja {
struct Node;
}

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;  // UTF-8 text
};

class ChatTemplate {
 public:
  /// The template of a parsed tokenizer_config.json: "chat_template" as a string, or as a list of
  /// {"name", "template"} entries (the one named "default" is used). Throws UnsupportedError when there is no
  /// template ("no chat_template in tokenizer_config.json; give a template file") or when it uses a Jinja
  /// feature outside the subset (the message names it and its line), FormatError for a syntax error.
  static ChatTemplate from_tokenizer_config(const nlohmann::json& tokenizer_config);

  /// A template from a file (an override, or a chat_template.jinja shipped next to the model). Throws IoError
  /// when the file cannot be read, then as from_tokenizer_config.
  static ChatTemplate from_file(const std::filesystem::path& path);

  /// A template from source text; `name` identifies it in error messages.
  static ChatTemplate from_string(std::string source, std::string name = "chat template");

  /// Renders the conversation. The template sees `messages` (a list of {"role", "content"} dicts),
  /// `add_generation_prompt`, and every key of `extra_context` (a JSON object or null: bos_token, eos_token,
  /// tools, ...). JSON objects arrive with sorted keys (nlohmann::json), which `tojson` preserves.
  /// Throws UsageError when the template calls raise_exception (the message is the template's text) or fails
  /// on the given data (e.g. an undefined variable's attribute, adding a string to a number).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra_context) const;

  const std::string& source() const { return *source_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body,
               std::string name)
      : source_(std::move(source)), body_(std::move(body)), name_(std::move(name)) {}
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body_;  // immutable; shared by copies
  std::string name_;
};

}  // namespace fp4serve::runtime
