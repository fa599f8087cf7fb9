// SPDX-License-Identifier: Apache-2.0
#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <random>

#include <sys/socket.h>

#include "fp4serve/error.h"
#include "runtime/generator.h"
#include "server/tokenize_api.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr int kListenBacklog = 512;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), "application/json");
}

std::string make_id(Endpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl", rng());
}

// Generated ids → text for one request: incremental detokenization, then stop strings held back until they can
// no longer match (runtime::StopMatcher), so a stop string is never partially sent.
class OutputText {
 public:
  OutputText(const TextCodec& codec, std::vector<std::string> stop)
      : detok_(codec.detokenizer()), stops_(std::move(stop)) {}

  std::string push(const std::vector<int32_t>& ids) {
    std::string out;
    for (const int32_t id : ids) {
      if (stops_.stopped()) break;
      ++tokens_;
      if (keep_ids_) ids_.push_back(id);
      out += stops_.push(detok_->push(id));
    }
    return out;
  }
  std::string finish() {
    std::string tail = stops_.stopped() ? std::string() : stops_.push(detok_->flush());
    return tail + stops_.finish();
  }
  bool stopped() const { return stops_.stopped(); }
  int64_t tokens() const { return tokens_; }
  void keep_ids() { keep_ids_ = true; }
  /// Ids since the last call (for token_ids in stream chunks).
  std::vector<int32_t> take_ids() { return std::exchange(ids_, {}); }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::unique_ptr<Detokenizer> detok_;
  runtime::StopMatcher stops_;
  int64_t tokens_ = 0;
  bool keep_ids_ = false;
  std::vector<int32_t> ids_;
};

// What the stream provider carries between calls.
struct StreamState {
  std::shared_ptr<RequestChannel> channel;
  OutputText text;
  Endpoint endpoint;
  std::string id, model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;
  bool include_usage = false;
  bool return_ids = false;
  bool first = true;
};

}  // namespace

struct HttpServer::Impl {
  HttpConfig config;
  ServeLimits limits;
  const TextCodec& codec;
  Scheduler& scheduler;
  Metrics& metrics;
  httplib::Server http;
  std::atomic<bool> bound{false};
  int listen_fd = -1;

  Impl(HttpConfig c, ServeLimits l, const TextCodec& tc, Scheduler& s, Metrics& m)
      : config(std::move(c)), limits(std::move(l)), codec(tc), scheduler(s), metrics(m) {}

  void install();
  void generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void respond_whole(const ApiRequest& api, std::shared_ptr<RequestChannel> channel, int64_t prompt_tokens,
                     httplib::Response& res);
  void respond_stream(const ApiRequest& api, std::shared_ptr<RequestChannel> channel, int64_t prompt_tokens,
                      httplib::Response& res);
};

void HttpServer::Impl::install() {
  const int threads = std::max(config.threads, 4);
  // The library listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed in Debian's shared build); a burst
  // of concurrent clients then overflows the accept queue and some connections fail. Keep the socket so that
  // bind() can listen again with a deeper queue.
  http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(config.max_body_bytes);
  http.set_read_timeout(config.io_timeout_seconds);
  http.set_write_timeout(config.io_timeout_seconds);
  http.set_keep_alive_timeout(2);  // also bounds how long shutdown waits for idle connections

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + config.api_key) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    send_error(res, ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib answers malformed requests itself (413 for an oversized body, 404 for unknown routes, 400 for a bad
  // request line); give those an OpenAI error object too, and make an oversized body a 400 as OpenAI does.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413) {
      send_error(res, ApiError(400, fmt::format("the request body exceeds {} bytes", config.max_body_bytes)));
    } else if (res.status == 404) {
      send_error(res, ApiError(404, fmt::format("no route {} {}", req.method, req.path)));
    } else {
      send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, fmt::format("internal error: {}", what)));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0) metrics.count_request(res.status);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", limits.model_name},   {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "fp4serve"},    {"max_model_len", limits.context_length},
                        {"vocab_size", codec.vocab_size()}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChatCompletions, req, res);
  });
  // vLLM's prompt inspection endpoints.
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(dump(tokenize_request(req.body, codec, limits)), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(dump(detokenize_request(req.body, codec, limits)), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
}

void HttpServer::Impl::generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  const auto arrival = Clock::now();
  try {
    const ApiRequest api = parse_request(endpoint, req.body);
    SequenceRequest seq = to_sequence_request(api, codec, limits, arrival);
    const auto prompt_tokens = static_cast<int64_t>(seq.prompt.size());
    auto channel = scheduler.submit(std::move(seq));
    if (channel == nullptr) throw ApiError(429, "the server is at capacity (request queue full); retry later");
    if (api.stream) {
      respond_stream(api, std::move(channel), prompt_tokens, res);
    } else {
      respond_whole(api, std::move(channel), prompt_tokens, res);
    }
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void HttpServer::Impl::respond_whole(const ApiRequest& api, std::shared_ptr<RequestChannel> channel,
                                     int64_t prompt_tokens, httplib::Response& res) {
  OutputText out(codec, api.stop);
  if (api.return_token_ids) out.keep_ids();
  std::string text;
  ChannelUpdate update;
  std::string reason;
  for (;;) {
    update = channel->wait(kPoll);
    text += out.push(update.tokens);
    if (out.stopped()) {
      channel->cancel(FinishReason::kStop);
      reason = "stop";
      break;
    }
    if (update.finished) {
      if (update.reason == FinishReason::kError) throw ApiError(500, update.error);
      reason = finish_reason_name(update.reason);
      text += out.finish();
      break;
    }
  }
  const Usage usage{prompt_tokens, out.tokens()};
  res.set_content(dump(response_json(api.endpoint, make_id(api.endpoint), limits.model_name,
                                     static_cast<int64_t>(std::time(nullptr)), text, reason, usage,
                                     api.return_token_ids ? &out.ids() : nullptr)),
                  "application/json");
}

void HttpServer::Impl::respond_stream(const ApiRequest& api, std::shared_ptr<RequestChannel> channel,
                                      int64_t prompt_tokens, httplib::Response& res) {
  auto state = std::make_shared<StreamState>(StreamState{std::move(channel), OutputText(codec, api.stop), api.endpoint,
                                                         make_id(api.endpoint), limits.model_name,
                                                         static_cast<int64_t>(std::time(nullptr)), prompt_tokens,
                                                         api.include_usage, api.return_token_ids});
  if (state->return_ids) state->text.keep_ids();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state](size_t, httplib::DataSink& sink) {
        StreamState& s = *state;
        const ChannelUpdate update = s.channel->wait(kPoll);
        std::string piece = s.text.push(update.tokens);
        bool finished = update.finished;
        std::string reason = finish_reason_name(update.reason);
        if (s.text.stopped()) {
          if (!finished) s.channel->cancel(FinishReason::kStop);
          finished = true;
          reason = "stop";
        }
        std::string out;
        if (finished && update.reason == FinishReason::kError && !s.text.stopped()) {
          out += sse_event(ApiError(500, update.error).body());
        } else if (finished) {
          piece += s.text.finish();
          auto ids = s.text.take_ids();
          out += sse_event(chunk_json(s.endpoint, s.id, s.model, s.created, piece, reason, s.first,
                                      s.return_ids ? &ids : nullptr));
          if (s.include_usage) {
            out += sse_event(usage_chunk_json(s.endpoint, s.id, s.model, s.created, {s.prompt_tokens, s.text.tokens()}));
          }
        } else if (!piece.empty() || (s.return_ids && !update.tokens.empty())) {
          auto ids = s.text.take_ids();
          out += sse_event(chunk_json(s.endpoint, s.id, s.model, s.created, piece, std::nullopt, s.first,
                                      s.return_ids ? &ids : nullptr));
          s.first = false;
        }
        if (finished) out += kSseDone;
        if (out.empty()) {
          // Nothing new (queued, or a multi-byte character still incomplete): notice a client that has gone.
          if (sink.is_writable()) return true;
          s.channel->cancel();
          return false;
        }
        if (!sink.write(out.data(), out.size())) {
          s.channel->cancel();
          return false;
        }
        if (finished) sink.done();
        return true;
      },
      [state](bool success) {
        // Also reached when the connection drops between provider calls.
        if (!success) state->channel->cancel();
      });
}

HttpServer::HttpServer(HttpConfig config, ServeLimits limits, const TextCodec& codec, Scheduler& scheduler,
                       Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(limits), codec, scheduler, metrics)) {
  std::signal(SIGPIPE, SIG_IGN);
  impl_->install();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  int port = impl_->config.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(impl_->config.host);
    if (port < 0) port = 0;
  } else if (!impl_->http.bind_to_port(impl_->config.host, port)) {
    port = 0;
  }
  if (port == 0) {
    throw IoError(fmt::format("cannot listen on {}:{} (address in use or not local?)", impl_->config.host,
                              impl_->config.port));
  }
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  impl_->bound = true;
  return port;
}

void HttpServer::serve() {
  if (!impl_->bound) throw UsageError("HttpServer::serve: call bind() first");
  impl_->http.listen_after_bind();
}

void HttpServer::stop() { impl_->http.stop(); }

}  // namespace fp4serve::server
