// SPDX-License-Identifier: Apache-2.0
// Each CLI subcommand lives in its own cmd_<name>.cpp and registers itself on the root CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace fp4serve::app {

/// `fp4serve inspect PATH [--json]`: tensor table, per-dtype totals and the detected producer (headers only).
void register_inspect(CLI::App& root);

/// `fp4serve explain -m DIR [--device D] [--activation-quant auto|weight-only|emulate] [--json] [--check-scales]`:
/// the per-layer scheme plan (table grouped by identical decisions, notices, byte totals). Exits 1 when a layer
/// has no scheme on the device.
void register_explain(CLI::App& root);

}  // namespace fp4serve::app
