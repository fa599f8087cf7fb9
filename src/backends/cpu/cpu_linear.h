// SPDX-License-Identifier: Apache-2.0
// The CPU backend's linear groups and online transforms: a model::LinearGroup run on the CPU GEMM kernels
// (backends/cpu/kernels/linear.h), its parts' online input / output transforms and the attention transforms on the
// Hadamard kernels (backends/cpu/kernels/hadamard.h). model/ describes both (linear_group.h, online_transform.h); this
// is how the CPU computes them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backends/cpu/kernels/hadamard.h"
#include "backends/cpu/kernels/linear.h"
#include "backends/cpu/prepare/prepared_linear.h"
#include "backends/cpu/prepare/weight_cache.h"
#include "model/linear_group.h"
#include "model/online_transform.h"

namespace fp4serve::backends::cpu {

/// The CPU kernels' activation emulation of a part's (model::ActivationEmulation).
kernels::ActivationEmulation activation_emulation_of(model::ActivationEmulation emulation);

/// An online transform as the CPU runs it: the model's description and, for a KroneckerHadamard transform, the
/// kernel with its mixing matrix in the CPU's Dense layout (made once per transform).
struct CpuTransform {
  std::shared_ptr<const model::OnlineTransform> transform;
  kernels::KroneckerHadamardKernel kronecker;  ///< KroneckerHadamard only; points into *transform
};
/// Throws UsageError for a null transform, what kernels::prepare_kronecker_hadamard throws.
CpuTransform make_cpu_transform(std::shared_ptr<const model::OnlineTransform> transform);

/// Makes each transform's CpuTransform once: transforms are shared by the parts of a group and across layers
/// (model::TransformCache), and so are their CPU forms.
class CpuTransforms {
 public:
  /// Null for null.
  std::shared_ptr<const CpuTransform> get(const std::shared_ptr<const model::OnlineTransform>& transform);

 private:
  std::unordered_map<const model::OnlineTransform*, std::shared_ptr<const CpuTransform>> made_;
};

/// x[rows, dim] f32, in place: each b-wide slice of every row ← slice · M̂ (kernels::fwht_blocks, rotate_blocks or
/// kronecker_hadamard_blocks by t.transform->kernel()). Throws UsageError when b does not divide dim.
void apply_transform(const CpuTransform& t, float* x, int64_t rows, int64_t dim);
/// The same on the columns [0, width) of rows `stride` floats apart (one shard's slice of a concatenated output,
/// e.g. k of q|k|v). Throws UsageError when b does not divide width or width > stride.
void apply_transform_strided(const CpuTransform& t, float* x, int64_t rows, int64_t width, int64_t stride);

/// One part of a linear group in the CPU layout (model::LinearPart after the CPU's repack).
struct CpuLinearPart {
  prepare::PreparedLinear weight;
  kernels::ActivationEmulation activation = kernels::ActivationEmulation::None;
  std::shared_ptr<const CpuTransform> input_transform;  ///< null: none
  struct Output {
    int64_t offset = 0, width = 0;
    std::shared_ptr<const CpuTransform> transform;
  };
  std::vector<Output> output_transforms;
};

/// A model::LinearGroup as the CPU runs it.
struct CpuLinearGroup {
  std::vector<CpuLinearPart> parts;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

/// The CPU's repack of a group (prepare::prepare_linear per part, checkpoint order → tile pairs). Parts without an
/// activation emulation run with `precision` (--activation-precision; ignored by layouts other than Fp4 and Int4),
/// Int4 parts with `int4_precision` where given. With an
/// `arena`, the weight bytes a decode step streams are moved into it (huge pages). Throws what prepare_linear and
/// make_cpu_transform throw. With a `cache`, a part the cache holds (by prepare::weight_fingerprint) is taken from
/// it instead of being repacked, and a part repacked here is stored in it.
CpuLinearGroup prepare_linear_group(model::LinearGroup group, CpuTransforms& transforms,
                                    prepare::ActivationPrecision precision = prepare::ActivationPrecision::Fp32,
                                    prepare::HugePageArena* arena = nullptr, prepare::WeightCache* cache = nullptr,
                                    std::optional<prepare::ActivationPrecision> int4_precision = std::nullopt);
/// The same with transforms of its own (tests, tools).
CpuLinearGroup prepare_linear_group(model::LinearGroup group,
                                    prepare::ActivationPrecision precision = prepare::ActivationPrecision::Fp32);

/// y[m, out_features] = concat over parts of U_part(T_part(x[m, K]) · W_partᵀ (+ bias_part)), T_part the part's
/// online input transform and U_part its output transforms per slice (identity where absent). `scratch` is reused
/// between calls to avoid allocations when there is more than one part; x is never modified (a transformed copy
/// lives in a per-thread buffer).
void linear_forward(const CpuLinearGroup& group, const float* x, int64_t m, float* y, std::vector<float>& scratch);

}  // namespace fp4serve::backends::cpu
