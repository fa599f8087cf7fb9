// SPDX-License-Identifier: Apache-2.0
#include "server/openai_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "fp4serve/error.h"
#include "runtime/structured_output.h"

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
    if (type == nullptr || !type->is_string()) bad("messages", "each content part needs a string 'type'");
    if (type->get<std::string>() != "text") {
      bad("messages", fmt::format("content parts of type '{}' are not supported: the served model takes text only "
                                  "(parts of type 'text')", type->get<std::string>()));
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
void refuse_unsupported(const json& body) {
  if (const json* b = field(body, "best_of"); b != nullptr && get_int(*b, "best_of") != 1) {
    bad("best_of", "only best_of = 1 is supported");
  }
  if (const json* e = field(body, "echo"); e != nullptr && get_bool(*e, "echo")) bad("echo", "is not supported");
  if (const json* s = field(body, "suffix"); s != nullptr) bad("suffix", "is not supported");
  // The deprecated function-calling fields: OpenAI replaced them with tools / tool_choice, which work.
  if (const json* f = field(body, "functions"); f != nullptr && !(f->is_array() && f->empty())) {
    bad("functions", "is deprecated and not supported: send 'tools' instead");
  }
  if (field(body, "function_call") != nullptr) bad("function_call", "is deprecated and not supported: send 'tool_choice'");
}

// Every field a request may carry. Anything else is refused by name, so no option is silently ignored.
// `user` is an end-user id for the caller's own bookkeeping; the tool and template fields are the chat path's.
void refuse_unknown(const json& body, Endpoint endpoint) {
  static const std::vector<std::string_view> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
      "frequency_penalty", "seed", "stop", "stream", "stream_options", "ignore_eos", "return_token_ids", "n",
      "best_of", "logprobs", "logit_bias", "min_tokens", "stop_token_ids", "user", "echo"};
  static const std::vector<std::string_view> completions = {"prompt", "suffix"};
  static const std::vector<std::string_view> chat = {
      "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
      "parallel_tool_calls", "chat_template_kwargs", "documents", "add_generation_prompt"};
  const auto& own = endpoint == Endpoint::kCompletions ? completions : chat;
  for (const auto& [name, value] : body.items()) {
    const auto known = [&](const std::vector<std::string_view>& list) {
      return std::find(list.begin(), list.end(), name) != list.end();
    };
    if (known(common) || known(own) || is_output_constraint_field(name)) continue;
    throw ApiError(400, fmt::format("'{}' is not a field fp4serve implements for {}", name,
                                    endpoint == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions"),
                   name);
  }
}

constexpr int64_t kMaxTopLogprobs = 20;  // vLLM's default --max-logprobs, OpenAI's top_logprobs limit
constexpr int64_t kMaxChoices = 128;     // OpenAI's bound on n; the scheduler's batch bounds it further

// logprobs / top_logprobs, logit_bias, min_tokens, stop_token_ids (vLLM's sampling extensions).
void parse_sampling_extensions(const json& body, ApiRequest& req) {
  if (req.endpoint == Endpoint::kCompletions) {
    if (const json* l = field(body, "logprobs")) {
      const int64_t n = get_int(*l, "logprobs");
      if (n < 0 || n > kMaxTopLogprobs) bad("logprobs", fmt::format("must be in [0, {}], got {}", kMaxTopLogprobs, n));
      req.logprobs = static_cast<int>(n);
    }
  } else {
    const bool wants = field(body, "logprobs") != nullptr && get_bool(*field(body, "logprobs"), "logprobs");
    int64_t top = 0;
    if (const json* t = field(body, "top_logprobs")) {
      top = get_int(*t, "top_logprobs");
      if (top < 0 || top > kMaxTopLogprobs) bad("top_logprobs", fmt::format("must be in [0, {}], got {}", kMaxTopLogprobs, top));
      if (!wants) bad("top_logprobs", "needs 'logprobs': true");
    }
    if (wants) req.logprobs = static_cast<int>(top);
  }
  if (const json* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", fmt::format("must be an object of token id → bias, got {}", type_name(*lb)));
    for (const auto& [key, value] : lb->items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0) bad("logit_bias", fmt::format("key '{}' is not a token id", key));
      req.logit_bias.emplace_back(id, static_cast<float>(get_number(value, "logit_bias", -100.0, 100.0)));
    }
  }
  if (const json* m = field(body, "min_tokens")) {
    req.min_tokens = get_int(*m, "min_tokens");
    if (req.min_tokens < 0) bad("min_tokens", fmt::format("must be ≥ 0, got {}", req.min_tokens));
    if (req.max_tokens && req.min_tokens > *req.max_tokens) {
      bad("min_tokens", fmt::format("{} exceeds max_tokens {}", req.min_tokens, *req.max_tokens));
    }
  }
  if (const json* s = field(body, "stop_token_ids")) {
    if (!s->is_array()) bad("stop_token_ids", fmt::format("must be a list of token ids, got {}", type_name(*s)));
    req.stop_token_ids = get_id_list(*s, "stop_token_ids");
  }
}

int32_t checked_id(int64_t id, int64_t vocab, const char* name) {
  if (id >= vocab) throw ApiError(400, fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab), name);
  return static_cast<int32_t>(id);
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 415: return "invalid_request_error";
    case 429: return "rate_limit_error";
    default: return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::json ApiError::body() const {
  json err = {{"message", what()}, {"type", type()}};
  err["param"] = param_.empty() ? json(nullptr) : json(param_);
  err["code"] = code_.empty() ? json(nullptr) : json(code_);
  return {{"error", err}};
}

void check_body_nesting(std::string_view body) {
  const int depth = runtime::json_nesting(body);
  if (depth > kMaxRequestNesting) {
    throw ApiError(400, fmt::format("the request body nests {} levels deep; at most {} are accepted", depth,
                                    kMaxRequestNesting));
  }
}

ChatPrompt parse_chat_prompt(std::string_view body) {
  using ojson = nlohmann::ordered_json;
  check_body_nesting(body);
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
  check_body_nesting(body);  // before anything walks the document recursively (dump, the chat template's values)
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
  refuse_unknown(doc, endpoint);
  refuse_unsupported(doc);
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
  if (const json* n = field(doc, "n")) {
    const int64_t choices = get_int(*n, "n");
    if (choices < 1 || choices > kMaxChoices) bad("n", fmt::format("must be in [1, {}], got {}", kMaxChoices, choices));
    req.n = static_cast<int>(choices);
  }
  parse_stop(doc, req);
  if (const json* s = field(doc, "stream")) req.stream = get_bool(*s, "stream");
  if (const json* so = field(doc, "stream_options")) {
    if (!so->is_object()) bad("stream_options", fmt::format("must be an object, got {}", type_name(*so)));
    if (const json* u = field(*so, "include_usage")) req.include_usage = get_bool(*u, "stream_options");
  }
  if (const json* x = field(doc, "ignore_eos")) req.ignore_eos = get_bool(*x, "ignore_eos");
  if (const json* x = field(doc, "return_token_ids")) req.return_token_ids = get_bool(*x, "return_token_ids");
  if (const json* u = field(doc, "user")) get_string(*u, "user");
  parse_sampling_extensions(doc, req);
  // Schemas keep the client's key order (the order the engine writes properties in): read from an ordered parse.
  const auto ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  req.constraint = parse_output_constraint(ordered);
  if (endpoint == Endpoint::kChatCompletions) {
    req.tools = parse_tool_request(ordered);
    if (req.tools && (req.tools->choice == ToolRequest::Choice::kRequired ||
                      req.tools->choice == ToolRequest::Choice::kNamed)) {
      if (req.constraint) {
        bad("tool_choice", fmt::format("forces a tool call, which is itself a structured output: it cannot be "
                                       "combined with '{}'", req.constraint->param));
      }
      req.constraint = forced_tool_constraint(*req.tools);
    }
  }
  return req;
}

SequenceRequest to_sequence_request(const ApiRequest& request, const TextCodec& codec, const ServeLimits& limits,
                                    Clock::time_point arrival) {
  if (!request.model.empty() && request.model != limits.model_name) {
    throw ApiError(404, fmt::format("The model `{}` does not exist; this server serves '{}'", request.model,
                                    limits.model_name), "model", "model_not_found");
  }
  SequenceRequest seq;
  seq.arrival = arrival;
  if (!request.prompt_ids.empty()) {
    const int64_t vocab = codec.vocab_size();
    seq.prompt.reserve(request.prompt_ids.size());
    for (const int64_t id : request.prompt_ids) seq.prompt.push_back(checked_id(id, vocab, "prompt"));
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
  // vLLM's wording, which clients and eval harnesses match on.
  const char* prompt_param = request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (!request.max_tokens && prompt_len >= limits.context_length) {
    throw ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                    "tokens in the messages, Please reduce the length of the messages.",
                                    limits.context_length, prompt_len), prompt_param);
  }
  // Without max_tokens: the rest of the context, or less when the model's generation config sets max_new_tokens
  // (vLLM's default_max_tokens).
  seq.max_new_tokens = request.max_tokens.value_or(
      std::min(limits.default_max_tokens.value_or(limits.context_length), limits.context_length - prompt_len));
  if (seq.max_new_tokens > limits.context_length - prompt_len) {
    // Both counts are ≥ 0, so their unsigned sum cannot wrap (max_tokens may be INT64_MAX).
    const uint64_t requested = static_cast<uint64_t>(prompt_len) + static_cast<uint64_t>(seq.max_new_tokens);
    throw ApiError(400, fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                    "tokens ({} in the messages, {} in the completion). Please reduce the length "
                                    "of the messages or completion.", limits.context_length,
                                    requested, prompt_len, seq.max_new_tokens),
                   prompt_len >= limits.context_length ? prompt_param : "max_tokens");
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
  // Drawn once here, so the request's random stream is its own whatever else runs in its batch.
  sp.seed = request.seed ? *request.seed : std::random_device{}() * uint64_t{0x100000000} + std::random_device{}();
  seq.eos_token_ids = codec.eos_token_ids();
  seq.ignore_eos = request.ignore_eos;
  const int64_t vocab = codec.vocab_size();
  for (const auto& [id, bias] : request.logit_bias) sp.logit_bias.emplace_back(checked_id(id, vocab, "logit_bias"), bias);
  for (const int64_t id : request.stop_token_ids) seq.stop_token_ids.push_back(checked_id(id, vocab, "stop_token_ids"));
  sp.min_tokens = request.min_tokens;
  if (request.min_tokens > 0) {
    sp.min_tokens_blocked = seq.stop_token_ids;
    if (!request.ignore_eos) sp.min_tokens_blocked.insert(sp.min_tokens_blocked.end(), seq.eos_token_ids.begin(), seq.eos_token_ids.end());
  }
  seq.top_logprobs = request.logprobs ? *request.logprobs : -1;
  if (request.tools && request.tools->choice == ToolRequest::Choice::kAuto && !limits.tool_parser) {
    throw ApiError(400, "tool_choice 'auto' needs the model's tool-call format, and none is known for this model: "
                        "start the server with --tool-call-parser NAME (hermes, llama3_json, mistral, granite, openai), "
                        "or send tool_choice 'none', 'required' or a named function", "tool_choice");
  }
  if (request.constraint) {
    const std::string& param = request.constraint->param;
    if (limits.grammars == nullptr) {
      throw ApiError(400, fmt::format("'{}' needs the grammar engine, which this server runs without ({})", param,
                                      runtime::grammar_engine_description()), param);
    }
    runtime::GrammarSpec spec = request.constraint->spec;
    if (limits.disable_any_whitespace) spec.any_whitespace = false;
    try {
      seq.grammar = limits.grammars->compile(spec);
    } catch (const runtime::GrammarBusyError& e) {
      throw ApiError(503, e.what(), param);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("'{}' cannot be compiled: {}", param, e.what()), param);
    }
  }
  if (seq.grammar != nullptr && request.endpoint == Endpoint::kChatCompletions &&
      (limits.reasoning_parser == ReasoningParser::kQwen3 || limits.reasoning_parser == ReasoningParser::kDeepSeekR1)) {
    // A reasoning model thinks freely and answers under the constraint (vLLM applies structured outputs once the
    // reasoning has ended), unless the prompt already closed the block (Qwen3 with enable_thinking false).
    const auto close = codec.token_id("</think>");
    const auto open = codec.token_id("<think>");
    auto last = [&](std::optional<int32_t> id) -> int64_t {
      if (!id) return -1;
      const auto it = std::find(seq.prompt.rbegin(), seq.prompt.rend(), *id);
      return it == seq.prompt.rend() ? -1 : static_cast<int64_t>(seq.prompt.rend() - it) - 1;
    };
    if (close && !(last(close) >= 0 && last(close) > last(open))) seq.grammar_after_token = *close;
  }
  return seq;
}

nlohmann::json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
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

nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<LogprobEntry>& entries, int64_t text_offset) {
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (const char c : s) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
    return b;
  };
  if (endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const auto& e : entries) {
      json top = json::array();
      for (const auto& [text, value] : e.top) top.push_back({{"token", text}, {"logprob", value}, {"bytes", bytes(text)}});
      content.push_back({{"token", e.token}, {"logprob", e.logprob}, {"bytes", bytes(e.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(e.token);
    token_logprobs.push_back(e.logprob);
    json top = json::object();
    for (const auto& [text, value] : e.top) {
      if (!top.contains(text)) top[text] = value;
    }
    if (!top.contains(e.token)) top[e.token] = e.logprob;
    top_logprobs.push_back(top);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(e.token.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

nlohmann::json usage_chunk_json(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                                const Usage& usage) {
  json out = envelope(endpoint, id, model, created, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace fp4serve::server
