// SPDX-License-Identifier: Apache-2.0
// A raw TCP client for the transport tests: sends exact bytes (split across segments, pipelined, half a header)
// and reads what comes back until the server closes or a deadline passes, so framing bugs are visible.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fp4serve::server::testing {

class RawConnection {
 public:
  /// `receive_buffer` > 0: SO_RCVBUF before connecting, so that a client that does not read stalls the server's
  /// writes early.
  explicit RawConnection(int port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket() failed");
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // each send() is its own segment
    if (receive_buffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      throw std::runtime_error("connect() failed");
    }
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  /// False when the peer has gone (EPIPE / ECONNRESET).
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  /// Reads until the server closes (then closed() is true) or `limit` passes; returns the bytes read.
  std::string read_until_close(std::chrono::milliseconds limit) {
    return read_while([](const std::string&) { return true; }, limit);
  }

  /// Reads until `pred(received)` is false, the server closes, or `limit` passes.
  template <class Pred>
  std::string read_while(Pred pred, std::chrono::milliseconds limit) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (pred(out)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  /// Reads at most `chunk` bytes every `pause` until the server closes or `limit` passes: a slow reader.
  std::string read_slowly(size_t chunk, std::chrono::milliseconds pause, std::chrono::milliseconds limit) {
    std::string out;
    std::string buf(chunk, '\0');
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf.data(), chunk, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf.data(), static_cast<size_t>(n));
      ::usleep(static_cast<useconds_t>(std::chrono::microseconds(pause).count()));
    }
    return out;
  }

  /// Half-closes: the server sees the end of the request stream, the client still reads.
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  bool closed() const { return closed_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool closed_ = false;
};

/// Occurrences of `needle` in `hay`.
inline size_t count_of(const std::string& hay, std::string_view needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

}  // namespace fp4serve::server::testing
