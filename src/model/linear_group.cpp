// SPDX-License-Identifier: Apache-2.0
#include "model/linear_group.h"

#include <fmt/format.h>

#include <cstring>

#include "fp4serve/error.h"
#include "prepare/repack.h"

namespace fp4serve::model {

LinearGroup::LinearGroup(std::vector<LinearPart> parts, std::vector<std::string> modules)
    : parts_(std::move(parts)), modules_(std::move(modules)) {
  if (parts_.empty()) throw UsageError("LinearGroup: no parts");
  in_features_ = parts_.front().weight.in_features;
  for (const auto& p : parts_) {
    if (p.weight.in_features != in_features_) {
      throw UsageError(fmt::format("LinearGroup: parts disagree on in_features ({} vs {})", p.weight.in_features,
                                   in_features_));
    }
    for (const OutputTransform& t : p.output_transforms) {
      if (!t.transform || t.offset < 0 || t.width < 1 || t.offset + t.width > p.weight.out_features ||
          t.width % t.transform->block() != 0) {
        throw UsageError(fmt::format("LinearGroup: output transform on columns [{}, {}) of a part with {} outputs",
                                     t.offset, t.offset + t.width, p.weight.out_features));
      }
    }
    out_features_ += p.weight.out_features;
  }
}

void LinearGroup::move_weights_into(prepare::HugePageArena& arena) {
  for (LinearPart& part : parts_) prepare::move_weights_into(part.weight, arena);
}

LinearPart fuse_parts(std::vector<LinearPart> parts) {
  if (parts.empty()) throw UsageError("fuse_parts: no parts");
  LinearPart fused;
  fused.activation_quant = parts.front().activation_quant;
  fused.input_transform = parts.front().input_transform;
  std::vector<prepare::PreparedLinear> weights;
  int64_t offset = 0;
  for (LinearPart& p : parts) {
    if (p.input_transform != fused.input_transform || p.activation_quant != fused.activation_quant) {
      throw UsageError("fuse_parts: parts with different input transforms or activation quantization run unfused");
    }
    for (OutputTransform t : p.output_transforms) {
      t.offset += offset;
      fused.output_transforms.push_back(std::move(t));
    }
    offset += p.weight.out_features;
    weights.push_back(std::move(p.weight));
  }
  fused.weight = prepare::concat_rows(std::move(weights));
  return fused;
}

namespace {

// y[m, stride]: each output transform of `p` on its columns (the part's columns start at y).
void apply_output_transforms(const LinearPart& p, float* y, int64_t m, int64_t stride) {
  for (const OutputTransform& t : p.output_transforms) t.transform->apply_strided(y + t.offset, m, t.width, stride);
}

}  // namespace

void LinearGroup::forward(const float* x, int64_t m, float* y, std::vector<float>& scratch) const {
  // The transformed input, recomputed only when the next part has a different transform (q|k|v share one).
  thread_local std::vector<float> transformed;
  const OnlineTransform* current = nullptr;
  auto input_for = [&](const LinearPart& p) -> const float* {
    if (!p.input_transform) return x;
    if (p.input_transform.get() != current) {
      transformed.assign(x, x + m * in_features_);
      p.input_transform->apply(transformed.data(), m, in_features_);
      current = p.input_transform.get();
    }
    return transformed.data();
  };
  if (parts_.size() == 1) {
    kernels::linear(parts_[0].weight, input_for(parts_[0]), m, y, parts_[0].activation_quant);
    apply_output_transforms(parts_[0], y, m, out_features_);
    return;
  }
  int64_t offset = 0;
  for (const auto& p : parts_) {
    const int64_t n = p.weight.out_features;
    scratch.resize(static_cast<size_t>(m * n));
    kernels::linear(p.weight, input_for(p), m, scratch.data(), p.activation_quant);
    apply_output_transforms(p, scratch.data(), m, n);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(y + r * out_features_ + offset, scratch.data() + r * n, static_cast<size_t>(n) * sizeof(float));
    }
    offset += n;
  }
}

}  // namespace fp4serve::model
