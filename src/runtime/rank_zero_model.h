// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism with rank 0 in charge: rank 0 runs the text side (HTTP, scheduler, tokenizer, sampling) over
// a RankZeroModel; every other rank runs run_follower. Each step rank 0 broadcasts the step plan (cache, slots,
// positions, token ids, which rows want logits) and then every rank runs the same forward over its own shard of
// the model, so the model's collectives (the all-reduces inside the decoder) meet. The logits come back on rank 0
// from its local forward: the model returns the full rows on every rank (a replicated or gathered lm_head).
//
// Protocol, over host memory (dist::Communicator::broadcast from rank 0): one fixed 32-byte header per message,
// then its payload when it has one —
//   make_cache  {cache id, max_seq_len, max_slots} + payload  [num_blocks, block_size, sliding_window] int64: every
//                                                             rank makes its local cache (a mirror of rank 0's)
//   forward     {cache id, chunks, tokens} + payload          [chunks × (slot, all_logits, start_pos, size,
//                                                             first_logit_row, table size)] int64, then Σ size token
//                                                             ids int32, then each chunk's block tables int32
//                                                             (every layer group's, KvCache::block_tables)
// Rank 0's outer cache owns the block pool, the tables and the prefix cache; every rank's local cache (rank 0's
// included) has the same pool size and is assigned the step's tables (KvCache::assign_table) before the forward,
// so all ranks address the same blocks.
//   drop_cache  {cache id}                                    the cache's KvCache was destroyed on rank 0
//   shutdown    {}                                            run_follower returns
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "dist/communicator.h"
#include "model/forward_model.h"

namespace fp4serve::runtime {

/// Called when a forward fails with anything but UsageError (which every rank raises alike, from the same
/// validation before any collective): the ranks may be stuck in different collectives, so the run cannot go
/// on. The default prints nothing and calls Communicator::abort(3); the CLI passes one that prints the error
/// first.
using FatalHandler = std::function<void(const std::exception&)>;

/// A ForwardModel on rank 0 that broadcasts every call to the followers before running `local` (this rank's
/// shard). `comm` must outlive this object; rank() must be 0. Caches it makes (make_cache) hold the local cache
/// and tell the followers to drop theirs when destroyed. The destructor (or shutdown()) ends the followers' loop;
/// after it, forward and make_cache throw UsageError. With a size-1 communicator it only forwards to `local`.
class RankZeroModel final : public model::ForwardModel {
 public:
  RankZeroModel(const model::ForwardModel& local, dist::Communicator& comm, FatalHandler on_fatal = {});
  ~RankZeroModel() override;
  RankZeroModel(const RankZeroModel&) = delete;
  RankZeroModel& operator=(const RankZeroModel&) = delete;

  const model::ModelConfig& config() const override { return local_.config(); }
  using model::ForwardModel::make_cache;
  model::KvCache make_cache(const model::KvCacheSpec& spec) const override;
  /// Broadcasts the plan, then runs the local forward; returns its logits [rows, vocab] fp32. Throws UsageError
  /// for a cache not made by this object, or as the local model does (every rank throws alike).
  std::vector<float> forward(std::span<const model::SequenceChunk> batch, model::KvCache& cache) const override;

  /// Tells the followers to return from run_follower; idempotent.
  void shutdown();

  struct State;  // shared with the caches it made (they may outlive it)

 private:
  const model::ForwardModel& local_;
  std::shared_ptr<State> state_;
};

/// What a follower rank was asked, for tests and logs: counts of each message.
struct FollowerStats {
  int64_t caches_made = 0;
  int64_t caches_dropped = 0;
  int64_t forwards = 0;
  int64_t usage_errors = 0;  ///< forwards that failed validation on this rank (rank 0 reported the same)
};

/// Non-zero ranks: runs rank 0's calls on `local` (this rank's shard) until rank 0 shuts down, then returns. A
/// forward's logits are dropped here; a UsageError from it is counted and the loop goes on (rank 0 raised the
/// same); any other failure goes to `on_fatal` (default: comm.abort(3)). Throws UsageError when comm.rank() is 0,
/// FormatError for a message this build does not know (ranks running different builds).
FollowerStats run_follower(const model::ForwardModel& local, dist::Communicator& comm, FatalHandler on_fatal = {});

}  // namespace fp4serve::runtime
