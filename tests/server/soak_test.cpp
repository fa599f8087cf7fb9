// SPDX-License-Identifier: Apache-2.0
// A bounded soak of the HTTP server over FakeModel (issue 19): 32 clients × 20 requests, mixed streamed,
// whole and abandoned (stream dropped after two chunks, or the socket closed before the answer). No request may
// get a 5xx, every completed one must carry exactly the sequential greedy tokens, and the process's resident
// memory must come back within 10 MB of its warmed-up baseline. Once over whole slots, once with prefix caching
// on (issue 40) over a pool of a tenth of that, the prompts of each group of clients opening with the same
// 48 bytes: blocks are shared while sequences run, cached after they end, evicted and preempted under pressure,
// and none may stay referenced once the server is idle.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>

#include "server/fakes.h"
#include "server/raw_client.h"
#include "server/server_harness.h"

namespace fp4serve::server {
namespace {

using nlohmann::json;
using namespace testing;
using namespace std::chrono_literals;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

struct Tally {
  std::atomic<int> ok{0}, mismatched{0}, server_errors{0}, transport_errors{0}, abandoned{0};
};

// Request r of client c: kind r % 4 (0 whole, 1 stream, 2 stream dropped after two chunks, 3 socket closed).
// `preamble(c)` opens client c's prompts.
void run_request(const RunningServer& server, int c, int r, Tally& t, const std::function<std::string(int)>& preamble) {
  const std::string prompt =
      preamble(c) + fmt::format("soak {} {} {}", c, r, std::string(static_cast<size_t>(c % 5), 'x'));
  const int64_t max_tokens = 6 + (r % 9);
  const auto expect = reference_greedy(ByteCodec().encode(prompt, true), max_tokens, false);
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"return_token_ids", true}};
  const int kind = (c + r) % 4;
  if (kind == 0) {
    auto cli = server.client();
    auto res = cli->Post("/v1/completions", body.dump(), "application/json");
    if (!res) {
      ++t.transport_errors;
      return;
    }
    if (res->status >= 500) ++t.server_errors;
    const json j = json::parse(res->body, nullptr, false);
    std::vector<int32_t> ids;
    if (j.is_object() && j.contains("choices")) {
      for (const auto& id : j["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
    }
    (res->status == 200 && ids == expect ? t.ok : t.mismatched)++;
  } else if (kind == 1 || kind == 2) {
    body["stream"] = true;
    auto cli = server.client();
    const auto s = post_stream(*cli, "/v1/completions", body,
                               kind == 2 ? std::function<bool(size_t)>([](size_t n) { return n < 2; }) : nullptr);
    if (s.status >= 500) ++t.server_errors;
    if (kind == 2) {
      ++t.abandoned;
      return;
    }
    std::vector<int32_t> ids;
    for (const auto& chunk : s.chunks) {
      for (const auto& id : chunk["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
    }
    (s.status == 200 && s.done && ids == expect ? t.ok : t.mismatched)++;
  } else {
    const std::string text = body.dump();
    RawConnection conn(server.port());
    conn.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              std::to_string(text.size()) + "\r\n\r\n" + text);
    conn.close();
    ++t.abandoned;
  }
}

void round(const RunningServer& server, int clients, int requests, Tally& t,
           const std::function<std::string(int)>& preamble) {
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int r = 0; r < requests; ++r) run_request(server, c, r, t, preamble);
    });
  }
  for (auto& th : threads) th.join();
}

// The value of the first /metrics line that starts with `name` (0 when absent).
double metric(const Metrics& metrics, const std::string& name) {
  const std::string text = metrics.render();
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    if (at > 0 && text[at - 1] != '\n') continue;
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0.0;
}

void soak(FakeModel& model, const std::function<std::string(int)>& preamble) {
  ByteCodec codec;
  ServerSetup setup;
  setup.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 128, .max_queue = 64};
  setup.http.threads = 96;
  RunningServer server(model, codec, setup);
  auto idle = [&] {
    return eventually([&] { return server.metrics().running() == 0 && server.metrics().waiting() == 0; }, 10s);
  };
  Tally warm;
  round(server, 32, 3, warm, preamble);  // warm-up: threads, arenas and buffers reach their working size
  ASSERT_TRUE(idle());
  std::this_thread::sleep_for(300ms);  // abandoned connections finish closing
  const int64_t baseline = resident_bytes();

  Tally t;
  round(server, 32, 20, t, preamble);
  ASSERT_TRUE(idle());
  std::this_thread::sleep_for(300ms);
  const int64_t after = resident_bytes();

  std::printf("soak: %d completed, %d abandoned; RSS warmed %.1f MiB, after %.1f MiB\n", t.ok.load(), t.abandoned.load(),
              static_cast<double>(baseline) / 1048576.0, static_cast<double>(after) / 1048576.0);
  EXPECT_EQ(t.server_errors.load(), 0);
  EXPECT_EQ(t.transport_errors.load(), 0);
  EXPECT_EQ(t.mismatched.load(), 0);
  EXPECT_EQ(t.ok.load() + t.abandoned.load(), 32 * 20);
  EXPECT_GE(t.ok.load(), 32 * 20 / 2);
#if defined(__SANITIZE_ADDRESS__)
  // ASan keeps freed blocks in its quarantine (256 MiB by default), so RSS says nothing here; LeakSanitizer checks
  // for leaks at exit instead.
  (void)after;
#else
  EXPECT_LT(after - baseline, int64_t{10} << 20) << "RSS " << baseline / 1048576.0 << " MiB → " << after / 1048576.0 << " MiB";
#endif
  EXPECT_EQ(server.metrics().slots_used(), 0);
  EXPECT_EQ(metric(server.metrics(), "fp4serve_kv_cache_blocks_total"), static_cast<double>(model.cache().num_blocks()));
  EXPECT_EQ(metric(server.metrics(), "fp4serve_kv_cache_blocks_used"), 0.0) << "a KV block is still referenced";
  std::printf("soak: %.0f preemptions\n", metric(server.metrics(), "fp4serve_num_preemptions_total"));
}

TEST(ServerSoak, ThirtyTwoClientsMixedTrafficNo5xxSameTokensMemoryBack) {
  FakeModel model(16, 256);
  soak(model, [](int) { return std::string(); });
}

TEST(ServerSoak, PrefixCachingOverASmallPoolSharesEvictsAndLeaksNothing) {
  // 24 blocks of 16 for 16 sequences of up to 256 positions: 16 requests of 3 shared preamble blocks (4 groups)
  // and 2 of their own need 44, so sequences are preempted and resumed.
  FakeModel model(16, 256, /*num_blocks=*/24, /*block_size=*/16, /*prefix_caching=*/true);
  soak(model, [](int c) { return fmt::format("{:-<48}", fmt::format("shared preamble of group {} ", c % 4)); });
  // The server has stopped: its model is read on this thread alone.
  EXPECT_GT(model.cache().prefix_cache_hits(), 32 * 20 * 32 / 2) << "most requests should find their preamble";
  EXPECT_EQ(model.cache().free_blocks(), model.cache().num_blocks());
  std::printf("soak with prefix caching: %lld prefix-cache hits of %lld queried tokens\n",
              static_cast<long long>(model.cache().prefix_cache_hits()),
              static_cast<long long>(model.cache().prefix_cache_queries()));
}

}  // namespace
}  // namespace fp4serve::server
