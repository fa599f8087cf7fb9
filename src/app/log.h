// SPDX-License-Identifier: Apache-2.0
// The CLI's log level (--log-level, -q, -v): which of the app's stderr messages are shown. Errors always are.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <optional>
#include <string>
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

/// "<what>: 3.21 GiB resident (2.90 GiB anonymous, 0.31 GiB mapped files), peak 3.40 GiB": the process's memory
/// now (core::process_memory), for the start-up and exit lines of serve and bench model's report.
std::string memory_summary(std::string_view what);

}  // namespace fp4serve::app
