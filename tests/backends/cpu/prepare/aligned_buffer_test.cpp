// SPDX-License-Identifier: Apache-2.0
// AlignedBuffer and HugePageArena: a copy into the arena holds the source's bytes at a 64-byte boundary with zero
// padding, blocks never overlap (also when threads allocate at once), a block larger than a chunk gets its own,
// and buffers outlive the arena that carved them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cpu/prepare/prepared_linear.h"

namespace fp4serve::prepare {
namespace {

AlignedBuffer random_buffer(size_t bytes, uint32_t seed) {
  AlignedBuffer b(bytes);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < bytes; ++i) b.data()[i] = static_cast<std::byte>(rng() | 1u);  // never zero
  return b;
}

TEST(HugePageArena, CopiesHoldTheBytesAlignedWithZeroPadding) {
  std::vector<AlignedBuffer> copies;
  std::vector<AlignedBuffer> sources;
  {
    HugePageArena arena(size_t{2} << 20);
    for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{3} << 20, size_t{70001}}) {
      sources.push_back(random_buffer(bytes, static_cast<uint32_t>(bytes)));
      copies.push_back(AlignedBuffer::copy_into(arena, sources.back()));
    }
    EXPECT_GE(arena.used_bytes(), (size_t{3} << 20) + 70001);
  }  // the arena is gone; its chunks live on in the copies
  for (size_t i = 0; i < copies.size(); ++i) {
    const AlignedBuffer& c = copies[i];
    ASSERT_EQ(c.size(), sources[i].size());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);
    EXPECT_TRUE(std::equal(c.data(), c.data() + c.size(), sources[i].data())) << "buffer " << i;
    const size_t padded = (c.size() + 63) / 64 * 64;
    for (size_t j = c.size(); j < padded; ++j) EXPECT_EQ(c.data()[j], std::byte{0}) << "padding of buffer " << i;
  }
  // No two blocks overlap.
  std::vector<std::pair<const std::byte*, const std::byte*>> spans;
  for (const AlignedBuffer& c : copies) spans.emplace_back(c.data(), c.data() + c.size());
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  EXPECT_EQ(AlignedBuffer::copy_into(*std::make_unique<HugePageArena>(), AlignedBuffer()).size(), 0u);
}

TEST(HugePageArena, ThreadsGetDisjointBlocks) {
  HugePageArena arena(size_t{2} << 20);
  constexpr int kThreads = 4, kEach = 200;
  std::vector<std::vector<AlignedBuffer>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        AlignedBuffer source(static_cast<size_t>(100 + 37 * i));
        std::fill(source.data(), source.data() + source.size(), static_cast<std::byte>(t + 1));
        got[static_cast<size_t>(t)].push_back(AlignedBuffer::copy_into(arena, source));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (const AlignedBuffer& b : got[static_cast<size_t>(t)]) {
      // Another thread's block written over this one would show its byte value.
      ASSERT_TRUE(std::all_of(b.data(), b.data() + b.size(), [&](std::byte x) { return x == static_cast<std::byte>(t + 1); }));
    }
  }
}

}  // namespace
}  // namespace fp4serve::prepare
