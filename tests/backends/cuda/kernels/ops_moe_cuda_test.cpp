// SPDX-License-Identifier: Apache-2.0
// The GPU ops of backends/cuda/kernels/ops_moe.h (MoE combine, the swiglu-oai expert activation, the shared expert's
// sigmoid gate, the online FWHT / dense block rotations) against their CPU kernels (themselves checked against float64
// in tests/backends/cpu/kernels) or, where the CPU side is a loop of backends::cpu::CpuBackend, against float64 written
// here. Seeded random non-zero inputs, odd sizes, strided slices. The argument checks run on the host before any
// launch, so they run everywhere; the GPU cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels/activation.h"
#include "backends/cpu/kernels/hadamard.h"
#include "backends/cpu/kernels/ops_test_util.h"
#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/device.h"
#include "backends/cuda/kernels/ops_moe.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {
namespace {

using kernels::testing::random_nonzero;

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  return DeviceBuffer<T>::from_host(std::span<const T>(host));
}

template <class T>
std::vector<T> to_host(const DeviceBuffer<T>& d) {
  FP4SERVE_CUDA_CHECK(cudaDeviceSynchronize());
  return d.download();
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << "at " << at << ": got " << got[at] << ", want " << want[at];
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

constexpr cudaStream_t kDefaultStream = nullptr;

class CudaMoeOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device(0)) GTEST_SKIP() << "no CUDA GPU on this machine";
  }
};

TEST_F(CudaMoeOps, ScatterAddRowsMatchesFloat64) {
  const int64_t width = 37, tokens = 11;
  const std::vector<int64_t> rows = {7, 0, 10, 3, 5};
  const std::vector<float> y = random_nonzero(rows.size() * width, 3);
  const std::vector<float> w = {0.25f, -0.5f, 0.75f, 0.125f, 1.5f};
  const std::vector<float> base = random_nonzero(static_cast<size_t>(tokens * width), 4);
  std::vector<double> want(base.begin(), base.end());
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t c = 0; c < width; ++c) want[rows[r] * width + c] += static_cast<double>(y[r * width + c]) * w[r];
  }
  auto out = to_device(base);
  scatter_add_rows(to_device(y).data(), width, to_device(rows).data(), to_device(w).data(),
                   static_cast<int64_t>(rows.size()), out.data(), kDefaultStream);
  expect_close(to_host(out), want, 1e-6);
}

TEST_F(CudaMoeOps, SwigluOaiMatchesTheCpuKernel) {
  const int64_t m = 5, inter = 43;
  std::vector<float> x = random_nonzero(static_cast<size_t>(m * 2 * inter), 5);
  for (float& v : x) v *= 9.0f;  // past the swiglu limit on both sides
  std::vector<float> want(static_cast<size_t>(m * inter));
  kernels::swiglu_oai_and_mul(x.data(), m, inter, 1.702f, 7.0f, want.data());
  const auto xd = to_device(x);
  DeviceBuffer<float> out(want.size());
  swiglu_oai_and_mul(xd.data(), m, inter, 1.702f, 7.0f, out.data(), kDefaultStream);
  expect_close(to_host(out), widen(want), 1e-6);
}

TEST_F(CudaMoeOps, SigmoidGatedAddMatchesFloat64) {
  const int64_t m = 6, width = 29;
  const std::vector<float> y = random_nonzero(static_cast<size_t>(m * width), 6);
  const std::vector<float> gate = random_nonzero(static_cast<size_t>(m), 7);
  const std::vector<float> base = random_nonzero(static_cast<size_t>(m * width), 8);
  std::vector<double> want(base.begin(), base.end());
  for (int64_t t = 0; t < m; ++t) {
    const double g = 1.0 / (1.0 + std::exp(-static_cast<double>(gate[t])));
    for (int64_t c = 0; c < width; ++c) want[t * width + c] += g * y[t * width + c];
  }
  auto out = to_device(base);
  add_sigmoid_gated(to_device(y).data(), to_device(gate).data(), m, width, out.data(), kDefaultStream);
  expect_close(to_host(out), want, 1e-6);
  fill(out.data(), m * width, -2.5f, kDefaultStream);
  for (float v : to_host(out)) ASSERT_EQ(v, -2.5f);
}

// One shard's slice (columns [offset, offset + width) of rows `stride` apart) against the CPU kernel on that slice.
TEST_F(CudaMoeOps, FwhtAndDenseRotationOnStridedSlicesMatchTheCpuKernels) {
  const int64_t rows = 7, stride = 200, offset = 40, width = 128;
  for (int64_t block : {2, 16, 32, 128}) {
    SCOPED_TRACE(block);
    const std::vector<float> x = random_nonzero(static_cast<size_t>(rows * stride), 9 + static_cast<uint32_t>(block));
    std::vector<float> want = x;
    for (int64_t r = 0; r < rows; ++r) kernels::fwht_blocks(want.data() + r * stride + offset, 1, width, block);
    auto d = to_device(x);
    fwht_blocks(d.data() + offset, rows, width, stride, block, kDefaultStream);
    expect_close(to_host(d), widen(want), 1e-6);

    const std::vector<float> matrix = random_nonzero(static_cast<size_t>(block * block), 30 + static_cast<uint32_t>(block));
    want = x;
    for (int64_t r = 0; r < rows; ++r) kernels::rotate_blocks(want.data() + r * stride + offset, 1, width, matrix.data(), block);
    d = to_device(x);
    rotate_blocks(d.data() + offset, rows, width, stride, to_device(matrix).data(), block, kDefaultStream);
    expect_close(to_host(d), widen(want), 1e-5);
  }
}

// Host-side checks: refused before anything is launched, so they run without a GPU.
TEST(CudaMoeOpsHost, BadShapesAreRefusedBeforeLaunch) {
  float* none = nullptr;
  EXPECT_THROW(fwht_blocks(none, 1, 12, 12, 8, kDefaultStream), UsageError);   // 8 does not divide 12
  EXPECT_THROW(fwht_blocks(none, 1, 12, 12, 3, kDefaultStream), UsageError);   // not a power of two
  EXPECT_THROW(fwht_blocks(none, 1, 16, 8, 8, kDefaultStream), UsageError);    // width > stride
  EXPECT_THROW(fwht_blocks(none, 1, 8192, 8192, 8192, kDefaultStream), UsageError);  // above the shared-memory block
  EXPECT_THROW(rotate_blocks(none, 1, 10, 10, none, 4, kDefaultStream), UsageError);
  EXPECT_THROW(rotate_blocks(none, -1, 8, 8, none, 4, kDefaultStream), UsageError);
  EXPECT_THROW(swiglu_oai_and_mul(none, 1, 4, 1.702f, 0.0f, none, kDefaultStream), UsageError);
  EXPECT_THROW(scatter_add_rows(none, 4, nullptr, none, -1, none, kDefaultStream), UsageError);
  EXPECT_THROW(add_sigmoid_gated(none, none, -1, 4, none, kDefaultStream), UsageError);
  EXPECT_THROW(fill(none, -1, 0.0f, kDefaultStream), UsageError);
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
