// SPDX-License-Identifier: Apache-2.0
// The tokenizer fixtures the runtime suites share (tests/data/tokenizers, made by tools/): their folder and the
// JSON reader, one definition each (also what a unity build of runtime_test needs).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "checkpoint/checkpoint.h"

namespace fp4serve::runtime::test_support {

inline const std::string kDir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/";

// The project's own reader: a missing or malformed fixture fails loudly instead of parsing an empty stream.
inline nlohmann::json read_json(const std::string& path) { return checkpoint::read_json_object_file(path); }

}  // namespace fp4serve::runtime::test_support
