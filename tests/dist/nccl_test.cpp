// SPDX-License-Identifier: Apache-2.0
// The NCCL communicator's failure paths, under mpirun -np 2 (tests/dist/CMakeLists.txt): a missing libnccl or a
// missing GPU on any rank is an error on every rank that names what is missing, never a hang. On a machine with a
// GPU, a one-rank NCCL communicator reduces, gathers and broadcasts device memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "fp4serve/error.h"

namespace fp4serve::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  return *comm;
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string error_of(Communicator& bootstrap, const NcclOptions& options) {
  try {
    make_nccl_communicator(bootstrap, options);
  } catch (const DeviceError& e) {
    return e.what();
  }
  return {};
}

TEST(NcclCommunicator, MissingLibraryIsNamedOnEveryRank) {
  NcclOptions options;
  options.library = "libnccl-not-installed.so.2";
  const std::string what = error_of(world(), options);
  EXPECT_NE(what.find("cannot load the NCCL library libnccl-not-installed.so.2"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0:"), std::string::npos) << what;  // the first failing rank is named
}

TEST(NcclCommunicator, OneRanksMissingLibraryFailsTheOthersToo) {
  ASSERT_GE(world().size(), 2);
  NcclOptions options;
  if (world().rank() == world().size() - 1) options.library = "/nonexistent/libnccl.so.2";
  const std::string what = error_of(world(), options);
  // Every rank throws and names the last rank, whether its own setup worked (a GPU is present) or not (none is,
  // in which case rank 0's missing device is reported first).
  ASSERT_FALSE(what.empty()) << "rank " << world().rank() << " built a communicator its peer could not join";
  if (have_gpu()) {
    EXPECT_NE(what.find(fmt::format("rank {}: cannot load the NCCL library /nonexistent/libnccl.so.2", world().size() - 1)),
              std::string::npos)
        << what;
  } else {
    EXPECT_NE(what.find("rank 0: "), std::string::npos) << what;
  }
}

TEST(NcclCommunicator, WithoutAGpuTheMessageNamesTheDevice) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  NcclOptions options;
  options.cuda_device = world().rank();
  const std::string what = error_of(world(), options);
  // Either libnccl is absent (named) or it loaded and the CUDA device is what is missing.
  const bool names_library = what.find("cannot load the NCCL library libnccl.so.2") != std::string::npos;
  const bool names_device = what.find("no usable CUDA device for NCCL (cudaGetDeviceCount: ") != std::string::npos;
  EXPECT_TRUE(names_library || names_device) << what;
}

TEST(NcclCommunicator, OneRankCollectivesOnTheGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto single = make_single_communicator();
  NcclOptions options;
  std::unique_ptr<Communicator> nccl;
  try {
    nccl = make_nccl_communicator(*single, options);
  } catch (const DeviceError& e) {
    if (std::string(e.what()).find("cannot load") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_EQ(nccl->name(), "nccl");
  EXPECT_TRUE(nccl->device_memory());
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> dist(0.5f, 3.0f);
  std::vector<float> host(1031);
  for (float& x : host) x = dist(gen);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  nccl->all_reduce_sum(dev, host.size());
  float* gathered = nullptr;
  ASSERT_EQ(cudaMalloc(&gathered, host.size() * sizeof(float)), cudaSuccess);
  nccl->all_gather(dev, gathered, host.size() * sizeof(float));
  nccl->broadcast(gathered, host.size() * sizeof(float), 0);
  nccl->barrier();
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), gathered, back.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: the sum of one value is that value, exactly
  cudaFree(dev);
  cudaFree(gathered);
}

}  // namespace
}  // namespace fp4serve::dist
