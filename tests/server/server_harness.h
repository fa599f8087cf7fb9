// SPDX-License-Identifier: Apache-2.0
// A real HttpServer on 127.0.0.1 (any free port) over a StepModel and TextCodec, plus a small bounded client.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/http_server.h"
#include "server/scheduler.h"
#include "server/sse.h"

namespace fp4serve::server::testing {

struct ServerSetup {
  SchedulerConfig scheduler{.max_num_seqs = 16, .max_num_batched_tokens = 64, .max_queue = 32};
  HttpConfig http{.host = "127.0.0.1", .port = 0, .api_key = {}, .max_body_bytes = 64 * 1024, .threads = 48,
                  .io_timeout_seconds = 10};
  int64_t context_length = 256;
  std::shared_ptr<const runtime::GrammarCompiler> grammars = nullptr;  ///< structured outputs; null: refused (400)
  std::optional<ToolParser> tool_parser = std::nullopt;        ///< tool_choice auto's parser
  std::optional<ReasoningParser> reasoning_parser = std::nullopt;
};

class RunningServer {
 public:
  RunningServer(StepModel& model, const TextCodec& codec, const ServerSetup& setup, const std::string& name = "test-model")
      : scheduler_(model, setup.scheduler, metrics_) {
    runtime::SamplingParams defaults;
    defaults.temperature = 0.0f;
    http_ = std::make_unique<HttpServer>(setup.http, ServeLimits{name, setup.context_length, defaults, std::nullopt, setup.grammars,
                                                                    setup.tool_parser, setup.reasoning_parser}, codec,
                                         scheduler_, metrics_);
    port_ = http_->bind();
    scheduler_.start();
    thread_ = std::thread([this] { http_->serve(); });
  }
  ~RunningServer() {
    scheduler_.stop();
    http_->stop();
    thread_.join();
  }
  int port() const { return port_; }
  Metrics& metrics() { return metrics_; }

  std::unique_ptr<httplib::Client> client() const {
    auto cli = std::make_unique<httplib::Client>("127.0.0.1", port_);
    cli->set_connection_timeout(5);
    cli->set_read_timeout(20);
    cli->set_write_timeout(5);
    return cli;
  }

 private:
  Metrics metrics_;
  Scheduler scheduler_;
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

/// POSTs `body` as JSON; `status` gets the HTTP status (−1 on a transport error). The parsed body, or a discarded
/// value when it is not JSON.
inline nlohmann::json post_json(httplib::Client& cli, const std::string& path, const nlohmann::json& body, int* status) {
  auto r = cli.Post(path, body.dump(), "application/json");
  *status = r ? r->status : -1;
  return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
}

struct StreamResult {
  int status = 0;
  bool done = false;                   ///< saw data: [DONE]
  std::vector<nlohmann::json> chunks;  ///< parsed events before [DONE]
  std::string raw;                     ///< the whole body as received
  std::string error;                   ///< transport error, if any
};

/// POSTs `body` and reads the event stream; `keep_going(chunk_count)` returning false disconnects.
inline StreamResult post_stream(httplib::Client& cli, const std::string& path, const nlohmann::json& body,
                                const std::function<bool(size_t)>& keep_going = nullptr) {
  StreamResult out;
  SseParser parser;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    out.raw.append(data, len);
    for (auto& ev : parser.push(std::string_view(data, len))) {
      if (ev == "[DONE]") {
        out.done = true;
      } else {
        out.chunks.push_back(nlohmann::json::parse(ev, nullptr, false));
      }
    }
    return !keep_going || keep_going(out.chunks.size());
  };
  const auto res = cli.send(req);
  if (!res) out.error = httplib::to_string(res.error());
  return out;
}

/// Polls `pred` every 20 ms for up to `limit`.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace fp4serve::server::testing
