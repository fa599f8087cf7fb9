// SPDX-License-Identifier: Apache-2.0
// Message content as a template expects it. Published templates come in two kinds: most concatenate
// `message['content']` as a string (a list of parts then fails with `str + list`), multimodal-aware ones iterate it
// as OpenAI's list of parts. vLLM tells them apart from the template's syntax tree
// (vllm/entrypoints/chat_utils.py, _detect_content_format) and this file walks our tree the same way, so that a
// template gets the same shape of content here as under vLLM.
#include <deque>
#include <set>
#include <string>

#include "fp4serve/error.h"
#include "text/chat_template.h"
#include "text/chat_template_ast.h"

namespace fp4serve::text {
namespace {

using jinja::Expr;
using jinja::Node;

// Every {% for %} and {% set x = ... %} of the template, at any depth (macro, call and if bodies included),
// as Jinja's find_all visits them: vLLM's walk ignores scoping too.
void collect(const jinja::Body& body, std::vector<const Node*>& loops, std::vector<const Node*>& sets) {
  for (const auto& n : body) {
    switch (n->kind) {
      case Node::Kind::For: loops.push_back(n.get()); break;
      case Node::Kind::Set: sets.push_back(n.get()); break;
      case Node::Kind::Text:
      case Node::Kind::Output:
      case Node::Kind::If:
      case Node::Kind::SetBlock:
      case Node::Kind::Break:
      case Node::Kind::Continue:
      case Node::Kind::Block:
      case Node::Kind::Macro:
      case Node::Kind::CallBlock: break;
    }
    for (const auto& b : n->bodies) collect(b, loops, sets);
    collect(n->body, loops, sets);
    collect(n->else_body, loops, sets);
  }
}

bool is_name(const Expr* e, const std::string& var) {
  return e != nullptr && e->kind == Expr::Kind::Name && e->name == var;
}

// var.key or var['key'].
bool is_key_of(const Expr* e, const std::string& var, const std::string& key) {
  if (e == nullptr || e->args.empty()) return false;
  if (e->kind == Expr::Kind::GetAttr) return is_name(e->args[0].get(), var) && e->name == key;
  if (e->kind == Expr::Kind::GetItem && e->args.size() == 2 && e->args[1] != nullptr &&
      e->args[1]->kind == Expr::Kind::Literal && e->args[1]->value.kind == jinja::Value::Kind::String) {
    return is_name(e->args[0].get(), var) && e->args[1]->value.s == key;
  }
  return false;
}

// vLLM's _is_var_or_elems_access: `var` (or `var.key` when key is set), possibly under filters, tests and
// slices, e.g. `messages[1:]`, `messages | selectattr(...)`, `message['content'] | reverse`.
bool reaches(const Expr* e, const std::string& var, const std::string& key) {
  if (e == nullptr) return false;
  if ((e->kind == Expr::Kind::Filter || e->kind == Expr::Kind::Test || e->kind == Expr::Kind::Slice) && !e->args.empty()) {
    return reaches(e->args[0].get(), var, key);
  }
  return key.empty() ? is_name(e, var) : is_key_of(e, var, key);
}

}  // namespace

const char* content_format_name(ContentFormat format) {
  switch (format) {
    case ContentFormat::kString: return "string";
    case ContentFormat::kOpenAI: return "openai";
  }
  return "?";
}

ContentFormat detect_content_format(const jinja::Body& body) {
  std::vector<const Node*> loops, sets;
  collect(body, loops, sets);
  // Names bound to the message list: `messages` and whatever `{% set x = messages... %}` derives from it,
  // transitively (loop_messages = messages[1:], ...).
  std::set<std::string> lists = {"messages"};
  std::deque<std::string> todo = {"messages"};
  while (!todo.empty()) {
    const std::string var = todo.front();
    todo.pop_front();
    for (const Node* s : sets) {
      if (s->targets.size() != 1 || !s->attr.empty() || !reaches(s->expr.get(), var, "")) continue;
      if (lists.insert(s->targets[0]).second) todo.push_back(s->targets[0]);
    }
  }
  // Loop variables over those lists are messages; a loop over a message's content makes the template "openai".
  std::set<std::string> messages;
  for (const Node* loop : loops) {
    if (loop->targets.size() != 1) continue;
    for (const auto& var : lists) {
      if (reaches(loop->expr.get(), var, "")) messages.insert(loop->targets[0]);
    }
  }
  for (const Node* loop : loops) {
    for (const auto& var : messages) {
      if (reaches(loop->expr.get(), var, "content")) return ContentFormat::kOpenAI;
    }
  }
  return ContentFormat::kString;
}

nlohmann::ordered_json apply_content_format(const nlohmann::ordered_json& messages, ContentFormat format) {
  if (!messages.is_array()) throw UsageError("messages must be a JSON list, found " + std::string(messages.type_name()));
  nlohmann::ordered_json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    auto& m = out[i];
    if (!m.is_object()) continue;  // render_messages names it
    const auto content = m.find("content");
    if (content == m.end()) continue;
    // vLLM's _parse_chat_message_content: null is no parts, a string is one text part; the template then gets
    // the parts rebuilt as {type, text} (openai) or their texts joined with "\n" (string).
    std::vector<std::string> texts;
    if (content->is_string()) {
      texts.push_back(content->get<std::string>());
    } else if (content->is_array()) {
      for (const auto& part : *content) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string()) {
          throw UnsupportedError("message " + std::to_string(i) + ": each content part must be an object with a "
                                 "string 'type', found " + part.dump());
        }
        if (type->get<std::string>() != "text") {
          throw UnsupportedError("message " + std::to_string(i) + ": content parts of type '" +
                                 type->get<std::string>() +
                                 "' are not supported: the served model takes text only (parts of type 'text')");
        }
        const auto text = part.find("text");
        if (text == part.end() || !text->is_string()) {
          throw UnsupportedError("message " + std::to_string(i) + ": a 'text' content part needs a string 'text'");
        }
        texts.push_back(text->get<std::string>());
      }
    } else if (!content->is_null()) {
      continue;  // another type: render_messages names it
    }
    switch (format) {
      case ContentFormat::kString: {
        std::string joined;
        for (size_t t = 0; t < texts.size(); ++t) joined += (t == 0 ? "" : "\n") + texts[t];
        *content = joined;
        break;
      }
      case ContentFormat::kOpenAI: {
        nlohmann::ordered_json parts = nlohmann::ordered_json::array();
        for (const std::string& t : texts) parts.push_back({{"type", "text"}, {"text", t}});
        *content = parts;
        break;
      }
    }
  }
  return out;
}

}  // namespace fp4serve::text
