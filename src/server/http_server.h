// SPDX-License-Identifier: Apache-2.0
// The HTTP transport of the OpenAI-compatible server (Boost.Beast over Boost.Asio). Connections are read
// asynchronously on a few I/O threads, so slow or idle clients hold no thread; a complete generation request is
// handed to a handler thread, which parses and tokenizes it, gives the sequence to the Scheduler and waits on its
// RequestChannel; handlers never touch the model.
//
// Transport rules (issue 19): the request line and headers must arrive within header_timeout_seconds of the
// connection's previous request (or its opening), the body within io_timeout_seconds; a request refused before
// its body is read (wrong API key, a body over max_body_bytes, a Content-Encoding other than identity → 415)
// is answered with `Connection: close` and its connection is drained and closed, so its body is never parsed as
// a request; pipelined requests are answered in order; HTTP/1.0 clients get no chunked encoding (a stream ends
// with the connection); a client that closes its socket cancels its request, streamed or not; one client
// address holds at most max_connections_per_client connections (more get 503).
//
// Endpoints: GET /health, GET /metrics (Prometheus text), GET /v1/models, GET /v1/models/{id} (404
// model_not_found for another id), POST /v1/completions, POST /v1/chat/completions, POST /tokenize,
// POST /detokenize. Only /v1/* requires the API key when one is set.
//
// Shutdown (stop(), on SIGTERM): the listener closes; requests already running may finish within
// shutdown_timeout_seconds; then each is aborted with a proper ending (a stream: an error event and
// `data: [DONE]`; otherwise a 503 JSON error), and after a further bound every socket is closed. The I/O threads
// run until every handler has returned, so no handler waits on a write that cannot complete.
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
  size_t max_body_bytes = size_t{1} << 20; ///< larger bodies get 400 (chunked bodies: counted decoded)
  int threads = 64;                        ///< handler threads: every streaming or queued request holds one
  int io_timeout_seconds = 30;             ///< reading a body; writing one response part
  int header_timeout_seconds = 10;         ///< request line + headers, from the end of the previous request
  int max_connections_per_client = 256;    ///< open connections per client address
  int max_connections = 4096;              ///< in all (also bounded by the process's file-descriptor limit)
  int io_threads = 2;                      ///< threads reading and writing sockets
  /// stop(): how long running requests may take to finish before they are aborted (--shutdown-timeout).
  double shutdown_timeout_seconds = 5.0;
};

class HttpServer {
 public:
  /// `codec`, `scheduler` and `metrics` must outlive the server. Ignores SIGPIPE process-wide: a client that
  /// disconnects mid-stream must make a write fail, not end the process.
  HttpServer(HttpConfig config, ServeLimits limits, const TextCodec& codec, Scheduler& scheduler, Metrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds the listening socket (SO_REUSEADDR, never SO_REUSEPORT: two servers must not share a port) and
  /// returns its port. Throws IoError "port N is in use" when another socket listens there, IoError naming
  /// host:port for other failures.
  int bind();
  /// Accepts and serves connections until stop(); call bind() first.
  void serve();
  /// Drains (see the top of this file): closes the listener, answers new requests 503, waits up to
  /// shutdown_timeout_seconds for running ones, aborts the rest, closes every connection, waits for the handlers
  /// and makes serve() return. Returns within the grace period + about 1.2 s whatever the clients do. Call it
  /// before Scheduler::stop() so that running requests can finish. Safe from any thread but an I/O thread;
  /// idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4serve::server
