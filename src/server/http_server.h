// SPDX-License-Identifier: Apache-2.0
// The HTTP transport of the OpenAI-compatible server (cpp-httplib): routes, API-key check, body-size limit,
// JSON and server-sent-event responses, request counting. Handlers parse and tokenize on their own thread, hand
// the sequence to the Scheduler, and wait on its RequestChannel; they never touch the model.
//
// Endpoints: GET /health, GET /metrics (Prometheus text), GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions. Only /v1/* requires the API key when one is set.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/scheduler.h"
#include "server/text_codec.h"

namespace fp4serve::server {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                         ///< 0: any free port (bind() returns it)
  std::string api_key;                     ///< empty: no authentication
  size_t max_body_bytes = size_t{1} << 20; ///< larger bodies get 400
  int threads = 64;                        ///< handler threads: every streaming or queued request holds one
  int io_timeout_seconds = 30;             ///< socket read/write timeout (slow or stuck clients)
};

class HttpServer {
 public:
  /// `codec`, `scheduler` and `metrics` must outlive the server. Ignores SIGPIPE process-wide: a client that
  /// disconnects mid-stream must make a write fail, not end the process.
  HttpServer(HttpConfig config, ServeLimits limits, const TextCodec& codec, Scheduler& scheduler, Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds the listening socket and returns its port. Throws IoError naming host:port when binding fails.
  int bind();
  /// Accepts and serves connections until stop(); call bind() first.
  void serve();
  /// Makes serve() return; safe from any thread, idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4serve::server
