// SPDX-License-Identifier: Apache-2.0
#include "server/sse.h"

namespace fp4serve::server {

std::string sse_event(const nlohmann::json& payload) {
  return "data: " + payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::vector<std::string> SseParser::push(std::string_view bytes) {
  buffer_.append(bytes);
  std::vector<std::string> events;
  for (;;) {
    // An event ends at the first blank line: "\n\n" (or "\r\n\r\n").
    size_t end = buffer_.find("\n\n");
    size_t sep = 2;
    if (const size_t crlf = buffer_.find("\r\n\r\n"); crlf != std::string::npos && crlf < end) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    const std::string block = buffer_.substr(0, end);
    buffer_.erase(0, end + sep);
    std::string data;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= block.size()) {
      size_t eol = block.find('\n', pos);
      if (eol == std::string::npos) eol = block.size();
      std::string_view line(block.data() + pos, eol - pos);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.rfind("data:", 0) == 0) {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (has_data) data += '\n';
        data.append(line);
        has_data = true;
      }
      pos = eol + 1;
    }
    if (has_data) events.push_back(std::move(data));
  }
  return events;
}

}  // namespace fp4serve::server
