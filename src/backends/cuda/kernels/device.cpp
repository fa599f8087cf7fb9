// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/kernels/device.h"

namespace fp4serve::kernels::cuda {

std::optional<DeviceInfo> cuda_device(int ordinal) {
  int count = 0;
  // Without a driver this returns cudaErrorNoDevice or cudaErrorInsufficientDriver: both mean "no GPU here".
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal < 0 || ordinal >= count) {
    cudaGetLastError();  // clear the error so a later FP4SERVE_CUDA_CHECK_LAUNCH does not report it
    return std::nullopt;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.sm = prop.major * 10 + prop.minor;
  info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.multiprocessors = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  return info;
}

Stream::Stream() { FP4SERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault)); }

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::sync() { FP4SERVE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace fp4serve::kernels::cuda
