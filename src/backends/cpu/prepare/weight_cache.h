// SPDX-License-Identifier: Apache-2.0
// The CPU's repacked weights kept on disk (`--weight-cache`): the first load of a checkpoint writes every prepared
// linear (prepared_linear.h) to one file, and later loads map that file instead of repacking. Why: a repack writes
// every weight byte into fresh anonymous memory, and the kernel clears each fresh page before the process sees it;
// on a VM that clearing ran at 0.5–1.3 GB/s and was 71% of a warm 3B load. Pages of a mapped file that is in the page
// cache arrive without clearing (2.4 GB mapped in 0.17 s on the same VM), which is how llama.cpp's mmap of its GGUF
// starts fast. The file is rebuilt from the checkpoint whenever anything it depends on changes (the key below).
//
// File layout (little-endian, one file per checkpoint folder and tensor-parallel rank):
//   [0, 32)        header: magic "FP4SWGT1", u64 index offset, u64 index bytes, u64 FNV-1a-64 of the index bytes
//   [4096, index)  the buffers of every layer, each at a 4096-byte boundary; a layer of 2 MiB or more fills whole
//                  2 MiB-aligned pages of the file (huge pages when mapped)
//   [index, end)   the index: JSON {"key": text, "layers": [{fingerprint, the PreparedLinear fields, [offset, bytes]
//                  of codes / scales / offsets / global_scale / bias / k_perm}]}
// A file is written under a temporary name beside its final one, flushed (fdatasync) and renamed into place, so a
// reader sees a whole file or none; a file that fails any check (size, checksum, JSON, key, bounds, buffer sizes
// against the layout) is ignored and rewritten, never trusted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/prepare/prepared_linear.h"
#include "quant/linear_weights.h"

namespace fp4serve::prepare {

/// A layer's name in a weight cache: everything about its checkpoint-order weights but the bytes of its tensors
/// (encoding, block format, convention, K, group size, FP8 block, lm_head requantization, input global scale, and
/// per row block: name, dtypes and shapes of every tensor, global scale, bias). The bytes are covered by the cache's
/// key, which names the checkpoint files' sizes and modification times.
std::string weight_fingerprint(const quant::LinearWeights& w);

/// The file in `dir` of the cache whose `identity` is given (the checkpoint folder and the rank: what one file
/// stays for while its key changes, so that a new build or an edited checkpoint replaces the file, never adds one):
/// `<label's characters in [A-Za-z0-9._-], at most 64>-<FNV-1a-64 of identity, 16 hex digits>.fp4w`.
std::filesystem::path weight_cache_file(const std::filesystem::path& dir, const std::string& identity,
                                        const std::string& label);

/// What a load did with its weight cache, for the caller to show.
struct WeightCacheReport {
  std::filesystem::path file;
  int64_t layers_mapped = 0;    ///< layers taken from the file
  int64_t layers_prepared = 0;  ///< layers repacked from the checkpoint (the file had none for them)
  uint64_t bytes_mapped = 0;    ///< weight bytes of the mapped layers
  bool written = false;         ///< a new file was completed and renamed into place
  uint64_t bytes_written = 0;   ///< its size
  double write_seconds = 0.0;   ///< the time spent writing it (in the buffers' copy, the flush and the rename)
  /// Why the existing file was not used (missing, another key, malformed) — empty when it was; informational.
  std::string not_used;
  /// Why no file was written although layers were prepared (no space, an I/O error) — empty when none failed.
  std::string not_written;
};

/// One load's use of one cache file. Not thread-safe: the layers of a model are uploaded one after another.
class WeightCache {
 public:
  /// Opens `file` and maps it (populated: every page at once) when its header and index are sound and its key
  /// equals `key`; otherwise report().not_used says why and every find() misses. `expected_bytes` estimates the
  /// weights a new file would hold: one is started only with that much space free on its file system, plus 1 GiB.
  /// Never throws for the file's contents or the file system; throws std::bad_alloc.
  WeightCache(std::filesystem::path file, std::string key, uint64_t expected_bytes);
  /// Removes an unfinished temporary file.
  ~WeightCache();
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  /// The layer stored for `weights` (weight_fingerprint), when its shape and layout fit them: N, K, and the layout
  /// their encoding repacks to (block format and group size for FP4). Its buffers view the mapping (read-only; they
  /// keep it alive), its other fields are copies. std::nullopt when the file has none (or a second one is asked for).
  std::optional<PreparedLinear> find(const quant::LinearWeights& weights);
  /// Records the layer this load prepared from `weights`.
  void store(const quant::LinearWeights& weights, const PreparedLinear& w);
  /// The same by fingerprint, without the fit check (tests).
  std::optional<PreparedLinear> find(const std::string& fingerprint);
  /// Records a layer this load prepared. The first store starts a new file (with the layers found so far: a
  /// rewrite keeps them) and every layer after it is appended, found or stored. I/O errors abandon the new file
  /// (report().not_written); the load goes on.
  void store(const std::string& fingerprint, const PreparedLinear& w);
  /// Completes a started file (index, header, flush) and renames it over `file`. Call once, after the last layer.
  WeightCacheReport finish();
  /// What happened so far (not_used is known from the constructor on).
  const WeightCacheReport& report() const { return report_; }

 private:
  struct Mapped;
  struct Writer;
  void start_writer();
  void remove_stale_temporaries() const;
  void append(const std::string& fingerprint, const PreparedLinear& w);
  void abandon(const std::string& why);

  std::filesystem::path file_;
  std::string key_;
  uint64_t expected_bytes_;
  std::shared_ptr<Mapped> mapped_;  // the file read, when it was sound and of this key
  std::vector<size_t> found_;       // its layers handed out, in order (copied into a rewrite)
  std::unique_ptr<Writer> writer_;
  bool finished_ = false;
  WeightCacheReport report_;
};

}  // namespace fp4serve::prepare
