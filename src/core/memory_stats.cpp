// SPDX-License-Identifier: Apache-2.0
#include "core/memory_stats.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace fp4serve::core {
namespace {

std::string read_all(const char* path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int64_t proc_field_bytes(std::string_view text, std::string_view key) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') continue;
    const size_t digits = line.find_first_of("0123456789", key.size());
    if (digits == std::string_view::npos) return 0;
    int64_t value = 0;
    const auto [rest, ec] = std::from_chars(line.data() + digits, line.data() + line.size(), value);
    if (ec != std::errc()) return 0;
    // The kernel writes these in kB (KiB); a field without a unit is a count.
    const std::string_view unit = line.substr(static_cast<size_t>(rest - line.data()));
    return unit.find("kB") != std::string_view::npos ? value * 1024 : value;
  }
  return 0;
}

ProcessMemory process_memory() {
  const std::string status = read_all("/proc/self/status");
  return ProcessMemory{proc_field_bytes(status, "VmRSS"), proc_field_bytes(status, "VmHWM"),
                       proc_field_bytes(status, "RssAnon"), proc_field_bytes(status, "RssFile")};
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

SystemMemory system_memory() {
  const std::string meminfo = read_all("/proc/meminfo");
  return SystemMemory{proc_field_bytes(meminfo, "MemTotal"), proc_field_bytes(meminfo, "MemAvailable")};
}

}  // namespace fp4serve::core
