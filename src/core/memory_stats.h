// SPDX-License-Identifier: Apache-2.0
// What the process and the machine hold in memory, as Linux reports it (/proc/self/status, /proc/meminfo): for
// the peak RSS that `bench model` and `serve` print, and for a KV budget given as a fraction of memory.
#pragma once

#include <cstdint>
#include <string_view>

namespace fp4serve::core {

/// This process's memory in bytes (/proc/self/status); every field 0 where the system does not report it.
struct ProcessMemory {
  int64_t rss = 0;       ///< VmRSS: resident now
  int64_t peak_rss = 0;  ///< VmHWM: the largest VmRSS so far
  int64_t anon = 0;      ///< RssAnon: resident anonymous memory (the heap, weights repacked into the engine's layout)
  int64_t file = 0;      ///< RssFile: resident pages of mapped files (the checkpoint's shards)
};
ProcessMemory process_memory();
/// Resets the peak (VmHWM) to the resident memory now (writes 5 to /proc/self/clear_refs), so that the next peak
/// is of what runs after the call, e.g. one model's load and run in `bench model`. Returns false where the
/// system does not allow it (the peak then stays the process's).
bool reset_peak_rss();

/// The machine's memory in bytes (/proc/meminfo MemTotal, MemAvailable); 0 where not reported.
struct SystemMemory {
  int64_t total = 0;
  int64_t available = 0;
};
SystemMemory system_memory();

/// The value in bytes of field `key` (e.g. "VmHWM") in text laid out as /proc/self/status and /proc/meminfo
/// ("Key:   123 kB" lines); 0 when absent. Exposed for tests.
int64_t proc_field_bytes(std::string_view text, std::string_view key);

}  // namespace fp4serve::core
