// SPDX-License-Identifier: Apache-2.0
// Server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html) as OpenAI streams use them:
// each event is one `data: <json>` line and a blank line; the stream ends with `data: [DONE]`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace fp4serve::server {

/// One event. nlohmann::json::dump() escapes newlines, so the payload fits on one line; invalid UTF-8 in
/// strings is replaced with U+FFFD rather than thrown.
std::string sse_event(const nlohmann::json& payload);

/// The terminator OpenAI streams end with.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

/// Client side: splits a byte stream that arrives in arbitrary pieces into the `data` of complete events
/// (multi-line data joined with '\n', comments and other fields ignored, CRLF accepted).
class SseParser {
 public:
  /// Appends `bytes`; returns the data of every event completed by them, in order.
  std::vector<std::string> push(std::string_view bytes);
  /// Bytes of an unfinished event (a stream that ends with some is truncated).
  size_t pending() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

}  // namespace fp4serve::server
