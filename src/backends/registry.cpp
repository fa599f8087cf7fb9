// SPDX-License-Identifier: Apache-2.0
#include "backends/registry.h"

#include "backends/cpu/catalogue.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/catalogue.h"
#include "fp4serve/error.h"
#if FP4SERVE_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace fp4serve::backends {
namespace {
#if FP4SERVE_HAVE_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif
}  // namespace

std::unique_ptr<model::Backend> make_cpu_backend(model::KvCacheDtype kv_cache_dtype,
                                                 prepare::ActivationPrecision activation_precision,
                                                 std::shared_ptr<prepare::WeightCache> weight_cache,
                                                 std::optional<prepare::ActivationPrecision> int4_activation_precision) {
  return std::make_unique<cpu::CpuBackend>(kv_cache_dtype, activation_precision, std::move(weight_cache),
                                           int4_activation_precision);
}

#if FP4SERVE_HAVE_CUDA
// The GPU routes MoE tokens on the host with the CPU's softmax and top-k: the same experts as the CPU for the same
// logits. The registry joins the two wings; neither includes the other.
std::unique_ptr<model::Backend> make_cuda_backend(int ordinal) {
  return std::make_unique<cuda::CudaBackend>(ordinal, cpu::router_math());
}
#else
std::unique_ptr<model::Backend> make_cuda_backend(int /*ordinal*/) {
  throw UnsupportedError("--device cuda: this fp4serve was built without the CUDA backend (no nvcc at configure time, "
                         "or FP4SERVE_CUDA=OFF); use --device cpu, or --device sm80 … sm120 for a dry-run plan");
}
#endif

std::unique_ptr<plan::KernelCatalogue> catalogue_for(const plan::DeviceCaps& device) {
  switch (device.kind) {
    case plan::DeviceKind::Cpu: return std::make_unique<cpu::CpuCatalogue>(device);
    case plan::DeviceKind::Cuda:
      // A dry run (`--device sm90`) asks what a CUDA build would run; a detected GPU, what this build runs.
      return std::make_unique<cuda::CudaCatalogue>(device, !device.detected || kCudaBuilt);
  }
  return std::make_unique<cpu::CpuCatalogue>(device);
}

}  // namespace fp4serve::backends
