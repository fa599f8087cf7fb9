// SPDX-License-Identifier: Apache-2.0
// Chat templates: renders tokenizer_config.json's Jinja `chat_template` with a small interpreter for the subset
// real HF chat templates use, in the environment transformers' apply_chat_template sets up (jinja2
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols; globals raise_exception,
// strftime_now, range, namespace, dict; tojson = json.dumps(ensure_ascii=False)).
//
// Supported: {% if/elif/else %}, {% for x in xs [if cond] %} with else/break/continue and loop.index, index0,
// revindex, revindex0, first, last, length, previtem, nextitem; {% set %} (names, tuples, namespace attributes,
// set blocks); {% macro name(a, b=default) %} and {% call(args) name(...) %} with `caller`; {% generation %};
// {# #}; whitespace control {%- -%} {%+ +%}; expressions with literals
// (strings, numbers, lists, dicts, tuples), + - * / // % ** ~, comparisons, and/or/not, in/not in,
// `a if b else c`, subscripts and slices, attributes; the filters, tests, functions and methods listed in
// chat_template_names.h. Anything else is rejected when the template is loaded.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fp4serve::text {

namespace jinja {
struct Node;
}

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;  // UTF-8 text
};

/// How a template takes a message's `content` (vLLM's --chat-template-content-format): templates written for
/// strings fail on OpenAI's list of parts (`str + list`), and templates that iterate the parts lose text when
/// the parts are joined for them.
enum class ContentFormat {
  kString,  ///< a string: a list of text parts is joined with "\n" (as vLLM joins them) before rendering
  kOpenAI,  ///< OpenAI's list of parts, which the template iterates: passed as the client sent it
};

/// "string" / "openai", as the flag spells them.
const char* content_format_name(ContentFormat format);

/// The content format of a template: kOpenAI when some `{% for %}` iterates the `content` of a message taken
/// from `messages` (directly, or through names `{% set %}` from it, slices and filters included), else kString.
/// The same walk as vLLM's _detect_content_format over the Jinja AST.
ContentFormat detect_content_format(const std::vector<std::unique_ptr<jinja::Node>>& body);

/// `messages` with every `content` in `format`, as vLLM shapes it (_parse_chat_message_content): a string is one
/// text part, null none, a list is checked (parts must be objects of type "text" with a string "text"; anything
/// else, e.g. "image_url" or "input_audio", throws UnsupportedError naming the part's type and the message: the
/// models served take text only). kString gives the texts joined with "\n" ("" for none), kOpenAI the parts
/// rebuilt as {type: "text", text} (other keys dropped). Absent contents stay absent. Throws UsageError when
/// `messages` is not a list.
nlohmann::ordered_json apply_content_format(const nlohmann::ordered_json& messages, ContentFormat format);

class ChatTemplate {
 public:
  /// The template of a parsed tokenizer_config.json: "chat_template" as a string, or as a list of
  /// {"name", "template"} entries (the one named "default" is used). Throws UnsupportedError when there is no
  /// template ("no chat_template in tokenizer_config.json; give one with --chat-template FILE") or when it uses a Jinja
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

  /// Renders OpenAI-style messages (any fields: content as a string or a list of parts, tool_calls,
  /// tool_call_id, reasoning_content, ...) as transformers' apply_chat_template does: the template sees
  /// `messages`, `tools` and `documents` (None unless `variables` sets them), `add_generation_prompt`, and every
  /// key of `variables` (special tokens such as bos_token, and chat_template_kwargs, which win over them). As
  /// transformers 5 does, a message's reasoning under any of reasoning_content / thinking / reasoning is also
  /// given as `thinking` and `reasoning_content`. JSON objects keep their insertion order (tojson shows
  /// it). `messages` must be a JSON array of objects and `variables` an object or null, else UsageError;
  /// template failures as above.
  /// `now_unix` fixes the time strftime_now formats (as UTC) for reproducible renders; unset: local time.
  std::string render_messages(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                              const nlohmann::ordered_json& variables,
                              std::optional<int64_t> now_unix = std::nullopt) const;

  const std::string& source() const { return *source_; }
  /// How this template takes message content, detected once when it is parsed (detect_content_format).
  ContentFormat content_format() const { return content_format_; }
  /// Where the template came from ("tokenizer_config.json chat_template", a file path, ...).
  const std::string& name() const { return name_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body,
               std::string name);
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Node>>> body_;  // immutable; shared by copies
  std::string name_;
  ContentFormat content_format_ = ContentFormat::kString;
};

/// The chat templates of a model folder, found in the order transformers loads them: `chat_template.jinja`
/// next to tokenizer_config.json, else tokenizer_config.json's `chat_template` (a string, or a list of named
/// templates such as "default" and "tool_use"). `--chat-template FILE|NAME` overrides both: an existing file,
/// else the name of one of the named templates.
class ChatTemplates {
 public:
  /// Loads the templates of `model_dir`. `override_spec` empty: no override. Throws UnsupportedError when
  /// there is no template at all (naming where it looked and the --chat-template option), when the override
  /// is neither a file nor a known name (listing the names), or when a template uses Jinja outside the
  /// subset; FormatError / IoError as ChatTemplate::from_string / from_file.
  static ChatTemplates load(const std::filesystem::path& model_dir, const nlohmann::json& tokenizer_config,
                            const std::string& override_spec = "");

  /// The template for a request: with tools, the one named "tool_use" when there is one; otherwise the
  /// override, chat_template.jinja, the single template, or the one named "default" (transformers' choice).
  /// Throws UnsupportedError when named templates have no "default" and the request needs one.
  const ChatTemplate& select(bool with_tools) const;

  /// One line saying which template source is used, e.g. "chat template: chat_template.jinja (4116 bytes)".
  std::string describe() const;

 private:
  std::map<std::string, ChatTemplate> named_;  // "" = the single (or override / .jinja) template
  std::string origin_;
};

}  // namespace fp4serve::text
