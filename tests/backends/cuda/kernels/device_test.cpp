// SPDX-License-Identifier: Apache-2.0
// Device discovery, RAII buffers and error checks. Without a GPU the allocation paths must throw DeviceError with
// a message naming the call (never crash); with one, an upload/download round trip must return the bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/cuda_check.h"
#include "backends/cuda/kernels/device.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {
namespace {

TEST(CudaDevice, ReportsDeviceOrNothingWithoutThrowing) {
  const auto info = cuda_device(0);
  if (!info) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  EXPECT_FALSE(info->name.empty());
  EXPECT_GE(info->sm, 50);
  EXPECT_GT(info->total_bytes, int64_t{1} << 30);
  EXPECT_GT(info->multiprocessors, 0);
  EXPECT_GT(info->l2_bytes, 0);
}

TEST(CudaDevice, OutOfRangeOrdinalIsNullopt) {
  EXPECT_FALSE(cuda_device(-1).has_value());
  EXPECT_FALSE(cuda_device(1 << 20).has_value());
}

TEST(CudaCheck, FailedCallThrowsDeviceErrorNamingTheCall) {
  try {
    FP4SERVE_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "expected DeviceError";
  } catch (const DeviceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("device_test.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaErrorInvalidValue"), std::string::npos) << message;
  }
  EXPECT_THROW(FP4SERVE_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED), DeviceError);
  EXPECT_NO_THROW(FP4SERVE_CUDA_CHECK(cudaSuccess));
}

TEST(CudaDevice, WithoutGpuAllocationThrowsDeviceError) {
  if (cuda_device(0)) GTEST_SKIP() << "a CUDA device is present; this test covers CPU-only machines";
  EXPECT_THROW(DeviceBuffer<float>(16), DeviceError);
  EXPECT_THROW(Stream(), DeviceError);
  EXPECT_NO_THROW(DeviceBuffer<float>(0));  // an empty buffer allocates nothing
}

TEST(CudaDevice, BufferRoundTripAndSizeCheck) {
  if (!cuda_device(0)) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(9);
  std::vector<uint16_t> host(1001);
  for (auto& v : host) v = static_cast<uint16_t>(rng());
  auto buffer = DeviceBuffer<uint16_t>::from_host(host);
  EXPECT_EQ(buffer.size(), host.size());
  EXPECT_EQ(buffer.download(), host);
  const std::vector<uint16_t> wrong(7, 1);
  EXPECT_THROW(buffer.upload(wrong), UsageError);
  DeviceBuffer<uint16_t> moved = std::move(buffer);
  EXPECT_EQ(moved.download(), host);
  Stream stream;
  EXPECT_NO_THROW(stream.sync());
}

}  // namespace
}  // namespace fp4serve::kernels::cuda
