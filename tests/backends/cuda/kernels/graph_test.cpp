// SPDX-License-Identifier: Apache-2.0
// StepGraphs on a GPU (skips without one): a step is captured once per bucket, replays read the inputs' new
// contents (the graph bakes addresses, not values), and a step that cannot be captured falls back to eager runs.
// The step is add_scaled (ops.h), whose result is checked against the same arithmetic on the host (x + 0.5·d is
// exact in fp32 up to one rounding, the same with or without FMA since 0.5·d is exact).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/graph.h"
#include "backends/cuda/kernels/ops.h"

namespace fp4serve::kernels::cuda {
namespace {

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.1f, 2.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(CudaStepGraphs, CapturesOncePerBucketAndReplaysWithNewInputs) {
  if (!cuda_device(0)) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kWidth = 33, kRows = 16;
  const size_t n = kRows * kWidth;
  Stream stream;
  StepGraphs graphs(std::vector<int64_t>{2, 8});
  std::vector<float> x = random_values(n, 1), d = random_values(n, 2);
  auto x_dev = DeviceBuffer<float>::from_host(x);
  auto d_dev = DeviceBuffer<float>::from_host(d);
  int calls = 0;
  const StepGraphs::Step step = [&](int64_t rows, cudaStream_t s) {
    ++calls;
    add_scaled(x_dev.data(), d_dev.data(), 0.5f, rows * kWidth, s);
  };
  auto expect_rows = [&](int64_t rows) {  // host: x += 0.5·d over `rows` rows
    for (size_t i = 0; i < static_cast<size_t>(rows * kWidth); ++i) x[i] += 0.5f * d[i];
  };

  EXPECT_EQ(graphs.run(5, stream.get(), step), StepGraphs::Ran::Captured);  // bucket 8: warm-up + capture
  EXPECT_EQ(calls, 2);
  expect_rows(8);  // only the warm-up ran
  stream.sync();
  EXPECT_EQ(x_dev.download(), x);

  d = random_values(n, 3);
  d_dev.upload(d);  // new contents at the same address
  EXPECT_EQ(graphs.run(7, stream.get(), step), StepGraphs::Ran::Replayed);
  EXPECT_EQ(calls, 2) << "a replay does not call the step";
  expect_rows(8);
  stream.sync();
  EXPECT_EQ(x_dev.download(), x);

  EXPECT_EQ(graphs.run(1, stream.get(), step), StepGraphs::Ran::Captured);  // bucket 2
  expect_rows(2);
  EXPECT_EQ(graphs.run(16, stream.get(), step), StepGraphs::Ran::Eager);    // past the largest bucket
  expect_rows(16);
  EXPECT_EQ(graphs.graphs(), 2u);
  stream.sync();
  EXPECT_EQ(x_dev.download(), x);
  EXPECT_TRUE(graphs.capture_error().empty()) << graphs.capture_error();

  // reset_except keeps one bucket's graph (it replays) and drops the others (they capture again).
  graphs.reset_except(8);
  EXPECT_EQ(graphs.graphs(), 1u);
  EXPECT_EQ(graphs.run(6, stream.get(), step), StepGraphs::Ran::Replayed);
  expect_rows(8);
  EXPECT_EQ(graphs.run(2, stream.get(), step), StepGraphs::Ran::Captured);
  expect_rows(2);
  stream.sync();
  EXPECT_EQ(x_dev.download(), x);

  graphs.reset();
  EXPECT_EQ(graphs.graphs(), 0u);
  EXPECT_EQ(graphs.run(2, stream.get(), step), StepGraphs::Ran::Captured);
}

TEST(CudaStepGraphs, AStepThatCannotBeCapturedRunsEagerly) {
  if (!cuda_device(0)) GTEST_SKIP() << "no CUDA device";
  Stream stream;
  StepGraphs graphs(std::vector<int64_t>{4});
  std::vector<float> host = random_values(64, 4);
  auto x_dev = DeviceBuffer<float>::from_host(host);
  int calls = 0;
  const StepGraphs::Step step = [&](int64_t, cudaStream_t) {
    ++calls;
    x_dev.upload(host);  // a synchronous cudaMemcpy: refused inside a capture
  };
  EXPECT_EQ(graphs.run(3, stream.get(), step), StepGraphs::Ran::Eager);
  EXPECT_FALSE(graphs.capture_error().empty());
  EXPECT_EQ(graphs.graphs(), 0u);
  EXPECT_EQ(graphs.run(3, stream.get(), step), StepGraphs::Ran::Eager);
  EXPECT_EQ(calls, 3) << "warm-up, failed capture, then eager";
  // The failed capture left nothing behind: ordinary work still runs.
  add_scaled(x_dev.data(), x_dev.data(), 1.0f, 64, stream.get());
  stream.sync();
  EXPECT_FLOAT_EQ(x_dev.download()[5], 2.f * host[5]);
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
