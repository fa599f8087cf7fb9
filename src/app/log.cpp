// SPDX-License-Identifier: Apache-2.0
#include "app/log.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <string>

#include "core/memory_stats.h"

namespace fp4serve::app {
namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};
}

LogLevel log_level() { return g_level.load(); }
void set_log_level(LogLevel level) { g_level.store(level); }

std::optional<LogLevel> parse_log_level(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "error" || t == "quiet") return LogLevel::Error;
  if (t == "warning" || t == "warn") return LogLevel::Warning;
  if (t == "info") return LogLevel::Info;
  if (t == "debug" || t == "verbose") return LogLevel::Debug;
  return std::nullopt;
}

std::string memory_summary(std::string_view what) {
  const core::ProcessMemory m = core::process_memory();
  const auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (int64_t{1} << 30); };
  return fmt::format("{}: {:.2f} GiB resident ({:.2f} GiB anonymous, {:.2f} GiB mapped files), peak {:.2f} GiB", what,
                     gib(m.rss), gib(m.anon), gib(m.file), gib(m.peak_rss));
}

}  // namespace fp4serve::app
