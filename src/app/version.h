// SPDX-License-Identifier: Apache-2.0
// `fp4serve --version`: what this binary is and what it can run.
#pragma once

#include <string>

namespace fp4serve::app {

/// "fp4serve 0.1.0 (git c2d5dcd…, Release)\nSIMD targets compiled: AVX3_SPR AVX3 … (this CPU runs AVX3)\nCUDA: …".
std::string version_text();

}  // namespace fp4serve::app
