// SPDX-License-Identifier: Apache-2.0
// Every tokenizer family against ids, decodes and streaming steps produced by the HF `tokenizers` library
// (tools/tokenizer/make_goldens.py): the multilingual text plus the edge strings, both add_special_tokens
// settings, decode with and without skip_special_tokens, and DecodeStream chunk by chunk.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/tokenizer.h"
#include "text/tokenizer_unicode.h"

#include "tokenizer_fixtures.h"

namespace fp4serve::text {
namespace {

using nlohmann::json;

using test_support::kDir;

using test_support::read_json;

// Names the first differing position with a little context, so a failure says where the merge went wrong.
std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                             const Tokenizer& tok) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream os;
  os << "sizes " << got.size() << " vs " << want.size() << ", first difference at " << i << ":";
  for (size_t k = i; k < i + 4 && k < got.size(); ++k) os << " got[" << k << "]=" << got[k] << "'" << tok.id_to_token(got[k]) << "'";
  for (size_t k = i; k < i + 4 && k < want.size(); ++k) os << " want[" << k << "]=" << want[k] << "'" << tok.id_to_token(want[k]) << "'";
  return os.str();
}

class TokenizerGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = kDir + GetParam();
    tok_ = std::make_unique<Tokenizer>(
        Tokenizer::from_files(dir + "/tokenizer.json", read_json(dir + "/tokenizer_config.json")));
    golden_ = read_json(dir + "/golden_ids.json");
  }
  std::unique_ptr<Tokenizer> tok_;
  json golden_;
};

TEST_P(TokenizerGolden, EncodeMatchesReference) {
  ASSERT_GE(golden_["cases"].size(), 20u);
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto want_plain = c["ids_no_special"].get<std::vector<int32_t>>();
    const auto got = tok_->encode(text, true);
    const auto got_plain = tok_->encode(text, false);
    EXPECT_EQ(got, want) << c["name"] << ": " << first_difference(got, want, *tok_);
    EXPECT_EQ(got_plain, want_plain) << c["name"] << " (no special): " << first_difference(got_plain, want_plain, *tok_);
  }
}

TEST_P(TokenizerGolden, MultilingualTextIsLarge) {
  const auto& last = golden_["cases"].back();
  ASSERT_EQ(last["name"], "multilingual");
  EXPECT_GE(last["text"].get<std::string>().size(), 20000u);
  EXPECT_GE(last["ids"].size(), 5000u);
}

TEST_P(TokenizerGolden, DecodeMatchesReference) {
  for (const auto& c : golden_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(ids, false), c["decoded"].get<std::string>()) << c["name"];
    EXPECT_EQ(tok_->decode(ids, true), c["decoded_skip_special"].get<std::string>()) << c["name"];
  }
  ASSERT_FALSE(golden_["decode_only"].empty());
  for (const auto& c : golden_["decode_only"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(ids, false), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tok_->decode(ids, true), c["decoded_skip_special"].get<std::string>()) << c["ids"].dump();
  }
}

// Step by step equal to the library's DecodeStream (its None is our ""), and the chunks plus flush() give
// exactly decode() of all ids. `exact_reassembly` is false for deliberately broken byte sequences: ByteFallback
// turns a whole run of byte tokens into one U+FFFD per byte once any byte of the run is invalid, so text the
// stream already emitted correctly cannot match decode() of the whole sequence (the library's stream does the
// same); there the reassembled text must still be valid UTF-8 and end like decode() does.
void check_stream(const Tokenizer& tok, const json& ids_json, const json& steps, bool skip, const std::string& decoded,
                  const std::string& name, bool exact_reassembly = true) {
  StreamDecoder stream(tok, skip);
  std::string all;
  const auto ids = ids_json.get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), steps.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = stream.push(ids[i]);
    const std::string want = steps[i].is_null() ? "" : steps[i].get<std::string>();
    EXPECT_EQ(chunk, want) << name << " step " << i;
    all += chunk;
  }
  const std::string rest = stream.flush();
  if (exact_reassembly) {
    EXPECT_EQ(all + rest, decoded) << name;
  } else {
    const std::string both = all + rest;
    EXPECT_TRUE(both.size() >= 3 && decoded.size() >= 3 &&
                both.compare(both.size() - 3, 3, decoded, decoded.size() - 3, 3) == 0)
        << name << ": " << both << " vs " << decoded;
    EXPECT_FALSE(unicode::find_invalid_utf8(both).has_value()) << name;
  }
}

TEST_P(TokenizerGolden, StreamMatchesReferenceDecodeStream) {
  for (const auto& c : golden_["cases"]) {
    if (!c.contains("stream_skip_special")) continue;
    check_stream(*tok_, c["ids"], c["stream_skip_special"], true, c["decoded_skip_special"], c["name"]);
  }
  for (const auto& c : golden_["decode_only"]) {
    check_stream(*tok_, c["ids"], c["stream"], false, c["decoded"], c["ids"].dump(), false);
  }
}

TEST_P(TokenizerGolden, StreamOfMultilingualTextReassemblesDecode) {
  const auto& c = golden_["cases"].back();
  const auto ids = c["ids"].get<std::vector<int32_t>>();
  for (bool skip : {false, true}) {
    StreamDecoder stream(*tok_, skip);
    std::string all;
    size_t empty_steps = 0;
    for (int32_t id : ids) {
      const std::string chunk = stream.push(id);
      empty_steps += chunk.empty();
      all += chunk;
    }
    all += stream.flush();
    EXPECT_EQ(all, tok_->decode(ids, skip));
    // Byte-level and byte-fallback families split characters across tokens, so some steps must hold back;
    // the "options", Unigram and WordPiece families map unknown characters to an unknown token and never do.
    if (GetParam().rfind("options", 0) != 0 && GetParam() != "unigram-t5" && GetParam() != "wordpiece-bert") {
      EXPECT_GT(empty_steps, 0u) << "no step held back an incomplete character";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerGolden,
                         ::testing::Values("gpt2", "llama3", "qwen2", "smollm2", "smollm2-real", "llama2", "mistral",
                                           "metaspace", "options-fused-unk", "options-unk", "unigram-t5",
                                           "wordpiece-bert"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace fp4serve::text
