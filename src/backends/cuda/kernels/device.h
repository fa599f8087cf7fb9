// SPDX-License-Identifier: Apache-2.0
// GPU discovery and RAII owners of CUDA resources: a stream and typed device buffers. Host-facing: compiles
// with plain g++ (only the CUDA runtime API header). Every CUDA call is checked (cuda_check.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda/kernels/cuda_check.h"
#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {

/// What the kernels and benchmarks need to know about one GPU (cudaGetDeviceProperties).
struct DeviceInfo {
  int ordinal = 0;
  std::string name;             ///< e.g. "NVIDIA H200"
  int sm = 0;                   ///< compute capability as major·10 + minor: 80, 86, 89, 90, 100, 120
  int64_t total_bytes = 0;      ///< global memory, bytes
  int multiprocessors = 0;      ///< SM count
  int64_t l2_bytes = 0;         ///< L2 cache, bytes
};

/// The GPU with this ordinal, or nullopt when there is none: no driver, no device, an ordinal out of range, or
/// any other runtime error (never throws, so that callers and GPU tests can skip cleanly on CPU-only machines).
std::optional<DeviceInfo> cuda_device(int ordinal = 0);

/// An owned CUDA stream on the current device. Move-only; the destructor destroys it (pending work is not waited
/// for; call sync() first when results are needed). Throws DeviceError when creation fails.
/// It is a blocking stream (cudaStreamDefault): work on it is ordered with the legacy default stream, so the
/// synchronous copies of DeviceBuffer (cudaMemcpy, which may return before a pageable host→device DMA ends) and
/// plain cudaMemset calls are ordered with the kernels queued here. A non-blocking stream would race with them.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  /// Blocks until all work queued on the stream has finished; throws DeviceError on an asynchronous fault.
  void sync();

 private:
  cudaStream_t stream_ = nullptr;
};

/// `count` elements of T in device global memory (cudaMalloc, 256-byte aligned), uninitialised. Move-only.
/// T must be trivially copyable (bytes are copied with cudaMemcpy).
template <class T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "DeviceBuffer<T> copies T bytewise");

 public:
  DeviceBuffer() = default;
  /// Throws DeviceError when the allocation fails (out of memory, no device).
  explicit DeviceBuffer(size_t count) : size_(count) {
    if (count > 0) FP4SERVE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  /// A buffer holding a copy of `host` (synchronous). Throws DeviceError.
  static DeviceBuffer from_host(std::span<const T> host) {
    DeviceBuffer buffer(host.size());
    buffer.upload(host);
    return buffer;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);  // no check: a destructor must not throw
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t size() const { return size_; }  ///< elements
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }

  /// Copies host[0, size()) to the device (synchronous cudaMemcpy). Throws UsageError when host.size() differs
  /// from size(), DeviceError when the copy fails.
  void upload(std::span<const T> host) {
    if (host.size() != size_) {
      throw UsageError("DeviceBuffer::upload: " + std::to_string(host.size()) + " host elements for a buffer of " +
                       std::to_string(size_));
    }
    if (size_ > 0) FP4SERVE_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  /// All size() elements copied back to the host (synchronous; ordered after the work already queued on the
  /// legacy default stream and on every Stream, which are blocking streams). Throws DeviceError.
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ > 0) FP4SERVE_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp4serve::kernels::cuda
