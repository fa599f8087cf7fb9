// SPDX-License-Identifier: Apache-2.0
#include "backends/cuda/kernels/cuda_check.h"

#include <string>

#include "fp4serve/error.h"

namespace fp4serve::kernels::cuda {

void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                    cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: cuBLAS status " +
                    std::to_string(static_cast<int>(status)) + " (" + cublasGetStatusString(status) + ")");
}

namespace {
thread_local bool g_capturing = false;
}  // namespace

void set_thread_capturing(bool capturing) { g_capturing = capturing; }

void check_launch(const char* file, int line, bool synchronize) {
  // cudaGetLastError also clears a sticky launch error so the next check does not report this one again.
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) throw_cuda_error(launch, "kernel launch", file, line);
  if (synchronize && !g_capturing) {
    const cudaError_t run = cudaDeviceSynchronize();
    if (run != cudaSuccess) throw_cuda_error(run, "kernel execution (debug-build synchronize)", file, line);
  }
}

}  // namespace fp4serve::kernels::cuda
