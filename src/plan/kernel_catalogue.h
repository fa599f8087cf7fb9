// SPDX-License-Identifier: Apache-2.0
// What a device can run, asked per layer. Each backend answers for its own device (backends/cpu/catalogue.h,
// backends/cuda/catalogue.h): given a scheme and a layer's shape, the kernel it will run — a name users see — or
// the reason it cannot. The plan asks the catalogue for every scheme candidate (select.h), `explain` prints the
// answer, and the loader plans with the catalogue of the backend it loads into, so explain never promises what
// loading refuses and nothing is planned that has no kernel. The same idea as vLLM's per-kernel
// `can_implement`, ggml's `supports_op` and CTranslate2's per-device op implementations.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "checkpoint/architecture.h"
#include "plan/device_caps.h"
#include "plan/scheme.h"

namespace fp4serve::plan {

/// One linear module (or embedding) as a catalogue sees it: the scheme asked for and the checkpoint's shape.
struct LinearQuery {
  SchemeId scheme = SchemeId::Unquantized;
  checkpoint::ModuleRole role = checkpoint::ModuleRole::QProj;
  int64_t out_features = 0;       ///< N of the whole module (per expert for fused 3-D experts), before any TP split
  int64_t in_features = 0;        ///< K
  int64_t group_size = 0;         ///< elements per weight scale group along K; 0 for channel / tensor / unquantized
  bool activation_order = false;  ///< `weight_g_idx`: the columns run in a permuted order (GPTQ actorder=group)
  bool fused_experts = false;     ///< a fused 3-D [E, N, K] experts tensor (GPT-OSS native MXFP4)
};

/// Attention of the model: one kernel serves every layer (sliding-window layers included).
struct AttentionQuery {
  int64_t head_dim = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
};

/// An online transform (compressed-tensors `transform_config`) of block b run at inference.
struct TransformQuery {
  int64_t block = 0;  ///< b: the stored matrix is [b, b]
};

/// A catalogue's answer.
struct KernelChoice {
  std::string kernel;   ///< e.g. "fp4-gemv+panel-gemm AVX3", "cuda fp4-mma (sm80)"; empty when nothing runs
  std::string why_not;  ///< set exactly when kernel is empty: what the device or the project lacks
  /// false: the kernel is compiled and host-tested, but the project has never run it on this kind of device
  /// (`explain --verbose` says so).
  bool hardware_verified = true;

  bool ok() const { return !kernel.empty(); }
  static KernelChoice runs(std::string kernel, bool hardware_verified = true) {
    return {std::move(kernel), {}, hardware_verified};
  }
  static KernelChoice refused(std::string why) { return {{}, std::move(why), false}; }
};

/// The kernels one device runs. Implementations never throw from these queries.
class KernelCatalogue {
 public:
  virtual ~KernelCatalogue() = default;
  /// The device it answers for (detected, or a `--device smNN` dry run).
  virtual const DeviceCaps& device() const = 0;
  /// "cpu-avx512", "cpu-neon", "cuda-sm90": the backend column of `explain`.
  virtual std::string backend() const = 0;
  virtual KernelChoice linear(const LinearQuery& query) const = 0;
  virtual KernelChoice attention(const AttentionQuery& query) const = 0;
  virtual KernelChoice online_transform(const TransformQuery& query) const = 0;
};

}  // namespace fp4serve::plan
