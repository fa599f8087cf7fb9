// SPDX-License-Identifier: Apache-2.0
// What the model needs from a loaded checkpoint: plain tensors (norms, embeddings) and prepared linear groups.
// The implementation behind it (model/planned_weights.h) follows the per-layer plan; tests can supply their own.
#pragma once

#include <string>
#include <vector>

#include "core/tensor_view.h"
#include "model/linear_group.h"

namespace fp4serve::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The checkpoint tensor `name` (full name, e.g. "model.norm.weight"). Throws FormatError when absent.
  virtual core::TensorView tensor(const std::string& name) const = 0;
  virtual bool has_tensor(const std::string& name) const = 0;
  /// The linear modules `modules` (module paths without ".weight", in output order) prepared for execution,
  /// fused into one part when the plan runs them fused. Throws FormatError/UnsupportedError naming the module.
  virtual LinearGroup linear_group(const std::vector<std::string>& modules) const = 0;
};

}  // namespace fp4serve::model
