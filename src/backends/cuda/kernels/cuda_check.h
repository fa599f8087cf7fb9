// SPDX-License-Identifier: Apache-2.0
// Error checking for every CUDA runtime and cuBLAS call of the CUDA backend. A failed call becomes a
// fp4serve::DeviceError naming file:line, the expression and the runtime's own error text, so that a failure on
// a GPU machine (where nobody can attach a debugger) is diagnosable from the one-line message.
// Host-facing: compiles with plain g++ (needs only the CUDA runtime API and cuBLAS headers).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace fp4serve::kernels::cuda {

/// Throws DeviceError "<file>:<line>: <expr> failed: <cudaGetErrorName>: <cudaGetErrorString>".
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line);

/// Throws DeviceError "<file>:<line>: <expr> failed: cuBLAS status <n> (<cublasGetStatusString>)".
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);

/// After a kernel launch: throws DeviceError when the launch itself failed (cudaGetLastError: bad configuration,
/// no kernel image for this GPU). With `synchronize` it also waits for the device so that a fault inside the
/// kernel is reported at its launch site; FP4SERVE_CUDA_CHECK_LAUNCH passes true in debug builds only, since
/// a synchronization after every launch would serialize the stream. While this thread captures a CUDA graph
/// (graph.h) it never synchronizes: a synchronization would invalidate the capture.
void check_launch(const char* file, int line, bool synchronize);

/// Marks this host thread as capturing a CUDA graph (set by StepGraphs around a capture).
void set_thread_capturing(bool capturing);

}  // namespace fp4serve::kernels::cuda

/// Evaluates a cudaError_t expression once; throws fp4serve::DeviceError unless it is cudaSuccess.
#define FP4SERVE_CUDA_CHECK(expr)                                                              \
  do {                                                                                         \
    const cudaError_t fp4serve_cuda_status_ = (expr);                                          \
    if (fp4serve_cuda_status_ != cudaSuccess) {                                                \
      ::fp4serve::kernels::cuda::throw_cuda_error(fp4serve_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)

/// Evaluates a cublasStatus_t expression once (cuBLAS and cuBLASLt); throws fp4serve::DeviceError on failure.
#define FP4SERVE_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                           \
    const cublasStatus_t fp4serve_cublas_status_ = (expr);                                       \
    if (fp4serve_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      ::fp4serve::kernels::cuda::throw_cublas_error(fp4serve_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)

/// Put right after every kernel launch (`kernel<<<...>>>(...); FP4SERVE_CUDA_CHECK_LAUNCH();`). Release builds
/// check the launch only; debug builds (no NDEBUG) also synchronize so that faults surface at the launch.
#ifdef NDEBUG
#define FP4SERVE_CUDA_CHECK_LAUNCH() ::fp4serve::kernels::cuda::check_launch(__FILE__, __LINE__, false)
#else
#define FP4SERVE_CUDA_CHECK_LAUNCH() ::fp4serve::kernels::cuda::check_launch(__FILE__, __LINE__, true)
#endif
