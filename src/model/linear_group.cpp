// SPDX-License-Identifier: Apache-2.0
#include "model/linear_group.h"

#include <fmt/format.h>

#include <algorithm>

#include "fp4serve/error.h"

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
      if (!t.transform || t.offset < 0 || t.width < 1 || t.offset + t.width > p.weight.out_features() ||
          t.width % t.transform->block() != 0) {
        throw UsageError(fmt::format("LinearGroup: output transform on columns [{}, {}) of a part with {} outputs",
                                     t.offset, t.offset + t.width, p.weight.out_features()));
      }
    }
    out_features_ += p.weight.out_features();
  }
}

LinearPart fuse_parts(std::vector<LinearPart> parts) {
  if (parts.empty()) throw UsageError("fuse_parts: no parts");
  LinearPart fused;
  fused.activation_quant = parts.front().activation_quant;
  fused.input_transform = parts.front().input_transform;
  fused.lm_head = std::all_of(parts.begin(), parts.end(), [](const LinearPart& p) { return p.lm_head; });
  std::vector<quant::LinearWeights> weights;
  int64_t offset = 0;
  for (LinearPart& p : parts) {
    if (p.input_transform != fused.input_transform || p.activation_quant != fused.activation_quant) {
      throw UsageError("fuse_parts: parts with different input transforms or activation quantization run unfused");
    }
    for (OutputTransform t : p.output_transforms) {
      t.offset += offset;
      fused.output_transforms.push_back(std::move(t));
    }
    offset += p.weight.out_features();
    weights.push_back(std::move(p.weight));
  }
  fused.weight = quant::stack_rows(std::move(weights));
  return fused;
}

}  // namespace fp4serve::model
