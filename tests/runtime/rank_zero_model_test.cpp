// SPDX-License-Identifier: Apache-2.0
// RankZeroModel + run_follower with a recording fake model, under mpirun -np 2 and 3 (and alone, with the size-1
// communicator). Every rank's fake model logs each call (cache shapes, chunks, tokens, and the logits it
// computed from its own KV cache); the logs must be bit-identical on every rank, and rank 0's logits must equal
// the reference the test computes from the token history it drove.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "backends/cpu/cpu_kv_storage.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "fp4serve/error.h"
#include "runtime/rank_zero_model.h"

namespace fp4serve::runtime {
namespace {

constexpr int64_t kVocab = 11;

// logits[v] of the token at position p of slot s = Σ_{q ≤ p} (cached token at q)·(q + 1) + v/4: a function of
// the whole cached history, so a rank whose cache missed a step (or a slot) computes something else.
class RecordingModel final : public model::ForwardModel {
 public:
  RecordingModel() {
    config_.num_layers = 2;
    config_.num_kv_heads = 1;
    config_.head_dim = 3;
    config_.vocab_size = kVocab;
  }
  const model::ModelConfig& config() const override { return config_; }
  using model::ForwardModel::make_cache;
  model::KvCache make_cache(const model::KvCacheSpec& spec) const override {
    log.insert(log.end(), {-1, spec.max_seq_len, spec.max_slots, spec.num_blocks, spec.block_size});
    // Its keys hold the tokens seen (host memory, as the CPU backend keeps them).
    return backends::cpu::make_host_kv_cache(config_.num_layers, config_.num_kv_heads, config_.head_dim, spec);
  }
  std::vector<float> forward(std::span<const model::SequenceChunk> batch, model::KvCache& cache) const override {
    log.insert(log.end(), {-2, static_cast<int64_t>(batch.size())});
    for (const auto& c : batch) {
      log.insert(log.end(),
                 {c.slot, c.start_pos, c.all_logits ? 1 : 0, c.first_logit_row, static_cast<int64_t>(c.tokens.size())});
      log.insert(log.end(), c.tokens.begin(), c.tokens.end());
    }
    for (const auto& c : batch) {  // validation first, as Decoder does: every rank throws alike
      for (const int32_t t : c.tokens) {
        if (t < 0 || t >= kVocab) throw UsageError("token outside the vocabulary");
      }
    }
    for (const auto& c : batch) {  // the blocks, as Decoder's flatten_batch gives them
      cache.acquire(c.slot);
      cache.prepare(c.slot, c.start_pos, static_cast<int64_t>(c.tokens.size()));
    }
    std::vector<float> logits;
    for (const auto& c : batch) {
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        const int64_t p = c.start_pos + static_cast<int64_t>(i);
        backends::cpu::host_key(cache, c.slot, 1, 0, p)[2] = static_cast<float>(c.tokens[i]);
        if (c.all_logits ? static_cast<int64_t>(i) < c.first_logit_row : i + 1 < c.tokens.size()) continue;
        double history = 0;
        for (int64_t q = 0; q <= p; ++q) {
          history += backends::cpu::host_key(cache, c.slot, 1, 0, q)[2] * static_cast<double>(q + 1);
        }
        for (int64_t v = 0; v < kVocab; ++v) logits.push_back(static_cast<float>(history + static_cast<double>(v) / 4));
      }
    }
    for (const auto& c : batch) cache.commit(c.slot, c.start_pos, c.tokens);
    for (const float x : logits) {
      int32_t bits = 0;
      std::memcpy(&bits, &x, sizeof(bits));
      log.push_back(bits);
    }
    return logits;
  }
  mutable std::vector<int64_t> log;

 private:
  model::ModelConfig config_;
};

std::unique_ptr<dist::Communicator> make_world() {
  return dist::detect_launch().launched ? dist::make_mpi_communicator() : dist::make_single_communicator();
}

// Rank 0's side: seeded random steps over two caches, slot reuse, one invalid step, one dropped cache.
void drive(RankZeroModel& tp, int64_t& expected_forwards) {
  std::mt19937 gen(2024);
  model::KvCache a = tp.make_cache(64, 3);
  std::map<int, std::vector<int32_t>> history;  // slot → tokens cached so far
  for (int s = 0; s < 3; ++s) ASSERT_EQ(a.acquire(), s);
  for (int step = 0; step < 24; ++step) {
    if (step == 12) {  // slot 1's sequence ends; a new one starts in it
      a.release(1);
      ASSERT_EQ(a.acquire(), 1);
      history[1].clear();
    }
    std::vector<std::vector<int32_t>> tokens;
    std::vector<model::SequenceChunk> batch;
    for (int s = 0; s < 3; ++s) {
      if (gen() % 3 == 0 || history[s].size() >= 60) continue;
      const size_t len = 1 + gen() % 4;
      std::vector<int32_t> t(len);
      for (auto& x : t) x = static_cast<int32_t>(gen() % kVocab);
      tokens.push_back(t);
      const bool all_logits = gen() % 2 == 0;
      const auto first_logit_row = static_cast<int64_t>(all_logits ? gen() % len : 0);
      batch.push_back({s, static_cast<int64_t>(history[s].size()), {}, all_logits, first_logit_row});
    }
    if (batch.empty()) continue;
    for (size_t i = 0; i < batch.size(); ++i) batch[i].tokens = tokens[i];
    const std::vector<float> logits = tp.forward(batch, a);
    ++expected_forwards;
    size_t row = 0;
    for (const auto& c : batch) {
      auto& h = history[c.slot];
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        h.push_back(c.tokens[i]);
        if (c.all_logits ? static_cast<int64_t>(i) < c.first_logit_row : i + 1 < c.tokens.size()) continue;
        double want = 0;
        for (size_t q = 0; q < h.size(); ++q) want += h[q] * static_cast<double>(q + 1);
        for (int64_t v = 0; v < kVocab; ++v) {
          ASSERT_EQ(logits.at(row * kVocab + static_cast<size_t>(v)), static_cast<float>(want + static_cast<double>(v) / 4))
              << "step " << step << " slot " << c.slot << " row " << row;
        }
        ++row;
      }
    }
    ASSERT_EQ(row * kVocab, logits.size());
  }
  {
    model::KvCache b = tp.make_cache(8, 2);
    const int s = b.acquire();
    const std::vector<int32_t> bad = {3, static_cast<int32_t>(kVocab)};
    const model::SequenceChunk chunk{s, 0, bad, false};
    EXPECT_THROW(tp.forward(std::span(&chunk, 1), b), UsageError);  // every follower throws it too and goes on
    ++expected_forwards;
    const std::vector<int32_t> good = {4, 5, 6};
    const model::SequenceChunk ok{s, 0, good, true};
    EXPECT_EQ(tp.forward(std::span(&ok, 1), b).size(), 3u * kVocab);
    ++expected_forwards;
  }  // b is dropped on every rank here
  model::KvCache foreign(2, 1, 3, 4, 1);
  const std::vector<int32_t> one = {1};
  const model::SequenceChunk c{foreign.acquire(), 0, one, false};
  EXPECT_THROW(tp.forward(std::span(&c, 1), foreign), UsageError);  // refused before anything is broadcast
  tp.shutdown();
  EXPECT_THROW(tp.make_cache(4, 1), UsageError);
}

TEST(RankZeroModel, EveryRankRunsTheSamePlan) {
  auto comm = make_world();
  RecordingModel local;
  int64_t forwards = 0;
  FollowerStats stats;
  if (comm->rank() == 0) {
    RankZeroModel tp(local, *comm);
    drive(tp, forwards);
  } else {
    stats = run_follower(local, *comm);
  }
  // The counts rank 0 drove, against what each follower saw.
  comm->broadcast(&forwards, sizeof(forwards), 0);
  if (comm->rank() != 0) {
    EXPECT_EQ(stats.forwards, forwards);
    EXPECT_EQ(stats.caches_made, 2);
    EXPECT_EQ(stats.caches_dropped, 1);
    EXPECT_EQ(stats.usage_errors, 1);
  }
  EXPECT_GT(forwards, 15);
  // Bit-identical logs: lengths first (so the broadcast below has one size on every rank), then rank 0's bytes.
  int64_t mine = static_cast<int64_t>(local.log.size());
  std::vector<int64_t> sizes(static_cast<size_t>(comm->size()));
  comm->all_gather(&mine, sizes.data(), sizeof(mine));
  for (int r = 0; r < comm->size(); ++r) ASSERT_EQ(sizes[static_cast<size_t>(r)], sizes[0]) << "rank " << r;
  std::vector<int64_t> rank0 = local.log;
  comm->broadcast(rank0.data(), rank0.size() * sizeof(int64_t), 0);
  EXPECT_EQ(local.log, rank0) << "rank " << comm->rank() << " ran another plan than rank 0";
  EXPECT_GT(local.log.size(), 200u);
}

TEST(KvCache, AcquireASpecificSlot) {
  model::KvCache cache = backends::cpu::make_host_kv_cache(2, 1, 3, 5, 3);
  EXPECT_TRUE(cache.acquire(1));
  EXPECT_FALSE(cache.acquire(1));  // already in use
  ASSERT_TRUE(cache.reserve(1, 5));
  backends::cpu::host_key(cache, 1, 1, 0, 4)[2] = 7.0f;  // its memory exists
  EXPECT_EQ(cache.acquire(), 0);   // the lowest free slot, around the taken one
  EXPECT_EQ(cache.acquire(), 2);
  EXPECT_EQ(cache.acquire(), -1);
  cache.release(1);
  EXPECT_EQ(cache.free_slots(), 1);
  EXPECT_TRUE(cache.acquire(1));
  EXPECT_THROW(cache.acquire(3), UsageError);
  EXPECT_THROW(cache.acquire(-1), UsageError);
}

TEST(RankZeroModel, RoleChecks) {
  auto single = dist::make_single_communicator();
  RecordingModel local;
  EXPECT_THROW(run_follower(local, *single), UsageError);  // rank 0 is never a follower
}

}  // namespace
}  // namespace fp4serve::runtime
