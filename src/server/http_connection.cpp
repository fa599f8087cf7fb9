// SPDX-License-Identifier: Apache-2.0
#include "server/http_connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <future>

namespace fp4serve::server {
namespace {

constexpr size_t kHeaderLimit = 16 * 1024;
// A refused request's body is read and dropped for this long (and up to max_body_bytes + this slack), so that
// the client receives the answer rather than a reset; then the connection closes.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr size_t kLingerSlack = 64 * 1024;
// A handler waits for its write at most this long beyond the write deadline; the deadline (or a close) ends the
// write first whenever the I/O threads run, so this only bounds a wait that nothing else would end.
constexpr auto kWriteWaitSlack = std::chrono::seconds(2);

}  // namespace

Connection::Connection(Routes& routes, tcp::socket socket, std::string client)
    : routes_(routes), stream_(std::move(socket)), client_(std::move(client)) {}

Connection::~Connection() { routes_.released(client_); }

void Connection::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void Connection::refuse_now(StringResponse response) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), r = std::move(response)]() mutable {
    self->refuse(std::move(r));
  });
}

void Connection::close_from_outside() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_socket(); });
}

void Connection::close_socket() {
  std::lock_guard lock(fd_mutex_);
  if (closed_) return;
  closed_ = true;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

void Connection::read_header() {
  {
    std::lock_guard lock(fd_mutex_);
    if (closed_) return;
  }
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(routes_.limits().max_body_bytes);
  // One deadline for the idle wait and the whole header: a client trickling header lines is cut off.
  stream_.expires_after(routes_.limits().header_timeout);
  http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->on_header(ec);
  });
}

void Connection::on_header(beast::error_code ec) {
  if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
      ec == net::error::connection_reset || ec == net::error::eof) {
    close_socket();
    return;
  }
  request_started_ = std::chrono::steady_clock::now();
  target_ = std::string(parser_->get().target());  // empty when the request line itself was malformed
  if (ec == http::error::body_limit) {  // the parser checks Content-Length against the limit with the headers
    refuse_oversized();
    return;
  }
  if (ec) {
    StringResponse bad{http::status::bad_request, 11};
    bad.set(http::field::content_type, "application/json");
    bad.body() = ec == http::error::header_limit
                     ? R"({"error":{"message":"the request headers exceed 16 KiB","type":"invalid_request_error","param":null,"code":null}})"
                     : R"({"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}})";
    refuse(std::move(bad));
    return;
  }
  const auto& header = parser_->get();
  if (auto early = routes_.check_headers(header)) {
    refuse(std::move(*early));
    return;
  }
  if (beast::iequals(header[http::field::expect], "100-continue")) {
    auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, header.version());
    http::async_write(stream_, *cont, [self = shared_from_this(), cont](beast::error_code wec, size_t) {
      if (wec) {
        self->close_socket();
        return;
      }
      self->read_body();
    });
    return;
  }
  read_body();
}

void Connection::read_body() {
  stream_.expires_after(routes_.limits().io_timeout);
  http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->on_request(ec);
  });
}

void Connection::on_request(beast::error_code ec) {
  if (ec == http::error::body_limit) {  // a chunked body that grew past the limit
    refuse_oversized();
    return;
  }
  if (ec) {
    close_socket();
    return;
  }
  stream_.expires_never();
  routes_.dispatch(shared_from_this(), parser_->release());
}

void Connection::refuse_oversized() {
  StringResponse big{http::status::bad_request, parser_->get().version() == 10 ? 10u : 11u};
  big.set(http::field::content_type, "application/json");
  big.body() = "{\"error\":{\"message\":\"the request body exceeds " + std::to_string(routes_.limits().max_body_bytes) +
               " bytes\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}";
  refuse(std::move(big));
}

void Connection::respond(StringResponse response) {
  response.prepare_payload();
  routes_.responded(target_, response.result_int());
  pending_ = std::make_shared<StringResponse>(std::move(response));
  const bool keep_alive = pending_->keep_alive();
  stream_.expires_after(routes_.limits().io_timeout);
  http::async_write(stream_, *pending_, [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
    self->after_write(keep_alive, ec);
  });
}

void Connection::after_write(bool keep_alive, beast::error_code ec) {
  pending_.reset();
  if (ec) {
    close_socket();
  } else if (keep_alive) {
    read_header();
  } else {
    linger();
  }
}

void Connection::refuse(StringResponse response) {
  response.keep_alive(false);
  response.prepare_payload();
  routes_.responded(target_, response.result_int());
  pending_ = std::make_shared<StringResponse>(std::move(response));
  stream_.expires_after(routes_.limits().io_timeout);
  http::async_write(stream_, *pending_, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->pending_.reset();
    if (ec) {
      self->close_socket();
    } else {
      self->linger();
    }
  });
}

// Half-closes, then reads and drops what the client still sends (a refused body) until it closes, the
// deadline passes or the byte budget is spent: nothing read here is ever parsed.
void Connection::linger() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_after(kLinger);
  drain(routes_.limits().max_body_bytes + kLingerSlack);
}

void Connection::drain(size_t budget) {
  stream_.async_read_some(net::buffer(drain_), [self = shared_from_this(), budget](beast::error_code ec, size_t n) {
    if (ec || n >= budget) {
      self->close_socket();
      return;
    }
    self->drain(budget - n);
  });
}

// Runs `start(done)` on the strand under the write deadline and waits for `done(ec)`. The deadline bounds the
// wait: the stream cancels the operation when it passes, and close_socket() cancels it at shutdown. `keep` owns
// what the write reads until it completes, so a handler that stops waiting (kWriteWaitSlack) leaves no
// operation reading its stack.
template <class Start>
bool Connection::blocking(std::shared_ptr<const void> keep, Start start) {
  {
    std::lock_guard lock(fd_mutex_);
    if (closed_) return false;
  }
  auto done = std::make_shared<std::promise<beast::error_code>>();
  auto result = done->get_future();
  net::post(stream_.get_executor(), [self = shared_from_this(), done, start, keep]() mutable {
    if (self->closed_) {
      done->set_value(net::error::operation_aborted);
      return;
    }
    self->stream_.expires_after(self->routes_.limits().io_timeout);
    start([done, keep](beast::error_code ec, size_t) { done->set_value(ec); });
  });
  if (result.wait_for(routes_.limits().io_timeout + kWriteWaitSlack) != std::future_status::ready) {
    close_from_outside();
    return false;
  }
  return !result.get();
}

bool Connection::write_response(StringResponse& response) {
  response.prepare_payload();
  routes_.responded(target_, response.result_int());
  auto owned = std::make_shared<StringResponse>(std::move(response));
  return blocking(owned, [this, owned](auto handler) { http::async_write(stream_, *owned, std::move(handler)); });
}

bool Connection::write_stream_header(http::response<http::empty_body>& header) {
  stream_chunked_ = header.version() >= 11;
  if (stream_chunked_) {
    header.chunked(true);
  } else {
    header.keep_alive(false);  // HTTP/1.0: the body ends when the connection does
  }
  routes_.responded(target_, header.result_int());
  auto owned = std::make_shared<http::response<http::empty_body>>(std::move(header));
  return blocking(owned, [this, owned](auto handler) {
    stream_header_ = owned;  // the serializer refers to it until finish()
    stream_serializer_.emplace(*stream_header_);
    http::async_write_header(stream_, *stream_serializer_, std::move(handler));
  });
}

bool Connection::write_stream_data(const std::string& data) {
  if (data.empty()) return true;
  auto owned = std::make_shared<const std::string>(data);
  return blocking(owned, [this, owned](auto handler) {
    if (stream_chunked_) {
      net::async_write(stream_, http::make_chunk(net::buffer(*owned)), std::move(handler));
    } else {
      net::async_write(stream_, net::buffer(*owned), std::move(handler));
    }
  });
}

bool Connection::write_stream_end() {
  if (!stream_chunked_) return true;
  return blocking(nullptr, [this](auto handler) { net::async_write(stream_, http::make_chunk_last(), std::move(handler)); });
}

bool Connection::client_gone() {
  std::lock_guard lock(fd_mutex_);
  if (closed_) return true;
  // A peek sees the peer's FIN (0) or a reset without consuming pipelined bytes of a next request.
  char byte = 0;
  const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void Connection::finish(bool keep_alive) {
  net::post(stream_.get_executor(), [self = shared_from_this(), keep_alive] {
    self->stream_serializer_.reset();
    self->stream_header_.reset();
    if (self->closed_) return;
    if (keep_alive) {
      self->read_header();
    } else {
      self->linger();
    }
  });
}

}  // namespace fp4serve::server
