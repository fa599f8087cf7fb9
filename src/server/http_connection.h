// SPDX-License-Identifier: Apache-2.0
// One client connection of the HTTP server (Boost.Beast): reads requests asynchronously under header and body
// deadlines on its strand, refuses requests before their body when the headers decide it (then drains and
// closes, so the body is never parsed as a request), and answers in order. Requests that need a handler thread
// are passed to `Routes::dispatch`; that thread writes through the blocking helpers below, which run the writes
// on the strand under the write deadline, and ends with `finish`.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace fp4serve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

using StringRequest = http::request<http::string_body>;

inline std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }
using StringResponse = http::response<http::string_body>;

class Connection;

/// What a connection needs from the server: the checks made on the headers alone, and the requests.
class Routes {
 public:
  virtual ~Routes() = default;
  struct Limits {
    size_t max_body_bytes;
    std::chrono::seconds header_timeout, io_timeout;
  };
  virtual const Limits& limits() const = 0;
  /// A response when the headers already decide the request (auth, size, encoding, unknown route), else none.
  virtual std::optional<StringResponse> check_headers(const http::request_header<>& header) = 0;
  /// Answers a complete request: either calls `conn.respond` on the strand, or hands the request to a handler
  /// thread that writes with the blocking helpers and then calls `conn.finish`.
  virtual void dispatch(std::shared_ptr<Connection> conn, StringRequest request) = 0;
  /// Called once per response status (metrics), on any thread.
  virtual void responded(const std::string& target, int status) = 0;
  /// The connection is gone (its destructor).
  virtual void released(const std::string& client) = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Routes& routes, tcp::socket socket, std::string client);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Starts reading requests (call on no strand; it posts).
  void start();
  /// Answers `response` with `Connection: close` without reading a request, then drains and closes (used for
  /// connections over the per-client limit).
  void refuse_now(StringResponse response);
  /// Closes the socket from any thread (server shutdown); handlers see client_gone() and write failures.
  void close_from_outside();

  // On the strand (from Routes::dispatch called on it).
  void respond(StringResponse response);

  // From a handler thread, in order, never concurrently for one connection.
  /// Writes a complete response; false when the client is gone or the write deadline passed.
  bool write_response(StringResponse& response);
  /// Starts a streamed response: `chunked` for HTTP/1.1, raw bytes until close for HTTP/1.0.
  bool write_stream_header(http::response<http::empty_body>& header);
  bool write_stream_data(const std::string& data);
  bool write_stream_end();
  /// True when the peer closed its socket (or the server closed it): its request should be cancelled.
  bool client_gone();
  /// Ends a dispatched request: reads the next one when `keep_alive`, else closes.
  void finish(bool keep_alive);

  std::chrono::steady_clock::time_point request_started() const { return request_started_; }

 private:
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_request(beast::error_code ec);
  void after_write(bool keep_alive, beast::error_code ec);
  void refuse(StringResponse response);
  void refuse_oversized();
  void linger();
  void drain(size_t budget);
  void close_socket();
  template <class Start>
  bool blocking(std::shared_ptr<const void> keep, Start start);

  Routes& routes_;
  beast::tcp_stream stream_;
  std::string client_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<StringResponse> pending_;      // the response being written by respond()/refuse()
  std::string target_;                           // of the request being answered (metrics)
  std::array<char, 4096> drain_{};
  bool stream_chunked_ = false;
  std::shared_ptr<http::response<http::empty_body>> stream_header_;  // of the stream being written (strand)
  std::optional<http::response_serializer<http::empty_body>> stream_serializer_;
  std::mutex fd_mutex_;                          // closed_ vs. the handler's peek at the socket
  bool closed_ = false;
  std::chrono::steady_clock::time_point request_started_{};
};

}  // namespace fp4serve::server
