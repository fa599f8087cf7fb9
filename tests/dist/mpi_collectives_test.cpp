// SPDX-License-Identifier: Apache-2.0
// The MPI communicator under mpirun (tests/dist/CMakeLists.txt runs this binary with -np 2 and -np 3): every rank
// fills its buffers from a seed that depends on its rank, so each rank can regenerate every other rank's data and
// compute the expected sum in float64 / the expected gathered bytes itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dist/communicator.h"
#include "dist/launch.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  return *comm;
}

// Seeded values in ±[0.25, 4): never zero, mixed signs and magnitudes, so a missing or doubled rank shows.
std::vector<float> rank_floats(int rank, size_t n, uint32_t salt) {
  std::mt19937 gen(1000003u * static_cast<uint32_t>(rank + 1) + salt);
  std::uniform_real_distribution<float> mag(0.25f, 4.0f);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(n);
  for (float& x : v) x = neg(gen) ? -mag(gen) : mag(gen);
  return v;
}

std::vector<unsigned char> rank_bytes(int rank, size_t n, uint32_t salt) {
  std::mt19937 gen(7919u * static_cast<uint32_t>(rank + 3) + salt);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

TEST(MpiCommunicator, RankAndSizeAgreeWithTheLauncher) {
  const LaunchInfo launch = detect_launch();
  ASSERT_TRUE(launch.launched) << "run this test under mpirun";
  EXPECT_EQ(world().size(), launch.world_size);
  EXPECT_EQ(world().rank(), launch.rank);
  EXPECT_GE(world().size(), 2);
  EXPECT_EQ(world().name(), "mpi");
  EXPECT_FALSE(world().device_memory());
}

void expect_sums(Communicator& comm, size_t n, uint32_t salt) {
  std::vector<float> data = rank_floats(comm.rank(), n, salt);
  comm.all_reduce_sum(data.data(), n);
  std::vector<double> sums(n, 0.0), abs_sums(n, 0.0);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<float> theirs = rank_floats(r, n, salt);
    for (size_t i = 0; i < n; ++i) {
      sums[i] += theirs[i];
      abs_sums[i] += std::fabs(theirs[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const double sum = sums[i], abs_sum = abs_sums[i];
    // fp32 summation in any order: at most (size − 1) roundings of partial sums bounded by Σ|x|.
    const double tol = comm.size() * abs_sum * std::ldexp(1.0, -24);
    ASSERT_NEAR(data[i], sum, tol) << "element " << i << " of " << n << " on rank " << comm.rank();
  }
}

TEST(MpiCommunicator, AllReduceSumMatchesFloat64) {
  for (const size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) expect_sums(world(), n, 11u + static_cast<uint32_t>(n));
}

TEST(MpiCommunicator, AllReduceSumInPiecesMatchesFloat64) {
  auto comm = make_mpi_communicator(/*max_piece=*/7);
  expect_sums(*comm, 51, 5u);
}

void expect_gather(Communicator& comm, size_t n, bool in_place) {
  const int size = comm.size();
  std::vector<unsigned char> recv(n * static_cast<size_t>(size), 0xA5);
  const std::vector<unsigned char> mine = rank_bytes(comm.rank(), n, static_cast<uint32_t>(n));
  if (in_place) {
    std::copy(mine.begin(), mine.end(), recv.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(comm.rank())));
    comm.all_gather(recv.data() + n * static_cast<size_t>(comm.rank()), recv.data(), n);
  } else {
    comm.all_gather(mine.data(), recv.data(), n);
  }
  for (int r = 0; r < size; ++r) {
    const std::vector<unsigned char> want = rank_bytes(r, n, static_cast<uint32_t>(n));
    ASSERT_TRUE(std::equal(want.begin(), want.end(), recv.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(r))))
        << "rank " << r << "'s " << n << " bytes on rank " << comm.rank() << (in_place ? " (in place)" : "");
  }
}

TEST(MpiCommunicator, AllGatherPlacesEachRanksBytes) {
  for (const size_t n : {size_t{1}, size_t{13}, size_t{1001}}) {
    expect_gather(world(), n, false);
    expect_gather(world(), n, true);
  }
}

TEST(MpiCommunicator, AllGatherInPiecesPlacesEachRanksBytes) {
  auto comm = make_mpi_communicator(/*max_piece=*/5);
  expect_gather(*comm, 23, false);
  expect_gather(*comm, 23, true);
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  for (int root = 0; root < world().size(); ++root) {
    for (const size_t n : {size_t{3}, size_t{517}}) {
      std::vector<unsigned char> data = rank_bytes(world().rank(), n, 99u);
      world().broadcast(data.data(), n, root);
      EXPECT_EQ(data, rank_bytes(root, n, 99u)) << "root " << root << ", " << n << " bytes";
    }
  }
  auto pieces = make_mpi_communicator(/*max_piece=*/4);
  std::vector<unsigned char> data = rank_bytes(pieces->rank(), 19, 3u);
  pieces->broadcast(data.data(), data.size(), pieces->size() - 1);
  EXPECT_EQ(data, rank_bytes(pieces->size() - 1, 19, 3u));
}

TEST(MpiCommunicator, BroadcastRefusesARootOutsideTheCommunicator) {
  unsigned char b = 1;
  EXPECT_THROW(world().broadcast(&b, 1, world().size()), UsageError);
  world().barrier();
}

}  // namespace
}  // namespace fp4serve::dist
