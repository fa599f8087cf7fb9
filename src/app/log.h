// SPDX-License-Identifier: Apache-2.0
// The CLI's log level (--log-level, -q, -v): which of the app's stderr messages are shown. Errors always are.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <optional>
#include <string_view>

namespace fp4serve::app {

enum class LogLevel { Error, Warning, Info, Debug };

/// The level chosen on the command line (default Info).
LogLevel log_level();
void set_log_level(LogLevel level);
/// "error" | "warning" | "info" | "debug" (also "warn", "quiet" = error, "verbose" = debug), case-insensitive.
std::optional<LogLevel> parse_log_level(std::string_view text);

inline bool log_enabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(log_level()); }

template <typename... Args>
void log_warning(fmt::format_string<Args...> f, Args&&... args) {
  if (!log_enabled(LogLevel::Warning)) return;
  fmt::print(stderr, "fp4serve: warning: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (!log_enabled(LogLevel::Info)) return;
  fmt::print(stderr, f, std::forward<Args>(args)...);
}

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (!log_enabled(LogLevel::Debug)) return;
  fmt::print(stderr, f, std::forward<Args>(args)...);
}

}  // namespace fp4serve::app
