// SPDX-License-Identifier: Apache-2.0
#include "runtime/rank_zero_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "fp4serve/error.h"

namespace fp4serve::runtime {
namespace {

enum class Kind : uint32_t { kMakeCache = 1, kForward = 2, kDropCache = 3, kShutdown = 4 };

struct Header {
  uint32_t kind = 0;
  uint32_t cache_id = 0;
  int64_t a = 0;  // make_cache: max_seq_len; forward: chunks
  int64_t b = 0;  // make_cache: max_slots; forward: tokens (then as many block-table entries as the chunks list)
  int64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 32);

// slot, all_logits, start_pos, size, first_logit_row, block table entries (int64 each)
constexpr size_t kChunkFields = 6;
// make_cache payload: num_blocks, block_size, sliding_window (int64 each)
constexpr size_t kCacheFields = 3;

[[noreturn]] void fatal(const FatalHandler& on_fatal, dist::Communicator& comm, const std::exception& e) {
  if (on_fatal) on_fatal(e);
  comm.abort(3);
  std::_Exit(3);  // abort does not return; this keeps fatal's [[noreturn]] provable
}

}  // namespace

struct RankZeroModel::State {
  dist::Communicator* comm = nullptr;
  FatalHandler on_fatal;
  bool open = true;
  uint32_t next_cache_id = 1;

  bool distributed() const { return comm->size() > 1; }
  void send(const Header& h, const void* payload = nullptr) {
    Header copy = h;
    comm->broadcast(&copy, sizeof(copy), 0);
    if (h.payload_bytes > 0) comm->broadcast(const_cast<void*>(payload), static_cast<size_t>(h.payload_bytes), 0);
  }
};

namespace {

// The KvCache rank 0's callers hold: the block tables and prefix cache they use outside, this rank's real cache
// inside (a mirror: its tables are assigned from the outer one every step, as on every follower), and the id the
// followers know their copy by.
class RankZeroCache final : public model::KvStorage {
 public:
  RankZeroCache(std::shared_ptr<RankZeroModel::State> owner, uint32_t cache_id, model::KvCache local_cache)
      : state(std::move(owner)), id(cache_id), local(std::move(local_cache)) {}
  ~RankZeroCache() override {
    if (!state->open || !state->distributed()) return;
    try {
      Header h;
      h.kind = static_cast<uint32_t>(Kind::kDropCache);
      h.cache_id = id;
      state->send(h);
    } catch (const std::exception& e) {
      fatal(state->on_fatal, *state->comm, e);
    }
  }
  RankZeroCache(const RankZeroCache&) = delete;
  RankZeroCache& operator=(const RankZeroCache&) = delete;

  std::shared_ptr<RankZeroModel::State> state;
  uint32_t id;
  model::KvCache local;
};

}  // namespace

RankZeroModel::RankZeroModel(const model::ForwardModel& local, dist::Communicator& comm, FatalHandler on_fatal)
    : local_(local), state_(std::make_shared<State>()) {
  if (comm.rank() != 0) {
    throw UsageError(fmt::format("RankZeroModel runs on rank 0 only; rank {} runs run_follower", comm.rank()));
  }
  state_->comm = &comm;
  state_->on_fatal = std::move(on_fatal);
}

RankZeroModel::~RankZeroModel() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    fatal(state_->on_fatal, *state_->comm, e);
  }
}

void RankZeroModel::shutdown() {
  if (!state_->open) return;
  state_->open = false;
  if (!state_->distributed()) return;
  Header h;
  h.kind = static_cast<uint32_t>(Kind::kShutdown);
  state_->send(h);
}

model::KvCache RankZeroModel::make_cache(const model::KvCacheSpec& spec) const {
  if (!state_->open) throw UsageError("RankZeroModel::make_cache after shutdown: the followers have stopped");
  const uint32_t id = state_->next_cache_id++;
  if (state_->distributed()) {
    Header h;
    h.kind = static_cast<uint32_t>(Kind::kMakeCache);
    h.cache_id = id;
    h.a = spec.max_seq_len;
    h.b = spec.max_slots;
    const std::array<int64_t, kCacheFields> fields{spec.num_blocks, spec.block_size, spec.sliding_window};
    h.payload_bytes = static_cast<int64_t>(sizeof(fields));
    state_->send(h, fields.data());
  }
  model::KvCache local = local_.make_cache(spec);
  const int64_t layers = local.num_layers(), kv_heads = local.num_kv_heads(), head_dim = local.head_dim();
  const model::KvCacheDtype element = local.element();
  const model::KvCacheSpec resolved = local.spec();  // the local model's sliding window included
  // The outer cache keeps the block tables (its storage is the wrapper), with the local sizes.
  return model::KvCache(layers, kv_heads, head_dim, resolved,
                        std::make_unique<RankZeroCache>(state_, id, std::move(local)), element);
}

std::vector<float> RankZeroModel::forward(std::span<const model::SequenceChunk> batch, model::KvCache& cache) const {
  auto* rc = dynamic_cast<RankZeroCache*>(cache.storage());
  if (rc == nullptr || rc->state != state_) {
    throw UsageError("RankZeroModel::forward: the cache was not made by this model's make_cache");
  }
  if (!state_->open) throw UsageError("RankZeroModel::forward after shutdown: the followers have stopped");
  for (const auto& c : batch) {
    if (c.slot < 0 || c.slot >= rc->local.max_slots()) {
      throw UsageError(fmt::format("RankZeroModel::forward: slot {} is outside the cache's [0, {})", c.slot,
                                   rc->local.max_slots()));
    }
  }
  // Rank 0's outer cache decides the blocks (a pool without them fails here, before any message); every rank's
  // local cache then runs on a copy of its tables.
  for (const auto& c : batch) {
    if (c.tokens.empty() || c.start_pos < 0 || c.start_pos + static_cast<int64_t>(c.tokens.size()) > cache.max_seq_len()) {
      break;  // the local forward refuses it on every rank alike
    }
    cache.acquire(c.slot);
    cache.prepare(c.slot, c.start_pos, static_cast<int64_t>(c.tokens.size()));
  }
  // Each chunk's tables, every layer group's one after another (KvCache::block_tables).
  std::vector<std::vector<int32_t>> tables;
  for (const auto& c : batch) tables.push_back(cache.in_use(c.slot) ? cache.block_tables(c.slot) : std::vector<int32_t>{});
  const auto table_of = [&](size_t chunk) { return std::span<const int32_t>(tables[chunk]); };
  if (state_->distributed()) {
    size_t tokens = 0, entries = 0;
    for (const auto& c : batch) tokens += c.tokens.size();
    std::vector<int64_t> chunks;
    chunks.reserve(batch.size() * kChunkFields);
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& c = batch[i];
      const auto table = static_cast<int64_t>(table_of(i).size());
      entries += static_cast<size_t>(table);
      chunks.insert(chunks.end(), {c.slot, c.all_logits ? 1 : 0, c.start_pos, static_cast<int64_t>(c.tokens.size()),
                                   c.first_logit_row, table});
    }
    std::vector<unsigned char> payload(chunks.size() * sizeof(int64_t) + (tokens + entries) * sizeof(int32_t));
    std::memcpy(payload.data(), chunks.data(), chunks.size() * sizeof(int64_t));
    size_t at = chunks.size() * sizeof(int64_t);
    for (const auto& c : batch) {
      std::memcpy(payload.data() + at, c.tokens.data(), c.tokens.size_bytes());
      at += c.tokens.size_bytes();
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::span<const int32_t> table = table_of(i);
      std::memcpy(payload.data() + at, table.data(), table.size_bytes());
      at += table.size_bytes();
    }
    Header h;
    h.kind = static_cast<uint32_t>(Kind::kForward);
    h.cache_id = rc->id;
    h.a = static_cast<int64_t>(batch.size());
    h.b = static_cast<int64_t>(tokens);
    h.payload_bytes = static_cast<int64_t>(payload.size());
    state_->send(h, payload.data());
  }
  for (size_t i = 0; i < batch.size(); ++i) rc->local.assign_table(batch[i].slot, table_of(i));  // mirrors the outer tables
  std::vector<float> logits;
  if (!state_->distributed()) {
    logits = local_.forward(batch, rc->local);
  } else {
    try {
      logits = local_.forward(batch, rc->local);
    } catch (const UsageError&) {
      throw;  // every follower raised the same from the same plan
    } catch (const std::exception& e) {
      fatal(state_->on_fatal, *state_->comm, e);
    }
  }
  for (const auto& c : batch) cache.commit(c.slot, c.start_pos, c.tokens);
  return logits;
}

FollowerStats run_follower(const model::ForwardModel& local, dist::Communicator& comm, FatalHandler on_fatal) {
  if (comm.rank() == 0) throw UsageError("run_follower runs on ranks other than 0; rank 0 runs a RankZeroModel");
  FollowerStats stats;
  std::map<uint32_t, model::KvCache> caches;
  std::vector<unsigned char> payload;
  std::vector<model::SequenceChunk> batch;
  for (;;) {
    Header h;
    comm.broadcast(&h, sizeof(h), 0);
    if (h.kind < static_cast<uint32_t>(Kind::kMakeCache) || h.kind > static_cast<uint32_t>(Kind::kShutdown) ||
        h.payload_bytes < 0) {
      throw FormatError(fmt::format("run_follower on rank {}: message kind {} from rank 0 is unknown (do all ranks "
                                    "run the same fp4serve build?)", comm.rank(), h.kind));
    }
    payload.resize(static_cast<size_t>(h.payload_bytes));
    if (h.payload_bytes > 0) comm.broadcast(payload.data(), payload.size(), 0);
    switch (static_cast<Kind>(h.kind)) {
      case Kind::kShutdown:
        return stats;
      case Kind::kMakeCache:
        try {
          std::array<int64_t, kCacheFields> fields{};
          if (payload.size() != sizeof(fields)) {
            throw FormatError(fmt::format("run_follower on rank {}: make_cache message of {} bytes (expected {})",
                                          comm.rank(), payload.size(), sizeof(fields)));
          }
          std::memcpy(fields.data(), payload.data(), sizeof(fields));
          caches.insert_or_assign(h.cache_id, local.make_cache(model::KvCacheSpec{h.a, static_cast<int>(h.b), fields[0],
                                                                                  fields[1], fields[2]}));
          ++stats.caches_made;
        } catch (const UsageError&) {
          ++stats.usage_errors;  // rank 0's make_cache threw the same
        } catch (const std::exception& e) {
          fatal(on_fatal, comm, e);
        }
        break;
      case Kind::kDropCache:
        stats.caches_dropped += static_cast<int64_t>(caches.erase(h.cache_id));
        break;
      case Kind::kForward: {
        const auto it = caches.find(h.cache_id);
        const size_t n = static_cast<size_t>(h.a);
        const size_t header_bytes = n * kChunkFields * sizeof(int64_t);
        std::vector<int64_t> fields(n * kChunkFields);
        size_t entries = 0;
        if (payload.size() >= header_bytes) {
          std::memcpy(fields.data(), payload.data(), header_bytes);
          for (size_t i = 0; i < n; ++i) entries += static_cast<size_t>(std::max<int64_t>(fields[i * kChunkFields + 5], 0));
        }
        if (it == caches.end() || h.a < 0 || h.b < 0 ||
            payload.size() != header_bytes + (static_cast<size_t>(h.b) + entries) * sizeof(int32_t)) {
          throw FormatError(fmt::format("run_follower on rank {}: forward message for cache {} ({} chunks, {} tokens, "
                                        "{} payload bytes) does not match this rank's state",
                                        comm.rank(), h.cache_id, h.a, h.b, payload.size()));
        }
        const auto* tokens = reinterpret_cast<const int32_t*>(payload.data() + header_bytes);
        batch.clear();
        size_t at = 0;
        for (size_t i = 0; i < n; ++i) {
          const int64_t* f = fields.data() + i * kChunkFields;
          const auto size = static_cast<size_t>(f[3]);
          batch.push_back({static_cast<int>(f[0]), f[2], std::span<const int32_t>(tokens + at, size), f[1] != 0, f[4]});
          at += size;
        }
        ++stats.forwards;
        try {
          const auto* table = tokens + h.b;
          for (size_t i = 0; i < n; ++i) {
            const auto size = static_cast<size_t>(fields[i * kChunkFields + 5]);
            it->second.assign_table(batch[i].slot, std::span<const int32_t>(table, size));
            table += size;
          }
          (void)local.forward(batch, it->second);
        } catch (const UsageError&) {
          ++stats.usage_errors;
        } catch (const std::exception& e) {
          fatal(on_fatal, comm, e);
        }
        break;
      }
    }
  }
}

}  // namespace fp4serve::runtime
