// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism end to end under mpirun (ctest label `mpi`): every rank loads a reference fixture twice, whole
// (TP = 1) and as its shard of TP = world size, runs the same prompt prefill + greedy decode through both, and
// checks that the greedy tokens are identical and every step's logits agree within 1e-4 · max|logit|, also when
// the sharded run takes its prompt's head from the prefix cache. Rank 0
// prints one parity-table row per fixture. The communicator is dist::make_mpi_communicator, the one
// `mpirun fp4serve … --tensor-parallel-size N` uses.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels/linear.h"
#include "backends/load_model.h"
#include "core/threading.h"
#include "fp4serve/error.h"
#include "test_support.h"
#include "tp_checkpoint.h"

namespace fp4serve::model {
namespace {

using test_support::kRef;

namespace fs = std::filesystem;

// The run's MPI communicator (dist::make_mpi_communicator, which initialises MPI), made first thing in main().
dist::Communicator* g_comm = nullptr;

struct ParityCase {
  std::string fixture;  // a tests/data/ref folder, or the tag of a tp_checkpoint.h checkpoint
  bool expert_parallel = false;
  std::optional<tp_testing::Format> synthetic;  // written per rank by tp_testing::write_llama
  int64_t intermediate = 0;
};

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per step, the last row
};

// Prefill of a 37-token prompt, then greedy decode. With `prefix_hit`, prefix caching is on and another sequence
// ran the same prompt first (and still holds it): the run takes its two full blocks from the prefix cache and
// prefills only the last 5 tokens, each rank over its own shard of the shared blocks.
GreedyRun greedy(const LoadedModel& m, int steps, bool prefix_hit = false) {
  const int64_t vocab = m.config.vocab_size;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(static_cast<int32_t>((1 + 13 * i) % vocab));
  KvCache cache = m.decoder->make_cache(64, 2);
  int64_t pos = 0;
  if (prefix_hit) {
    cache.set_prefix_caching(true);
    const int first = cache.acquire();
    SequenceChunk chunk{first, 0, prompt, false};
    m.decoder->forward(std::span(&chunk, 1), cache);
  }
  const int slot = cache.acquire();
  pos = cache.match_prefix(slot, prompt);
  EXPECT_EQ(pos, prefix_hit ? 32 : 0);
  GreedyRun run;
  std::vector<int32_t> next(prompt.begin() + pos, prompt.end());
  for (int s = 0; s < steps; ++s) {
    SequenceChunk chunk{slot, pos, next, false};
    std::vector<float> logits = m.decoder->forward(std::span(&chunk, 1), cache);
    pos += static_cast<int64_t>(next.size());
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.tokens.push_back(best);
    run.logits.push_back(std::move(logits));
    next = {best};
  }
  return run;
}

// The largest |a − b| over every step's logits, and the largest |a|.
std::pair<double, double> logit_diff(const GreedyRun& a, const GreedyRun& b) {
  double max_diff = 0, max_logit = 0;
  for (size_t s = 0; s < a.logits.size(); ++s) {
    for (size_t i = 0; i < a.logits[s].size(); ++i) {
      max_logit = std::max(max_logit, std::fabs(static_cast<double>(a.logits[s][i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a.logits[s][i]) - b.logits[s][i]));
    }
  }
  return {max_diff, max_logit};
}

class TpParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(TpParity, GreedyTokensAndLogitsMatchTp1) {
  const ParityCase& c = GetParam();
  dist::Communicator& comm = *g_comm;
  std::unique_ptr<tp_testing::Checkpoint> written;
  fs::path dir = kRef / c.fixture;
  if (c.synthetic) {
    written = tp_testing::write_llama(*c.synthetic, c.intermediate, c.fixture + "_rank" + std::to_string(comm.rank()),
                                      comm.size());
    dir = written->dir;
  }
  // Each activation precision named, not auto: auto may choose int8 for batched rows from a timing each process
  // measures (near its margin on these small fixtures).
  using prepare::ActivationPrecision;
  GreedyRun fp32_prompt;  // TP = 1 with fp32 activations: the prompt's logits, int8's own distance below
  for (ActivationPrecision precision : {ActivationPrecision::Fp32, ActivationPrecision::Bf16, ActivationPrecision::Int8}) {
    SCOPED_TRACE(prepare::activation_precision_name(precision));
    LoadOptions whole;
    whole.threads = 1;
    whole.activation_precision = precision;
    LoadOptions shard = whole;
    shard.parallel = {comm.size(), comm.rank(), c.expert_parallel};
    shard.comm = &comm;
    const LoadedModel reference = load_model(dir, whole);
    const LoadedModel sharded = load_model(dir, shard);
    if (precision == ActivationPrecision::Int8) {
      // int8 picks its 16-bit groups per row of each rank's shard of a row-parallel layer, so TP moves its
      // rounding a little (docs/tensor-parallel.md): the prompt's logits (its batched rows on the int8 kernel) move
      // by less than twice int8's own distance from fp32 at TP = 1 (up to 0.8 of it on these fixtures), plus the
      // bound above (layers that int8 leaves alone).
      // Greedy tokens may then part at a near tie, so later steps are not compared.
      const GreedyRun whole_int8 = greedy(reference, 1);
      const auto [tp_moved, max_logit] = logit_diff(whole_int8, greedy(sharded, 1));
      const double own = logit_diff(whole_int8, fp32_prompt).first;
      if (comm.rank() == 0) {
        std::printf("TP-PARITY | %s%s | int8 prompt | %d | moved %.3g, int8 vs fp32 %.3g\n", c.fixture.c_str(),
                    c.expert_parallel ? " --expert-parallel" : "", comm.size(), tp_moved, own);
      }
      EXPECT_LE(tp_moved, 2 * own + 1e-4 * max_logit) << c.fixture;
      continue;
    }
    constexpr int kSteps = 9;
    const GreedyRun a = greedy(reference, kSteps);
    const GreedyRun b = greedy(sharded, kSteps);
    const GreedyRun cached = greedy(sharded, kSteps, /*prefix_hit=*/true);
    if (precision == ActivationPrecision::Fp32) fp32_prompt.logits = {a.logits.front()};
    const auto [max_diff, max_logit] = logit_diff(a, b);
    const auto [cached_diff, cached_max_logit] = logit_diff(a, cached);
    const bool same = a.tokens == b.tokens;
    const bool cached_same = a.tokens == cached.tokens;
    if (comm.rank() == 0) {
      std::printf("TP-PARITY | %s%s | %s | %d | %s | %.3g (%.3g of max|logit|) | prefix hit: %s, %.3g\n", c.fixture.c_str(),
                  c.expert_parallel ? " --expert-parallel" : "", std::string(prepare::activation_precision_name(precision)).c_str(),
                  comm.size(), same ? "yes" : "NO", max_diff, max_diff / max_logit, cached_same ? "yes" : "NO",
                  cached_diff / max_logit);
    }
    EXPECT_TRUE(same) << c.fixture;
    EXPECT_LE(max_diff, 1e-4 * max_logit) << c.fixture;
    EXPECT_TRUE(cached_same) << c.fixture << " with a prefix-cache hit";
    EXPECT_LE(cached_diff, 1e-4 * max_logit) << c.fixture << " with a prefix-cache hit";
  }
}

// The weight cache under tensor parallelism: each rank writes the file of its own shard (the name and key carry the
// rank), the next load maps every layer of it, and the logits of both loads equal the repacked shard's bit for bit
// (an MoE split over experts, a dense model with a rank-local activation order).
TEST(TpWeightCache, EachRankMapsItsOwnShard) {
  dist::Communicator& comm = *g_comm;
  const fs::path folder = fs::temp_directory_path() / ("fp4serve-tp-weight-cache-" + std::to_string(::getpid()));
  std::unique_ptr<tp_testing::Checkpoint> written = tp_testing::write_llama(
      tp_testing::Format::Int4Actorder, 192, "synthetic-int4-gidx-wc_rank" + std::to_string(comm.rank()), comm.size());
  std::vector<std::pair<fs::path, bool>> models{{written->dir, false}};
  if (2 % comm.size() == 0) models.emplace_back(kRef / "qwen3moe-nvfp4a16", true);  // its 2 heads split over 2 ranks
  for (const auto& [dir, expert_parallel] : models) {
    SCOPED_TRACE(dir.filename().string());
    LoadOptions shard;
    shard.threads = 1;
    shard.parallel = {comm.size(), comm.rank(), expert_parallel};
    shard.comm = &comm;
    const GreedyRun repacked = greedy(load_model(dir, shard), 5);
    shard.weight_cache = WeightCacheMode::On;
    shard.weight_cache_dir = folder;
    const LoadedModel writer = load_model(dir, shard);
    ASSERT_TRUE(writer.weight_cache);
    EXPECT_TRUE(writer.weight_cache->written) << writer.weight_cache->not_written;
    EXPECT_NE(writer.weight_cache->file.filename().string().find(fmt::format("-tp{}r{}-", comm.size(), comm.rank())),
              std::string::npos) << writer.weight_cache->file;
    const GreedyRun from_writer = greedy(writer, 5);
    const LoadedModel reader = load_model(dir, shard);
    ASSERT_TRUE(reader.weight_cache);
    EXPECT_EQ(reader.weight_cache->layers_prepared, 0) << reader.weight_cache->not_used;
    EXPECT_GT(reader.weight_cache->layers_mapped, 0);
    const GreedyRun mapped = greedy(reader, 5);
    EXPECT_EQ(from_writer.tokens, repacked.tokens);
    EXPECT_EQ(from_writer.logits, repacked.logits);
    EXPECT_EQ(mapped.tokens, repacked.tokens);
    EXPECT_EQ(mapped.logits, repacked.logits);
  }
  fs::remove_all(folder);
}

// auto's activation precision is rank 0's measurement on every rank, so that the shards round their activations
// alike: each rank's own cache of measurements (FP4SERVE_CACHE_DIR, one folder per rank) is seeded with the
// opposite answer to rank 0's (rank 0 bf16, the others bf16-decode-int8), and every rank must load with bf16.
// 3 threads: a key no other test of this process has measured (the measurement is also kept in memory).
TEST(TpActivationPrecision, EveryRankRunsRankZerosAutoChoice) {
  if (!kernels::bf16_dot_active()) GTEST_SKIP() << "auto measures only on a CPU with AVX512-BF16 dot products";
  dist::Communicator& comm = *g_comm;
  const fs::path dir = kRef / "llama-nvfp4a16";
  constexpr int kThreads = 3;
  const ModelConfig config = parse_model_config(checkpoint::Checkpoint::open(dir).config());
  ASSERT_EQ(config.dtype, "bfloat16");
  if (config.num_heads % comm.size() != 0) GTEST_SKIP() << dir.filename() << "'s heads do not split over " << comm.size();
  const fs::path cache = fs::temp_directory_path() / ("fp4serve-tp-precision-" + std::to_string(getpid()));
  fs::create_directories(cache);
  const bool int8 = comm.rank() != 0;
  const nlohmann::json entry = {{"choice", int8 ? "bf16-decode-int8" : "bf16"}, {"measured", true},
                                {"out_features", 256},  {"in_features", 256},
                                {"bf16_decode_s", 1e-5}, {"int8_decode_s", 1e-5},
                                {"bf16_step_s", 3e-5}, {"int8_step_s", int8 ? 1.5e-5 : 3e-5},
                                {"bf16_batched_s", 1e-4}, {"int8_batched_s", int8 ? 0.5e-4 : 1e-4}};
  std::ofstream(cache / "activation-precision.json")
      << nlohmann::json{{precision_cache_key(kThreads, activation_probe_shape(config)), entry}}.dump();
  setenv("FP4SERVE_CACHE_DIR", cache.c_str(), 1);
  LoadOptions shard;
  shard.threads = kThreads;
  shard.parallel = {comm.size(), comm.rank(), false};
  shard.comm = &comm;
  const LoadedModel sharded = load_model(dir, shard);
  unsetenv("FP4SERVE_CACHE_DIR");
  fs::remove_all(cache);
  core::set_num_threads(1);
  EXPECT_EQ(sharded.activation_precision, prepare::ActivationPrecision::Bf16)
      << "rank " << comm.rank() << " ran " << prepare::activation_precision_name(sharded.activation_precision);
}

// Dense, uneven MXFP4 (intermediate 352 = 128/128/96 at TP 3), NVFP4 with per-shard global scales, int4, FP8
// channel (llama-fp8-block's 128-row scale blocks cannot split head_dim-32 KV heads: refused by the plan), online transforms (QuIP input/output, SpinQuant R3 q_attn/k_cache), Qwen3 q/k-norm, Qwen2 q/k/v biases,
// MoE with split experts and expert-parallel, GPT-OSS (sinks, biases, fused MXFP4 experts).
std::vector<ParityCase> cases() {
  const int size = g_comm->size();
  std::vector<ParityCase> out;
  for (const char* f : {"llama-bf16", "llama-nvfp4a16", "llama-i352-mxfp4a16", "llama-i352-nvfp4", "llama-w4a16-asym",
                        "llama-fp8-dynamic", "llama-quip-mxfp4a16", "llama-quipuv-nvfp4a16", "llama-spinquant-nvfp4a16",
                        "llama-spinquant-r3-nvfp4a16", "qwen3-nvfp4a16", "qwen2-nvfp4a16", "granite-nvfp4a16",
                        "mixtral-mxfp4a16", "qwen3moe-nvfp4a16", "granitemoe-bf16", "gptoss-mxfp4-native"}) {
    out.push_back({f, false, std::nullopt, 0});
  }
  for (const char* f : {"mixtral-mxfp4a16", "qwen3moe-nvfp4a16", "gptoss-mxfp4-native"}) out.push_back({f, true, std::nullopt, 0});
  // The fixtures have 2, 4 or 8 heads; these one-layer checkpoints have 6 q / 3 KV heads at 3 ranks (uneven
  // 352 = 128/128/96 MXFP4 and 80 = 32/32/16 NVFP4 intermediates, int4 with a rank-local activation order).
  using tp_testing::Format;
  std::vector<ParityCase> synthetic = {{"synthetic-mxfp4-i352", false, Format::Mxfp4, 352},
                                       {"synthetic-nvfp4-i80", false, Format::Nvfp4, 80},
                                       {"synthetic-int4-gidx-i192", false, Format::Int4Actorder, 192},
                                       {"synthetic-bf16-i88", false, Format::Dense, 88}};
  // Only the fixtures whose heads split over this world size (the refusal itself is a unit test).
  std::vector<ParityCase> fits;
  for (const ParityCase& c : out) {
    const auto cfg = nlohmann::json::parse(std::ifstream(kRef / c.fixture / "config.json"));
    const int64_t heads = cfg.value("num_attention_heads", 0), kv = cfg.value("num_key_value_heads", heads);
    if (heads % size == 0 && (kv % size == 0 || size % kv == 0)) fits.push_back(c);
  }
  fits.insert(fits.end(), synthetic.begin(), synthetic.end());
  // A checkpoint folder of one's own (e.g. the default model, 9 q / 3 KV heads, at 3 ranks): FP4SERVE_TP_MODEL.
  if (const char* extra = std::getenv("FP4SERVE_TP_MODEL"); extra != nullptr && *extra != 0) {
    fits.push_back({fs::absolute(extra).string(), false, std::nullopt, 0});
  }
  return fits;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpParity, ::testing::ValuesIn(cases()), [](const auto& param_info) {
  std::string n = fs::path(param_info.param.fixture).filename().string() + (param_info.param.expert_parallel ? "_ep" : "");
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
});

}  // namespace
}  // namespace fp4serve::model

int main(int argc, char** argv) {
  const std::unique_ptr<fp4serve::dist::Communicator> comm = fp4serve::dist::make_mpi_communicator();
  fp4serve::model::g_comm = comm.get();
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = comm->rank();
  // Only rank 0 reports; every rank runs every test (the collectives need them all).
  if (rank != 0) delete ::testing::UnitTest::GetInstance()->listeners().Release(
      ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  // Any rank's failure fails the run (mpirun reports the first non-zero exit).
  float failed = RUN_ALL_TESTS() != 0 ? 1.f : 0.f;
  comm->all_reduce_sum(&failed, 1);
  return failed > 0.f ? 1 : 0;
}
