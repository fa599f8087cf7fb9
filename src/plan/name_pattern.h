// SPDX-License-Identifier: Apache-2.0
// Collapses layer and expert indices of a module name into `*` so that identical decisions across layers print
// as one row: "model.layers.3.mlp.experts.7.w1" → "model.layers.*.mlp.experts.*.w1".
#pragma once

#include <string>
#include <string_view>

namespace fp4serve::plan {

/// Replaces every dot-separated all-digit component of `name` by `*`. Module names in the supported
/// architectures use digits only for layer and expert indices.
std::string name_pattern(std::string_view name);

}  // namespace fp4serve::plan
