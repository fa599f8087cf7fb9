// SPDX-License-Identifier: Apache-2.0
// Proves the CUDA toolchain path in every build that finds nvcc: a tiny kernel that decodes E2M1 codes on
// the device. The real CUDA kernels (weight-only FP4 GEMM, model ops) replace this probe's role later.
#include <cstdint>

namespace fp4serve::kernels::cuda {

__global__ void decode_e2m1_probe(const uint8_t* packed, float* out, int n_bytes) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n_bytes) return;
  constexpr float kLut[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  out[2 * j] = kLut[packed[j] & 0xF];
  out[2 * j + 1] = kLut[packed[j] >> 4];
}

}  // namespace fp4serve::kernels::cuda
