// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/cpu_linear.h"

#include <fmt/format.h>

#include <cstring>

#include "backends/cpu/kernels/hadamard.h"
#include "backends/cpu/prepare/repack.h"
#include "fp4serve/error.h"

namespace fp4serve::backends::cpu {

using model::LinearPart;
using model::OnlineTransform;
using model::OutputTransform;
using model::TransformKernel;

kernels::ActivationEmulation activation_emulation_of(model::ActivationEmulation emulation) {
  switch (emulation) {
    case model::ActivationEmulation::None: return kernels::ActivationEmulation::None;
    case model::ActivationEmulation::EmulateNvfp4: return kernels::ActivationEmulation::EmulateNvfp4;
    case model::ActivationEmulation::EmulateMxfp4: return kernels::ActivationEmulation::EmulateMxfp4;
  }
  return kernels::ActivationEmulation::None;
}

CpuTransform make_cpu_transform(std::shared_ptr<const OnlineTransform> transform) {
  if (!transform) throw UsageError("make_cpu_transform: null online transform");
  CpuTransform t;
  if (transform->kernel() == TransformKernel::KroneckerHadamard) {
    t.kronecker = kernels::prepare_kronecker_hadamard(*transform->structured());
  }
  t.transform = std::move(transform);
  return t;
}

std::shared_ptr<const CpuTransform> CpuTransforms::get(const std::shared_ptr<const OnlineTransform>& transform) {
  if (!transform) return nullptr;
  auto& made = made_[transform.get()];
  if (!made) made = std::make_shared<const CpuTransform>(make_cpu_transform(transform));
  return made;
}

void apply_transform(const CpuTransform& ct, float* x, int64_t rows, int64_t dim) {
  const OnlineTransform& t = *ct.transform;
  const int64_t block = t.block();
  if (dim % block != 0) {
    throw UsageError(fmt::format("online transform: block {} does not divide the input width {}", block, dim));
  }
  switch (t.kernel()) {
    case TransformKernel::Fwht: kernels::fwht_blocks(x, rows, dim, block); return;
    case TransformKernel::Dense: kernels::rotate_blocks(x, rows, dim, t.matrix().data(), block); return;
    case TransformKernel::KroneckerHadamard:
      kernels::kronecker_hadamard_blocks(ct.kronecker, x, rows, dim);
      return;
  }
}

void apply_transform_strided(const CpuTransform& t, float* x, int64_t rows, int64_t width, int64_t stride) {
  const int64_t block = t.transform->block();
  if (width > stride || width % block != 0) {
    throw UsageError(fmt::format("online transform: block {} on a {}-wide slice of {}-float rows", block, width, stride));
  }
  if (width == stride) {
    apply_transform(t, x, rows, width);
    return;
  }
  // One kernel call per row in place: measured faster than gathering the slice into a contiguous block for one
  // call (bench_ops BM_FwhtStridedSlice: 0.68 vs 1.06 ms for a 512×1024 slice, b128, on 2 busy cores).
  for (int64_t r = 0; r < rows; ++r) apply_transform(t, x + r * stride, 1, width);
}

namespace {

// y[m, stride]: each output transform of `p` on its columns (the part's columns start at y).
void apply_output_transforms(const CpuLinearPart& p, float* y, int64_t m, int64_t stride) {
  for (const CpuLinearPart::Output& t : p.output_transforms) {
    apply_transform_strided(*t.transform, y + t.offset, m, t.width, stride);
  }
}

}  // namespace

CpuLinearGroup prepare_linear_group(model::LinearGroup group, CpuTransforms& transforms,
                                    prepare::ActivationPrecision precision, prepare::HugePageArena* arena,
                                    prepare::WeightCache* cache,
                                    std::optional<prepare::ActivationPrecision> int4_precision) {
  CpuLinearGroup out;
  out.in_features = group.in_features();
  out.out_features = group.out_features();
  for (LinearPart& p : group.parts()) {
    CpuLinearPart part;
    // The repack writes the resident copy straight into the arena (huge pages: the bytes every decode step
    // streams); the checkpoint-order weights (views, or owned slices) go right after. A weight cache's copy is a
    // view of its mapped file instead (prepare/weight_cache.h).
    std::optional<prepare::PreparedLinear> cached = cache != nullptr ? cache->find(p.weight) : std::nullopt;
    if (cached) {
      part.weight = std::move(*cached);
    } else {
      part.weight = prepare::prepare_linear(p.weight, arena);
      if (cache != nullptr) cache->store(p.weight, part.weight);
    }
    // Dense layers other than the lm_head (a bf16 checkpoint's projections, MoE routers) keep fp32 x. The lm_head
    // takes the precision: under bf16 (or bf16-decode-int8) linear() runs its bf16 weight with bf16 x above the
    // dense GEMV's 4 rows, as llama.cpp (x converted to the weight's dot type) and GPU engines (bf16 throughout) do;
    // its cost is in tests/model/run_precision_test.cpp (llama-bf16, bound 3e-3 of max|logit|) and
    // docs/performance.md (mean KLD on the default model).
    const bool dense_fp32_x = p.weight.encoding == quant::WeightEncoding::Dense && !p.lm_head;
    p.weight = quant::LinearWeights();
    // Int4 layers may take another precision (model::choose_int4_activation_precision: int8 under auto).
    const bool int4 = part.weight.layout == prepare::WeightLayout::Int4;
    if (p.activation_quant == model::ActivationEmulation::None && !dense_fp32_x) {
      part.weight.activation_precision = int4 ? int4_precision.value_or(precision) : precision;
    }
    part.activation = activation_emulation_of(p.activation_quant);
    part.input_transform = transforms.get(p.input_transform);
    for (const OutputTransform& t : p.output_transforms) {
      part.output_transforms.push_back({t.offset, t.width, transforms.get(t.transform)});
    }
    out.parts.push_back(std::move(part));
  }
  return out;
}

CpuLinearGroup prepare_linear_group(model::LinearGroup group, prepare::ActivationPrecision precision) {
  CpuTransforms transforms;
  return prepare_linear_group(std::move(group), transforms, precision, nullptr);
}

void linear_forward(const CpuLinearGroup& group, const float* x, int64_t m, float* y, std::vector<float>& scratch) {
  const std::vector<CpuLinearPart>& parts = group.parts;
  const int64_t in_features = group.in_features;
  const int64_t out_features = group.out_features;
  // The transformed input, recomputed only when the next part has a different transform (q|k|v share one).
  thread_local std::vector<float> transformed;
  const CpuTransform* current = nullptr;
  auto input_for = [&](const CpuLinearPart& p) -> const float* {
    if (!p.input_transform) return x;
    if (p.input_transform.get() != current) {
      transformed.assign(x, x + m * in_features);
      apply_transform(*p.input_transform, transformed.data(), m, in_features);
      current = p.input_transform.get();
    }
    return transformed.data();
  };
  if (parts.size() == 1) {
    kernels::linear(parts[0].weight, input_for(parts[0]), m, y, parts[0].activation);
    apply_output_transforms(parts[0], y, m, out_features);
    return;
  }
  int64_t offset = 0;
  for (const auto& p : parts) {
    const int64_t n = p.weight.out_features;
    scratch.resize(static_cast<size_t>(m * n));
    kernels::linear(p.weight, input_for(p), m, scratch.data(), p.activation);
    apply_output_transforms(p, scratch.data(), m, n);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(y + r * out_features + offset, scratch.data() + r * n, static_cast<size_t>(n) * sizeof(float));
    }
    offset += n;
  }
}

}  // namespace fp4serve::backends::cpu
