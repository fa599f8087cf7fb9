// SPDX-License-Identifier: Apache-2.0
#include "server/openai_api.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "fp4serve/error.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;

// Absent and null mean "not set", as in OpenAI's API.
const json* field(const json& obj, const char* name) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void bad(const char* name, const std::string& what) {
  throw ApiError(400, fmt::format("'{}' {}", name, what), name);
}

std::string type_name(const json& v) { return v.type_name(); }

std::string get_string(const json& v, const char* name) {
  if (!v.is_string()) bad(name, fmt::format("must be a string, got {}", type_name(v)));
  return v.get<std::string>();
}

bool get_bool(const json& v, const char* name) {
  if (!v.is_boolean()) bad(name, fmt::format("must be a boolean, got {}", type_name(v)));
  return v.get<bool>();
}

double get_number(const json& v, const char* name, double lo, double hi) {
  if (!v.is_number()) bad(name, fmt::format("must be a number, got {}", type_name(v)));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(name, fmt::format("must be in [{}, {}], got {}", lo, hi, x));
  return x;
}

// Integers only (OpenAI rejects 1.5 for integer fields); values beyond int64 saturate so range checks reject them.
int64_t get_int(const json& v, const char* name) {
  if (!v.is_number_integer()) bad(name, fmt::format("must be an integer, got {}", v.is_number() ? "a fraction" : type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return v.get<int64_t>();
}

std::vector<int64_t> get_id_list(const json& v, const char* name) {
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (const auto& x : v) {
    if (!x.is_number_integer()) bad(name, "token-id prompts must hold integers only");
    const int64_t id = get_int(x, name);
    if (id < 0) bad(name, fmt::format("token id {} is negative", id));
    ids.push_back(id);
  }
  return ids;
}

void parse_prompt(const json& body, ApiRequest& req) {
  const json* p = field(body, "prompt");
  if (p == nullptr) bad("prompt", "is required");
  if (p->is_string()) {
    req.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) bad("prompt", "must not be empty");
    const json& first = p->front();
    if (first.is_number()) {
      req.prompt_ids = get_id_list(*p, "prompt");
    } else if (p->size() > 1) {
      bad("prompt", "holds several prompts; fp4serve takes one prompt per request");
    } else if (first.is_string()) {
      req.prompt_text = first.get<std::string>();
    } else if (first.is_array()) {
      req.prompt_ids = get_id_list(first, "prompt");
    } else {
      bad("prompt", fmt::format("must be a string or a list of token ids, got a list of {}", type_name(first)));
    }
  } else {
    bad("prompt", fmt::format("must be a string or a list of token ids, got {}", type_name(*p)));
  }
  if (req.prompt_text.empty() && req.prompt_ids.empty()) bad("prompt", "must not be empty");
}

std::string message_content(const json& msg, const std::string& role) {
  const json* c = field(msg, "content");
  if (c == nullptr) {
    if (role == "assistant") return {};
    bad("messages", fmt::format("a '{}' message needs 'content'", role));
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad("messages", fmt::format("'content' must be a string or a list of parts, got {}", type_name(*c)));
  std::string text;
  for (const auto& part : *c) {
    if (!part.is_object()) bad("messages", "each content part must be an object");
    const json* type = field(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      bad("messages", "only content parts of type 'text' are supported");
    }
    const json* t = field(part, "text");
    if (t == nullptr) bad("messages", "a text part needs 'text'");
    text += get_string(*t, "messages");
  }
  return text;
}

void parse_messages(const json& body, ApiRequest& req) {
  const json* m = field(body, "messages");
  if (m == nullptr) bad("messages", "is required");
  if (!m->is_array()) bad("messages", fmt::format("must be a list, got {}", type_name(*m)));
  if (m->empty()) bad("messages", "must not be empty");
  for (const auto& msg : *m) {
    if (!msg.is_object()) bad("messages", fmt::format("each message must be an object, got {}", type_name(msg)));
    const json* r = field(msg, "role");
    if (r == nullptr) bad("messages", "each message needs a 'role'");
    const std::string role = get_string(*r, "messages");
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool") {
      bad("messages", fmt::format("unknown role '{}' (system, developer, user, assistant, tool)", role));
    }
    req.messages.push_back({role, message_content(msg, role)});
  }
}

void parse_stop(const json& body, ApiRequest& req) {
  const json* s = field(body, "stop");
  if (s == nullptr) return;
  if (s->is_string()) {
    req.stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > 16) bad("stop", fmt::format("holds {} strings; at most 16", s->size()));
    for (const auto& x : *s) req.stop.push_back(get_string(x, "stop"));
  } else {
    bad("stop", fmt::format("must be a string or a list of strings, got {}", type_name(*s)));
  }
  for (const auto& x : req.stop) {
    if (x.empty()) bad("stop", "must not contain empty strings");
  }
}

// Options with no implementation here are refused rather than silently ignored.
void refuse_unsupported(const json& body, Endpoint endpoint) {
  if (const json* n = field(body, "n"); n != nullptr && get_int(*n, "n") != 1) bad("n", "only n = 1 is supported");
  if (const json* b = field(body, "best_of"); b != nullptr && get_int(*b, "best_of") != 1) {
    bad("best_of", "only best_of = 1 is supported");
  }
  if (const json* l = field(body, "logprobs"); l != nullptr) {
    const bool wants = endpoint == Endpoint::kChatCompletions ? get_bool(*l, "logprobs") : get_int(*l, "logprobs") != 0;
    if (wants) bad("logprobs", "is not supported");
  }
  if (const json* e = field(body, "echo"); e != nullptr && get_bool(*e, "echo")) bad("echo", "is not supported");
  if (const json* s = field(body, "suffix"); s != nullptr) bad("suffix", "is not supported");
  // Chat requests hand `tools` to the template (the reply is plain text; no tool-call parsing).
  for (const char* name : {"tools", "functions"}) {
    if (endpoint == Endpoint::kChatCompletions && std::string_view(name) == "tools") continue;
    if (const json* t = field(body, name); t != nullptr && !(t->is_array() && t->empty())) bad(name, "tool calling is not supported");
  }
  if (const json* tc = field(body, "tool_choice"); tc != nullptr && !tc->is_null()) {
    if (!tc->is_string() || (tc->get<std::string>() != "auto" && tc->get<std::string>() != "none")) {
      bad("tool_choice", "only \"auto\" and \"none\" are supported (no constrained tool calls)");
    }
  }
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json ApiError::body() const {
  json err = {{"message", what()}, {"type", type()}, {"code", status_}};
  err["param"] = param_.empty() ? json(nullptr) : json(param_);
  return {{"error", err}};
}

ChatPrompt parse_chat_prompt(std::string_view body) {
  using ojson = nlohmann::ordered_json;
  ojson doc = ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ApiError(400, "the request body is not valid JSON (UTF-8)");
  if (!doc.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", doc.type_name()));
  ChatPrompt out;
  if (auto it = doc.find("messages"); it != doc.end()) {
    if (!it->is_array()) bad("messages", fmt::format("must be a list, got {}", it->type_name()));
    out.messages = *it;
  }
  for (const char* name : {"tools", "documents"}) {
    auto it = doc.find(name);
    if (it == doc.end() || it->is_null()) continue;
    if (!it->is_array()) bad(name, fmt::format("must be a list, got {}", it->type_name()));
    for (const auto& x : *it) {
      if (!x.is_object()) bad(name, fmt::format("each entry must be an object, got {}", x.type_name()));
    }
    if (it->empty()) continue;  // an empty list means none, as OpenAI clients send it
    (std::string_view(name) == "tools" ? out.tools : out.documents) = *it;
  }
  if (auto it = doc.find("chat_template_kwargs"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) bad("chat_template_kwargs", fmt::format("must be an object, got {}", it->type_name()));
    out.chat_template_kwargs = *it;
  }
  if (auto it = doc.find("add_generation_prompt"); it != doc.end()) {
    if (!it->is_boolean()) bad("add_generation_prompt", fmt::format("must be a boolean, got {}", it->type_name()));
    out.add_generation_prompt = it->get<bool>();
  }
  return out;
}

ApiRequest parse_request(Endpoint endpoint, std::string_view body) {
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ApiError(400, "the request body is not valid JSON (UTF-8)");
  if (!doc.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", doc.type_name()));

  ApiRequest req;
  req.endpoint = endpoint;
  if (const json* m = field(doc, "model")) req.model = get_string(*m, "model");
  if (endpoint == Endpoint::kCompletions) {
    parse_prompt(doc, req);
  } else {
    parse_messages(doc, req);
    req.chat = parse_chat_prompt(body);
  }
  refuse_unsupported(doc, endpoint);
  const char* max_name = "max_tokens";
  const json* mt = field(doc, "max_tokens");
  if (endpoint == Endpoint::kChatCompletions && mt == nullptr) {
    mt = field(doc, "max_completion_tokens");
    max_name = "max_completion_tokens";
  }
  if (mt != nullptr) {
    req.max_tokens = get_int(*mt, max_name);
    if (*req.max_tokens <= 0) bad(max_name, fmt::format("must be ≥ 1, got {}", *req.max_tokens));
  }
  if (const json* t = field(doc, "temperature")) req.temperature = static_cast<float>(get_number(*t, "temperature", 0.0, 2.0));
  if (const json* t = field(doc, "top_p")) {
    req.top_p = static_cast<float>(get_number(*t, "top_p", 0.0, 1.0));
    if (*req.top_p <= 0.0f) bad("top_p", "must be > 0");
  }
  if (const json* t = field(doc, "min_p")) req.min_p = static_cast<float>(get_number(*t, "min_p", 0.0, 1.0));
  if (const json* t = field(doc, "top_k")) {
    const int64_t k = get_int(*t, "top_k");
    if (k < -1 || k > std::numeric_limits<int>::max()) bad("top_k", fmt::format("must be ≥ −1, got {}", k));
    req.top_k = static_cast<int>(k);
  }
  if (const json* t = field(doc, "repetition_penalty")) {
    req.repetition_penalty = static_cast<float>(get_number(*t, "repetition_penalty", 0.0, 1e6));
    if (*req.repetition_penalty <= 0.0f) bad("repetition_penalty", "must be > 0");
  }
  if (const json* t = field(doc, "presence_penalty")) req.presence_penalty = static_cast<float>(get_number(*t, "presence_penalty", -2.0, 2.0));
  if (const json* t = field(doc, "frequency_penalty")) req.frequency_penalty = static_cast<float>(get_number(*t, "frequency_penalty", -2.0, 2.0));
  if (const json* s = field(doc, "seed")) {
    if (!s->is_number_integer()) bad("seed", fmt::format("must be an integer, got {}", type_name(*s)));
    req.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  parse_stop(doc, req);
  if (const json* s = field(doc, "stream")) req.stream = get_bool(*s, "stream");
  if (const json* so = field(doc, "stream_options")) {
    if (!so->is_object()) bad("stream_options", fmt::format("must be an object, got {}", type_name(*so)));
    if (const json* u = field(*so, "include_usage")) req.include_usage = get_bool(*u, "stream_options");
  }
  if (const json* x = field(doc, "ignore_eos")) req.ignore_eos = get_bool(*x, "ignore_eos");
  if (const json* x = field(doc, "return_token_ids")) req.return_token_ids = get_bool(*x, "return_token_ids");
  return req;
}

SequenceRequest to_sequence_request(const ApiRequest& request, const TextCodec& codec, const ServeLimits& limits,
                                    Clock::time_point arrival) {
  if (!request.model.empty() && request.model != limits.model_name) {
    throw ApiError(400, fmt::format("the model '{}' does not exist; this server serves '{}'", request.model,
                                    limits.model_name), "model");
  }
  SequenceRequest seq;
  seq.arrival = arrival;
  if (!request.prompt_ids.empty()) {
    const int64_t vocab = codec.vocab_size();
    seq.prompt.reserve(request.prompt_ids.size());
    for (const int64_t id : request.prompt_ids) {
      if (id >= vocab) throw ApiError(400, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab), "prompt");
      seq.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    try {
      if (request.endpoint == Endpoint::kChatCompletions) {
        seq.prompt = codec.encode(codec.render_chat_prompt(request.chat), /*add_special_tokens=*/false);
      } else {
        seq.prompt = codec.encode(request.prompt_text, /*add_special_tokens=*/true);
      }
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("the prompt cannot be prepared: {}", e.what()),
                     request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt");
    }
  }
  const auto prompt_len = static_cast<int64_t>(seq.prompt.size());
  if (prompt_len == 0) throw ApiError(400, "the prompt encodes to no tokens", "prompt");
  if (prompt_len >= limits.context_length) {
    throw ApiError(400, fmt::format("the prompt has {} tokens; the context length (--max-model-len) is {}, which "
                                    "leaves no room for output", prompt_len, limits.context_length),
                   request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt");
  }
  const char* max_name = "max_tokens";
  seq.max_new_tokens = request.max_tokens.value_or(limits.context_length - prompt_len);
  if (seq.max_new_tokens > limits.context_length - prompt_len) {
    throw ApiError(400, fmt::format("max_tokens {} + prompt {} tokens exceeds the context length (--max-model-len) {}",
                                    seq.max_new_tokens, prompt_len, limits.context_length), max_name);
  }
  runtime::SamplingParams& sp = seq.sampling;
  sp = limits.defaults;
  if (request.temperature) sp.temperature = *request.temperature;
  if (request.top_p) sp.top_p = *request.top_p;
  if (request.top_k) sp.top_k = *request.top_k;
  if (request.min_p) sp.min_p = *request.min_p;
  if (request.repetition_penalty) sp.repetition_penalty = *request.repetition_penalty;
  sp.presence_penalty = request.presence_penalty;
  sp.frequency_penalty = request.frequency_penalty;
  sp.seed = request.seed;
  seq.eos_token_ids = codec.eos_token_ids();
  seq.ignore_eos = request.ignore_eos;
  return seq;
}

nlohmann::json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

namespace {

json envelope(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created, bool chunk) {
  const char* object = endpoint == Endpoint::kCompletions ? "text_completion"
                       : chunk                             ? "chat.completion.chunk"
                                                           : "chat.completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace

nlohmann::json response_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                             const std::string& text, const std::string& finish_reason, const Usage& usage,
                             const std::vector<int32_t>* token_ids) {
  json out = envelope(endpoint, id, model, created, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  if (token_ids != nullptr) choice["token_ids"] = *token_ids;
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(usage);
  return out;
}

nlohmann::json chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                          const std::string& text, const std::optional<std::string>& finish_reason, bool first,
                          const std::vector<int32_t>* token_ids) {
  json out = envelope(endpoint, id, model, created, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  if (endpoint == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    json delta = {{"content", text}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  }
  if (token_ids != nullptr) choice["token_ids"] = *token_ids;
  out["choices"] = json::array({choice});
  return out;
}

nlohmann::json usage_chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                                const Usage& usage) {
  json out = envelope(endpoint, id, model, created, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace fp4serve::server
