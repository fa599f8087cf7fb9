// SPDX-License-Identifier: Apache-2.0
// Tokenizer behaviour outside the golden comparisons: loading errors, tokenizer_config handling, id lookups,
// streaming at the byte level, concurrent use.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fp4serve/error.h"
#include "text/tokenizer.h"

#include "tokenizer_fixtures.h"

namespace fp4serve::text {
namespace {

using nlohmann::json;

using test_support::kDir;

using test_support::read_json;

Tokenizer load(const std::string& family, const json& config) {
  return Tokenizer::from_files(kDir + family + "/tokenizer.json", config);
}

// A minimal valid byte-level tokenizer.json that tests modify one field at a time.
json minimal() {
  return json::parse(R"({"version": "1.0", "added_tokens": [],
    "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

template <typename E>
std::string error_of(const json& tok) {
  try {
    Tokenizer::from_json(tok, nullptr, "t.json");
  } catch (const E& e) {
    return e.what();
  }
  return "(no error of the expected type)";
}

TEST(Tokenizer, MinimalTokenizerMerges) {
  const Tokenizer tok = Tokenizer::from_json(minimal(), nullptr);
  EXPECT_EQ(tok.encode("abab", false), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(tok.encode("ba", false), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 0, 7, 1}, false), "abab");  // unknown id 7 is skipped
  EXPECT_EQ(tok.vocab_size(), 3);
}

TEST(Tokenizer, UnsupportedComponentsAreNamed) {
  json t = minimal();
  t["normalizer"] = {{"type", "Nmt"}};
  EXPECT_NE(error_of<UnsupportedError>(t).find("\"Nmt\""), std::string::npos);
  t = minimal();
  t["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  EXPECT_NE(error_of<UnsupportedError>(t).find("\"UnicodeScripts\""), std::string::npos);
  t = minimal();
  t["decoder"] = {{"type", "CTC"}, {"pad_token", "<pad>"}};
  EXPECT_NE(error_of<UnsupportedError>(t).find("\"CTC\""), std::string::npos);
  t = minimal();
  t["model"]["type"] = "WordLevel";
  EXPECT_NE(error_of<UnsupportedError>(t).find("\"WordLevel\""), std::string::npos);
  t = minimal();
  t["model"]["dropout"] = 0.1;
  EXPECT_NE(error_of<UnsupportedError>(t).find("dropout"), std::string::npos);
}

// Unigram / WordPiece / Precompiled fields that are malformed name the field (the working files are checked
// against the library in tokenizer_golden_test.cpp: unigram-t5, wordpiece-bert).
TEST(Tokenizer, MalformedUnigramWordPieceAndCharsmapAreFormatErrors) {
  json t = minimal();
  t["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  EXPECT_NE(error_of<FormatError>(t).find("precompiled_charsmap"), std::string::npos);
  t["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "not base64!"}};
  EXPECT_NE(error_of<FormatError>(t).find("not base64"), std::string::npos);
  t = minimal();
  const json pieces = json::array({json::array({"a", -1.0}), json::array({"b", -2.0})});
  t["model"] = {{"type", "Unigram"}, {"unk_id", 5}, {"vocab", pieces}};
  EXPECT_NE(error_of<FormatError>(t).find("unk_id"), std::string::npos);
  t["model"] = {{"type", "Unigram"}, {"vocab", json::array({json::array({"a", -1.0}), json::array({"b"})})}};
  EXPECT_NE(error_of<FormatError>(t).find("vocab[1]"), std::string::npos);
  t["model"] = {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", {{"a", 0}}}};
  EXPECT_NE(error_of<FormatError>(t).find("unk_token"), std::string::npos);
}

TEST(Tokenizer, MalformedFilesAreFormatErrors) {
  json t = minimal();
  t["model"]["merges"] = {"a c"};
  EXPECT_NE(error_of<FormatError>(t).find("merges[0]"), std::string::npos);
  t = minimal();
  t["model"]["merges"] = {"a b c"};
  EXPECT_NE(error_of<FormatError>(t).find("merges[0]"), std::string::npos);
  t = minimal();
  t["model"]["vocab"]["c"] = -3;
  EXPECT_NE(error_of<FormatError>(t).find("vocab[\"c\"]"), std::string::npos);
  t = minimal();
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of<FormatError>(t).find("does not compile"), std::string::npos);
  t = minimal();
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(error_of<FormatError>(t).find("Sideways"), std::string::npos);
  t = minimal();
  t["model"]["unk_token"] = "<unk>";
  EXPECT_NE(error_of<FormatError>(t).find("unk_token"), std::string::npos);
  t = minimal();
  t["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_NE(error_of<FormatError>(t).find("one character"), std::string::npos);
  EXPECT_THROW(Tokenizer::from_files(kDir + "no-such/tokenizer.json", nullptr), IoError);
  EXPECT_THROW(Tokenizer::from_files(kDir + "multilingual.txt", nullptr), FormatError);
}

TEST(Tokenizer, InvalidUtf8InputIsUsageError) {
  const Tokenizer tok = Tokenizer::from_json(minimal(), nullptr);
  EXPECT_THROW(tok.encode("ab\xC3(", false), UsageError);
  EXPECT_THROW(tok.encode("\xED\xA0\x80", false), UsageError);  // a surrogate
  EXPECT_THROW(tok.encode("\xC0\xAF", false), UsageError);      // an overlong '/'
}

TEST(Tokenizer, AddBosTokenFromConfigOverridesPostProcessor) {
  const json cfg = read_json(kDir + "llama2/tokenizer_config.json");
  const Tokenizer with = load("llama2", cfg);
  const auto plain = with.encode("Hello world", false);
  ASSERT_FALSE(plain.empty());
  auto expect_bos = plain;
  expect_bos.insert(expect_bos.begin(), 1);
  EXPECT_EQ(with.encode("Hello world", true), expect_bos);

  json no_bos = cfg;
  no_bos["add_bos_token"] = false;
  EXPECT_EQ(load("llama2", no_bos).encode("Hello world", true), plain);

  json with_eos = cfg;
  with_eos["add_eos_token"] = true;
  auto expect_eos = expect_bos;
  expect_eos.push_back(2);
  EXPECT_EQ(load("llama2", with_eos).encode("Hello world", true), expect_eos);

  // GPT-2 style: the post-processor adds nothing; add_bos_token=true prepends the config's bos_token.
  json gpt2 = read_json(kDir + "gpt2/tokenizer_config.json");
  gpt2["add_bos_token"] = true;
  const Tokenizer g = load("gpt2", gpt2);
  const auto ids = g.encode("Hi", true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids.front(), *g.token_to_id("<|endoftext|>"));
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), g.encode("Hi", false));
}

TEST(Tokenizer, BosEosAndLookups) {
  const Tokenizer real = load("smollm2-real", read_json(kDir + "smollm2-real/tokenizer_config.json"));
  EXPECT_EQ(real.vocab_size(), 49152);
  EXPECT_EQ(real.bos_id(), 1);  // '<|im_start|>' in SmolLM2's tokenizer_config
  EXPECT_EQ(real.eos_id(), 2);  // '<|im_end|>'
  // '<|im_end|>' is an added token declared special: decode drops it only when asked to; "\n" is not special.
  EXPECT_EQ(real.decode(std::vector<int32_t>{2}, false), "<|im_end|>");
  EXPECT_EQ(real.decode(std::vector<int32_t>{2, 198}, true), "\n");
  EXPECT_EQ(real.id_to_token(198), "\xC4\x8A");  // "Ċ", the byte-level spelling of "\n"
  EXPECT_EQ(real.token_to_id("\xC4\x8A"), 198);
  EXPECT_EQ(real.token_to_id("<|im_end|>"), 2);
  EXPECT_FALSE(real.token_to_id("not a token at all").has_value());
  EXPECT_THROW(real.id_to_token(-1), UsageError);
  EXPECT_THROW(real.id_to_token(49152), UsageError);
  // The ids get-default-model.sh printed for the chat markers (taken with the reference tokenizer).
  EXPECT_EQ(real.encode("<|im_start|>user\nWhat is 12+30?<|im_end|>\n", true),
            (std::vector<int32_t>{1, 4093, 198, 1780, 314, 216, 33, 34, 27, 35, 32, 47, 2, 198}));

  // bos_token given as an AddedToken object.
  const Tokenizer meta = load("metaspace", read_json(kDir + "metaspace/tokenizer_config.json"));
  EXPECT_EQ(meta.bos_id(), 1);
  EXPECT_EQ(meta.eos_id(), 2);
  EXPECT_FALSE(load("metaspace", nullptr).bos_id().has_value());
}

TEST(StreamDecoder, HoldsBackSplitCodePoints) {
  const Tokenizer tok = load("smollm2-real", nullptr);
  // U+1F600 as four single-byte ByteLevel tokens: bytes F0 9F 98 80 map to U+00F0, U+0141, U+013A, U+0122
  // under GPT-2's bytes_to_unicode (printable bytes keep their code point, the others count up from 256).
  std::vector<int32_t> ids;
  for (const char* sym : {"\xC3\xB0", "\xC5\x81", "\xC4\xBA", "\xC4\xA2"}) {
    const auto id = tok.token_to_id(sym);
    ASSERT_TRUE(id.has_value()) << sym;
    ids.push_back(*id);
  }
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.flush(), "");
  // An incomplete sequence at the end is flushed as U+FFFD, like decode().
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{ids[0], ids[1]}, false), "\xEF\xBF\xBD");
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer tok = load("qwen2", nullptr);
  std::ifstream in(kDir + "multilingual.txt");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const auto want = tok.encode(text, false);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k) {
    threads.emplace_back([&, k] { got[k] = tok.encode(text.substr(k * 97), false); });
  }
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], tok.encode(text.substr(k * 97), false));
  EXPECT_FALSE(want.empty());
}

}  // namespace
}  // namespace fp4serve::text
