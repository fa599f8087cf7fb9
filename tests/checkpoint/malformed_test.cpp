// SPDX-License-Identifier: Apache-2.0
// The malformed-checkpoint corpus (tools/gen_malformed_corpus.py): every case must be refused with its own
// specific message, never crash, never be accepted.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"

namespace fp4serve::checkpoint {
namespace {

struct MalformedCase {
  std::string name;
  std::string kind;  // "file" or "folder"
  std::string path;
  std::string expect;
};

std::vector<MalformedCase> load_cases() {
  std::ifstream in(std::string(FP4SERVE_TEST_DATA) + "/malformed/cases.json");
  const auto cases = nlohmann::json::parse(in);
  std::vector<MalformedCase> out;
  for (const auto& c : cases) {
    out.push_back({c["name"], c["kind"], c["path"], c["expect"]});
  }
  return out;
}

class Malformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(Malformed, IsRefusedWithItsSpecificMessage) {
  const MalformedCase& c = GetParam();
  const std::filesystem::path path = std::filesystem::path(FP4SERVE_TEST_DATA) / "malformed" / c.path;
  try {
    if (c.kind == "file") {
      SafetensorsFile file(path);
    } else {
      Checkpoint::open(path);
    }
    FAIL() << c.name << " was accepted";
  } catch (const FormatError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(c.expect), std::string::npos) << "message: " << message << "\nexpected: " << c.expect;
    EXPECT_NE(message.find(c.path), std::string::npos)
        << "the message must name the file or folder: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, Malformed, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& param_info) { return param_info.param.name; });

TEST(MalformedCorpus, HasAtLeast25Cases) { EXPECT_GE(load_cases().size(), 25u); }

}  // namespace
}  // namespace fp4serve::checkpoint
