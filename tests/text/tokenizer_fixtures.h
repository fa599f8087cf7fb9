// SPDX-License-Identifier: Apache-2.0
// The tokenizer fixtures the text suites share (tests/data/tokenizers, made by tools/): their folder and the
// JSON readers, one definition each (also what a unity build of text_test needs).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fp4serve::text::test_support {

inline const std::string kDir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/";

// checkpoint::read_json_object_file's contract (null json for an absent file, as Tokenizer takes a missing
// tokenizer_config.json; an error naming the file when it is unreadable, not JSON or not an object), written
// here so that text_test links the text module alone: a malformed fixture fails loudly instead of parsing an
// empty stream.
inline nlohmann::json read_json(const std::string& path) {
  if (!std::filesystem::exists(path)) return nlohmann::json();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!parsed.is_object()) throw std::runtime_error(path + ": expected a JSON object, found " + parsed.type_name());
  return parsed;
}

// A golden file read with its keys in file order (the published-template goldens: messages as transformers saw
// them). Throws naming the file when it cannot be opened or parsed.
inline nlohmann::ordered_json read_ordered(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::ordered_json::parse(buffer.str());
}

}  // namespace fp4serve::text::test_support
