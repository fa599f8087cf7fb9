// SPDX-License-Identifier: Apache-2.0
#include "server/http_server.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "fp4serve/error.h"
#include "server/chat_output.h"
#include "server/http_connection.h"
#include "server/output_text.h"
#include "server/tokenize_api.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
constexpr auto kPoll = std::chrono::milliseconds(200);
constexpr int kListenBacklog = 512;
constexpr int kRetryAfterSeconds = 1;
// After the grace period, how long aborted requests have to write their ending (an error event, a 503) before
// their sockets are closed under them: enough for a client that reads, and a bound on one that does not.
constexpr auto kAbortBound = std::chrono::seconds(1);
constexpr const char* kShuttingDown = "the server is shutting down";

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

StringResponse json_response(int status, const json& body, unsigned version, bool keep_alive) {
  StringResponse res{static_cast<http::status>(status), version};
  res.set(http::field::content_type, "application/json");
  res.set(http::field::server, "fp4serve");
  res.keep_alive(keep_alive);
  res.body() = dump(body);
  return res;
}

StringResponse error_response(const ApiError& e, unsigned version, bool keep_alive) {
  StringResponse res = json_response(e.status(), e.body(), version, keep_alive);
  // 429 (queue full) and 503 (draining, connection caps): a client may retry, here or at a restarted server.
  if (e.status() == 429 || e.status() == 503) res.set(http::field::retry_after, std::to_string(kRetryAfterSeconds));
  return res;
}

std::string make_id(Endpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl", rng());
}

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

bool is_api(std::string_view target) { return path_of(target).rfind("/v1/", 0) == 0; }

constexpr std::string_view kModelPrefix = "/v1/models/";

// %XX escapes of a path segment (a model id may hold a '/' sent as %2F); anything malformed stays as it is.
std::string percent_decoded(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The file-descriptor limit leaves room for the model's files and the listener.
int connection_cap(int configured) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return configured;
  const auto room = static_cast<int64_t>(lim.rlim_cur) - 64;
  return static_cast<int>(std::max<int64_t>(16, std::min<int64_t>(configured, room)));
}

}  // namespace

struct HttpServer::Impl final : Routes {
  HttpConfig config;
  ServeLimits serve_limits;
  const TextCodec& codec;
  Scheduler& scheduler;
  Metrics& metrics;
  Routes::Limits io_limits;
  int max_connections;

  std::mutex conn_mutex;
  std::unordered_map<std::string, int> per_client;
  std::map<uint64_t, std::weak_ptr<Connection>> live;
  uint64_t next_id = 0;
  int open_connections = 0;

  std::once_flag stopped;
  bool bound = false;
  const int64_t model_created = static_cast<int64_t>(std::time(nullptr));  // the model object's creation time

  // Shutdown: `draining` from stop() on (new requests get 503, answers close their connection); `aborting`
  // once the grace period has passed (running requests end now with an error). `active` counts the requests
  // on handler threads, which stop() waits for.
  std::atomic<bool> draining{false};
  std::atomic<bool> aborting{false};
  std::mutex active_mutex;
  std::condition_variable active_cv;
  int active = 0;

  net::thread_pool handlers;
  // Last, so that it is destroyed first: pending handlers hold connections that call back into the members above.
  net::io_context io;
  tcp::acceptor acceptor{net::make_strand(io)};
  // Keeps io.run() from returning when no socket operation is pending: a handler may still post a write, and a
  // write posted to an I/O context that ran out of work would never complete (the SIGTERM hang of issue 43).
  // Released by shutdown() only after every handler has returned.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work{net::make_work_guard(io)};

  Impl(HttpConfig c, ServeLimits l, const TextCodec& tc, Scheduler& s, Metrics& m)
      : config(std::move(c)), serve_limits(std::move(l)), codec(tc), scheduler(s), metrics(m),
        io_limits{config.max_body_bytes, std::chrono::seconds(std::max(config.header_timeout_seconds, 1)),
                  std::chrono::seconds(std::max(config.io_timeout_seconds, 1))},
        max_connections(connection_cap(config.max_connections)),
        handlers(static_cast<size_t>(std::max(config.threads, 4))) {}

  const Limits& limits() const override { return io_limits; }
  std::optional<StringResponse> check_headers(const http::request_header<>& header) override;
  void dispatch(std::shared_ptr<Connection> conn, StringRequest request) override;
  void responded(const std::string& target, int status) override {
    if (is_api(target)) metrics.count_request(status);
  }
  void released(const std::string& client) override {
    std::lock_guard lock(conn_mutex);
    --open_connections;
    if (--per_client[client] <= 0) per_client.erase(client);
  }

  nlohmann::json model_json() const {
    return {{"id", serve_limits.model_name}, {"object", "model"}, {"created", model_created}, {"owned_by", "fp4serve"},
            {"max_model_len", serve_limits.context_length}, {"vocab_size", codec.vocab_size()}};
  }
  /// Runs `task` on a handler thread, counted in `active` until it returns.
  template <class Task>
  void run_handler(Task task);
  void wait_idle(std::chrono::steady_clock::duration limit);
  void accept();
  void on_accept(beast::error_code ec, tcp::socket socket);
  void generate(const std::shared_ptr<Connection>& conn, Endpoint endpoint, const StringRequest& req);
  using Channels = std::vector<std::shared_ptr<RequestChannel>>;
  void respond_whole(Connection& conn, const StringRequest& req, const ApiRequest& api, const Channels& channels,
                     int64_t prompt_tokens);
  json collect_choice(Connection& conn, const ApiRequest& api, RequestChannel& channel, int index,
                      int64_t& completion_tokens);
  void respond_stream(Connection& conn, const StringRequest& req, const ApiRequest& api, const Channels& channels,
                      int64_t prompt_tokens);
  void shutdown();
};

std::optional<StringResponse> HttpServer::Impl::check_headers(const http::request_header<>& header) {
  const std::string_view path = path_of(to_std(header.target()));
  const unsigned version = header.version();
  if (!config.api_key.empty() && is_api(path) &&
      header[http::field::authorization] != "Bearer " + config.api_key) {
    return error_response(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", {},
                                   "invalid_api_key"), version, false);
  }
  const beast::string_view encoding = header[http::field::content_encoding];
  if (!encoding.empty() && !beast::iequals(encoding, "identity")) {
    // A compressed body's size says nothing about what it inflates to; the limit is on what is parsed.
    return error_response(ApiError(415, fmt::format("Content-Encoding '{}' is not supported; send the body "
                                                    "uncompressed", std::string(encoding))), version, false);
  }
  const auto length = to_std(header[http::field::content_length]);
  if (!length.empty()) {
    const auto n = std::strtoull(std::string(length).c_str(), nullptr, 10);
    if (n > config.max_body_bytes) {
      return error_response(ApiError(400, fmt::format("the request body exceeds {} bytes", config.max_body_bytes)),
                            version, false);
    }
  }
  const bool known = (header.method() == http::verb::get &&
                      (path == "/health" || path == "/metrics" || path == "/v1/models" ||
                       path.rfind(kModelPrefix, 0) == 0)) ||
                     (header.method() == http::verb::post &&
                      (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize" ||
                       path == "/detokenize"));
  if (!known) {
    return error_response(ApiError(404, fmt::format("no route {} {}", std::string(header.method_string()),
                                                    std::string(path))), version, false);
  }
  return std::nullopt;
}

template <class Task>
void HttpServer::Impl::run_handler(Task task) {
  {
    std::lock_guard lock(active_mutex);
    ++active;
  }
  net::post(handlers, [this, task = std::move(task)]() mutable {
    struct Done {
      Impl& impl;
      ~Done() {
        {
          std::lock_guard lock(impl.active_mutex);
          --impl.active;
        }
        impl.active_cv.notify_all();
      }
    } done{*this};
    task();
  });
}

void HttpServer::Impl::dispatch(std::shared_ptr<Connection> conn, StringRequest req) {
  const std::string_view path = path_of(to_std(req.target()));
  const unsigned version = req.version();
  const bool keep_alive = req.keep_alive();
  if (draining.load()) {  // arrived after stop() began (a keep-alive connection): not started
    conn->respond(error_response(ApiError(503, kShuttingDown), version, false));
  } else if (path == "/health") {
    conn->respond(json_response(200, json{{"status", "ok"}}, version, keep_alive));
  } else if (path == "/metrics") {
    StringResponse res{http::status::ok, version};
    res.set(http::field::content_type, "text/plain; version=0.0.4");
    res.keep_alive(keep_alive);
    res.body() = metrics.render();
    conn->respond(std::move(res));
  } else if (path == "/v1/models") {
    conn->respond(json_response(200, json{{"object", "list"}, {"data", json::array({model_json()})}}, version, keep_alive));
  } else if (path.rfind(kModelPrefix, 0) == 0) {  // the openai client's models.retrieve(id)
    const std::string id = percent_decoded(path.substr(kModelPrefix.size()));
    if (id == serve_limits.model_name) {
      conn->respond(json_response(200, model_json(), version, keep_alive));
    } else {
      conn->respond(error_response(ApiError(404, fmt::format("The model `{}` does not exist; this server serves '{}'",
                                                             id, serve_limits.model_name), "model", "model_not_found"),
                                   version, keep_alive));
    }
  } else if (path == "/tokenize" || path == "/detokenize") {
    // vLLM's prompt inspection endpoints; a chat template render is work for a handler thread.
    run_handler([this, conn = std::move(conn), r = std::move(req)] {
      const std::string_view body(r.body());
      bool keep = r.keep_alive();
      try {
        const json answer = path_of(to_std(r.target())) == "/tokenize" ? tokenize_request(body, codec, serve_limits)
                                                                         : detokenize_request(body, codec, serve_limits);
        StringResponse res = json_response(200, answer, r.version(), keep);
        keep = conn->write_response(res) && keep;
      } catch (const ApiError& e) {
        StringResponse res = error_response(e, r.version(), keep);
        keep = conn->write_response(res) && keep;
      } catch (const std::exception& e) {
        StringResponse res = error_response(ApiError(500, fmt::format("internal error: {}", e.what())), r.version(), false);
        conn->write_response(res);
        keep = false;
      }
      conn->finish(keep && !draining.load());
    });
  } else {
    // Parsing, tokenizing and waiting for tokens happen on a handler thread, never on an I/O thread.
    const Endpoint endpoint = path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions;
    run_handler([this, conn = std::move(conn), endpoint, r = std::move(req)] { generate(conn, endpoint, r); });
  }
}

void HttpServer::Impl::generate(const std::shared_ptr<Connection>& conn, Endpoint endpoint, const StringRequest& req) {
  bool keep_alive = req.keep_alive();
  try {
    // A request that waited for a handler thread past the grace period is not started.
    if (aborting.load()) throw ApiError(503, kShuttingDown);
    const ApiRequest api = parse_request(endpoint, std::string_view(req.body()));
    SequenceRequest seq = to_sequence_request(api, codec, serve_limits, conn->request_started());
    const auto prompt_tokens = static_cast<int64_t>(seq.prompt.size());
    Channels channels;
    try {
      channels = scheduler.submit_n(std::move(seq), api.n);
    } catch (const UsageError& e) {
      throw ApiError(400, e.what(), "n");
    }
    if (channels.empty()) {
      throw ApiError(429, "the server is at capacity (request queue full); retry later", {}, "rate_limit_exceeded");
    }
    if (api.stream) {
      respond_stream(*conn, req, api, channels, prompt_tokens);
      keep_alive = keep_alive && req.version() >= 11;
    } else {
      respond_whole(*conn, req, api, channels, prompt_tokens);
    }
  } catch (const ApiError& e) {
    keep_alive = keep_alive && !draining.load();
    StringResponse res = error_response(e, req.version(), keep_alive);
    keep_alive = conn->write_response(res) && keep_alive;
  } catch (const std::exception& e) {
    StringResponse res = error_response(ApiError(500, fmt::format("internal error: {}", e.what())), req.version(), false);
    conn->write_response(res);
    keep_alive = false;
  }
  conn->finish(keep_alive && !draining.load());
}

// One choice of a whole (non-streamed) response: waits for its channel to end and returns the choice object.
json HttpServer::Impl::collect_choice(Connection& conn, const ApiRequest& api, RequestChannel& channel, int index,
                                      int64_t& completion_tokens) {
  ChoiceParser parsed(api, serve_limits, CallOutput::kWhole);
  OutputText out(codec, api, parsed.keeps_special_tokens());
  std::string text;
  std::string reason;
  for (;;) {
    const ChannelUpdate update = channel.wait(kPoll);
    text += out.push(update);
    if (out.stopped()) {
      channel.cancel(FinishReason::kStop);
      reason = "stop";
      break;
    }
    if (update.finished) {
      // Failed by a scheduler that stops: 503 (unavailable), like a request aborted below.
      if (update.reason == FinishReason::kError) throw ApiError(draining.load() ? 503 : 500, update.error);
      reason = finish_reason_name(update.reason);
      text += out.finish();
      break;
    }
    if (conn.client_gone()) throw ApiError(499, "the client closed the connection");
    if (aborting.load()) {  // the grace period is over
      throw ApiError(503, fmt::format("{}: the request was aborted after the {} s grace period", kShuttingDown,
                                      config.shutdown_timeout_seconds));
    }
  }
  completion_tokens += out.tokens();
  json choice = response_json(api.endpoint, {}, {}, 0, text, reason, {}, api.return_token_ids ? &out.ids() : nullptr)
      ["choices"][0];
  choice["index"] = index;
  if (parsed.active()) {  // content, reasoning_content and tool_calls
    choice["message"] = parsed.message(text);
    choice["finish_reason"] = parsed.finish_reason(reason);
  }
  if (api.logprobs) choice["logprobs"] = logprobs_json(api.endpoint, out.take_logprobs(), 0);
  return choice;
}

void HttpServer::Impl::respond_whole(Connection& conn, const StringRequest& req, const ApiRequest& api,
                                     const Channels& channels, int64_t prompt_tokens) {
  json choices = json::array();
  int64_t completion_tokens = 0;
  try {
    for (size_t i = 0; i < channels.size(); ++i) {
      choices.push_back(collect_choice(conn, api, *channels[i], static_cast<int>(i), completion_tokens));
    }
  } catch (...) {
    for (const auto& ch : channels) ch->cancel();  // nobody will read the rest: free their batch slots now
    throw;
  }
  json body = response_json(api.endpoint, make_id(api.endpoint), serve_limits.model_name,
                            static_cast<int64_t>(std::time(nullptr)), "", "",
                            {prompt_tokens, completion_tokens, channels.front()->cached_tokens()}, nullptr);
  body["choices"] = std::move(choices);
  StringResponse res = json_response(200, body, req.version(), req.keep_alive() && !draining.load());
  conn.write_response(res);
}

void HttpServer::Impl::respond_stream(Connection& conn, const StringRequest& req, const ApiRequest& api,
                                      const Channels& channels, int64_t prompt_tokens) {
  const std::string id = make_id(api.endpoint);
  const auto created = static_cast<int64_t>(std::time(nullptr));
  const std::string& model = serve_limits.model_name;
  auto cancel_all = [&] {
    for (const auto& ch : channels) ch->cancel();
  };
  http::response<http::empty_body> header{http::status::ok, req.version()};
  header.set(http::field::content_type, "text/event-stream");
  header.set(http::field::cache_control, "no-cache");
  header.set(http::field::server, "fp4serve");
  header.keep_alive(req.keep_alive() && !draining.load());  // a drain closes the connection after it
  if (!conn.write_stream_header(header)) {
    cancel_all();
    return;
  }
  // Each choice streams on its own (n > 1: chunks of different choices interleave, told apart by `index`).
  struct Choice {
    std::shared_ptr<RequestChannel> channel;
    ChoiceParser parsed;
    OutputText out;
    bool first = true;
    bool done = false;
    int64_t text_offset = 0;
  };
  std::vector<Choice> choices;
  for (const auto& ch : channels) {
    ChoiceParser parsed(api, serve_limits, CallOutput::kStreamed);
    const bool keep_special = parsed.keeps_special_tokens();
    choices.push_back(Choice{ch, std::move(parsed), OutputText(codec, api, keep_special)});
  }
  auto chunk = [&](Choice& c, int index, std::string piece, const std::optional<std::string>& reason) {
    auto ids = c.out.take_ids();
    json j = chunk_json(api.endpoint, id, model, created, piece, reason, c.first,
                        api.return_token_ids ? &ids : nullptr);
    j["choices"][0]["index"] = index;
    if (c.parsed.active()) {  // the text becomes content / reasoning_content / tool_calls deltas
      json delta = c.parsed.delta(piece);
      if (reason) {
        merge_delta(delta, c.parsed.finish_delta());
        j["choices"][0]["finish_reason"] = c.parsed.finish_reason(*reason);
      }
      if (c.first) delta["role"] = "assistant";
      if (delta.empty() && !reason && ids.empty() && !api.logprobs) return std::string();
      j["choices"][0]["delta"] = delta;
    }
    if (api.logprobs) {
      auto entries = c.out.take_logprobs();
      j["choices"][0]["logprobs"] = logprobs_json(api.endpoint, entries, c.text_offset);
      for (const auto& e : entries) c.text_offset += static_cast<int64_t>(e.token.size());
    }
    c.first = false;
    return sse_event(j);
  };
  for (;;) {
    std::string data;
    bool failed = false;
    bool waited = false;
    for (size_t i = 0; i < choices.size() && !failed; ++i) {
      Choice& c = choices[i];
      if (c.done) continue;
      // One choice: block up to a poll; several: the first unfinished one briefly, the others not at all.
      const auto timeout = choices.size() == 1 ? kPoll : waited ? std::chrono::milliseconds(0) : std::chrono::milliseconds(20);
      waited = true;
      const ChannelUpdate update = c.channel->wait(timeout);
      std::string piece = c.out.push(update);
      bool finished = update.finished;
      std::string reason = finish_reason_name(update.reason);
      if (c.out.stopped()) {
        if (!finished) c.channel->cancel(FinishReason::kStop);
        finished = true;
        reason = "stop";
      }
      if (finished && update.reason == FinishReason::kError && !c.out.stopped()) {
        data += sse_event(ApiError(draining.load() ? 503 : 500, update.error).body());
        failed = true;
      } else if (finished) {
        piece += c.out.finish();
        data += chunk(c, static_cast<int>(i), piece, reason);
      } else if (!piece.empty() || c.out.has_pending()) {
        data += chunk(c, static_cast<int>(i), piece, std::nullopt);
      }
      c.done = finished;
    }
    bool finished = failed || std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.done; });
    if (finished && !failed && api.include_usage) {
      int64_t completion_tokens = 0;
      for (const auto& c : choices) completion_tokens += c.out.tokens();
      data += sse_event(usage_chunk_json(api.endpoint, id, model, created,
                                         {prompt_tokens, completion_tokens, choices.front().channel->cached_tokens()}));
    }
    if (failed) cancel_all();
    if (!finished && aborting.load()) {  // the grace period is over: what was generated, then an error event
      cancel_all();
      data += sse_event(ApiError(503, fmt::format("{}: the request was aborted after the {} s grace period",
                                                  kShuttingDown, config.shutdown_timeout_seconds)).body());
      finished = true;
    }
    if (finished) data += kSseDone;
    if (data.empty() ? conn.client_gone() : !conn.write_stream_data(data)) {
      cancel_all();
      return;
    }
    if (finished) {
      conn.write_stream_end();
      return;
    }
  }
}

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Impl::on_accept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of file descriptors (or another transient failure): retry shortly rather than spin.
    auto timer = std::make_shared<net::steady_timer>(acceptor.get_executor(), std::chrono::milliseconds(50));
    timer->async_wait([this, timer](beast::error_code) {
      if (acceptor.is_open()) accept();
    });
    return;
  }
  {
    beast::error_code addr_ec;
    const auto remote = socket.remote_endpoint(addr_ec);
    const std::string client = addr_ec ? std::string("?") : remote.address().to_string();
    bool over_client = false;
    bool over_total = false;
    std::shared_ptr<Connection> conn;
    {
      std::lock_guard lock(conn_mutex);
      over_total = open_connections >= max_connections;
      over_client = per_client[client] >= config.max_connections_per_client;
      if (!over_total) {
        ++open_connections;
        ++per_client[client];
        conn = std::make_shared<Connection>(*this, std::move(socket), client);
        live[next_id++] = conn;
        if (live.size() > 2 * static_cast<size_t>(open_connections) + 64) std::erase_if(live, [](const auto& kv) { return kv.second.expired(); });
      }
    }
    if (conn == nullptr) {
      beast::error_code ignored;
      socket.close(ignored);  // beyond the file-descriptor budget: no answer is affordable
    } else if (over_client) {
      conn->refuse_now(error_response(ApiError(503, fmt::format("too many connections from {} (at most {})", client,
                                                                config.max_connections_per_client)), 11, false));
    } else {
      conn->start();
    }
  }
  accept();
}

void HttpServer::Impl::wait_idle(std::chrono::steady_clock::duration limit) {
  std::unique_lock lock(active_mutex);
  active_cv.wait_for(lock, limit, [this] { return active == 0; });
}

// Every wait here is bounded, and the I/O threads run until the handlers are gone, so whatever the clients do
// (gone, not reading, half-closed) stop() returns within the grace period + kAbortBound + one poll.
void HttpServer::Impl::shutdown() {
  draining = true;
  net::post(acceptor.get_executor(), [this] {
    beast::error_code ignored;
    acceptor.close(ignored);
  });
  const auto grace = std::chrono::duration<double>(std::max(config.shutdown_timeout_seconds, 0.0));
  wait_idle(std::chrono::duration_cast<std::chrono::steady_clock::duration>(grace));
  aborting = true;  // each running request ends within one poll (kPoll) with an error event or a 503
  wait_idle(kAbortBound);
  // Whoever is still writing writes to a client that does not read: closing the sockets cancels those writes.
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(conn_mutex);
    for (auto& [id, weak] : live) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
    live.clear();
  }
  for (auto& c : open) c->close_from_outside();
  open.clear();
  handlers.join();  // each handler sees its client gone (or its request finished) within one poll
  work.reset();
  io.stop();
}

HttpServer::HttpServer(HttpConfig config, ServeLimits limits, const TextCodec& codec, Scheduler& scheduler,
                       Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(limits), codec, scheduler, metrics)) {
  std::signal(SIGPIPE, SIG_IGN);
  metrics.set_model_name(impl_->serve_limits.model_name);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  const HttpConfig& c = impl_->config;
  beast::error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(c.host, std::to_string(c.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    throw IoError(fmt::format("cannot listen on {}:{}: the address does not resolve ({})", c.host, c.port, ec.message()));
  }
  const tcp::endpoint endpoint = *endpoints.begin();
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (ec == net::error::address_in_use) {
    throw IoError(fmt::format("port {} is in use (another process listens on {}:{}); choose another --port", c.port,
                              c.host, c.port));
  }
  if (!ec) acceptor.listen(kListenBacklog, ec);
  if (ec) throw IoError(fmt::format("cannot listen on {}:{}: {}", c.host, c.port, ec.message()));
  impl_->bound = true;
  return acceptor.local_endpoint().port();
}

void HttpServer::serve() {
  if (!impl_->bound) throw UsageError("HttpServer::serve: call bind() first");
  impl_->accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < std::max(impl_->config.io_threads, 1); ++i) extra.emplace_back([this] { impl_->io.run(); });
  impl_->io.run();
  for (auto& t : extra) t.join();
}

void HttpServer::stop() {
  std::call_once(impl_->stopped, [this] { impl_->shutdown(); });
}

}  // namespace fp4serve::server
