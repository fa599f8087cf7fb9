// SPDX-License-Identifier: Apache-2.0
#include "core/tensor_view.h"

namespace fp4serve::core {

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace fp4serve::core
