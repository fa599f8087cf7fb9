// SPDX-License-Identifier: Apache-2.0
// Seeded random inputs: byte-level tokenizers are lossless (decode(encode(s)) == s for any valid UTF-8), the
// stream decoder reassembles decode() for random id sequences, and random template text never crashes the
// chat-template parser or renderer (it renders or throws an fp4serve::Error).
#include <gtest/gtest.h>

#include <random>

#include "fp4serve/error.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/tokenizer_unicode.h"
#include "tokenizer_fixtures.h"

namespace fp4serve::text {
namespace {

using test_support::kDir;

// Random valid UTF-8 drawn from ranges that stress the pre-tokenizers: ASCII letters/digits/punctuation and
// whitespace, Latin-1, combining marks, CJK, emoji, ZWJ and variation selectors, private use, U+10FFFF.
std::string random_text(std::mt19937& rng, size_t n) {
  static const std::pair<char32_t, char32_t> kRanges[] = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0x30, 0x39}, {0xA0, 0xFF}, {0x300, 0x36F}, {0x400, 0x4FF}, {0x4E00, 0x4FFF},
      {0x1F300, 0x1F64F}, {0x200B, 0x200D}, {0xFE00, 0xFE0F}, {0xE000, 0xE0FF}, {0x10FFFF, 0x10FFFF}};
  std::string s;
  for (size_t k = 0; k < n; ++k) {
    const auto& [lo, hi] = kRanges[rng() % std::size(kRanges)];
    unicode::append_utf8(s, lo + static_cast<char32_t>(rng() % (hi - lo + 1)));
  }
  return s;
}

TEST(TokenizerProperty, ByteLevelFamiliesAreLossless) {
  std::mt19937 rng(1234);
  for (const char* family : {"gpt2", "llama3", "smollm2", "smollm2-real"}) {
    const Tokenizer tok = Tokenizer::from_files(kDir + family + "/tokenizer.json", nullptr);
    for (int trial = 0; trial < 200; ++trial) {
      const std::string s = random_text(rng, 1 + rng() % 40);
      const auto ids = tok.encode(s, false);
      ASSERT_EQ(tok.decode(ids, false), s) << family << " trial " << trial;
    }
  }
}

TEST(TokenizerProperty, StreamReassemblesRandomEncodings) {
  std::mt19937 rng(99);
  for (const char* family : {"qwen2", "llama2", "mistral"}) {
    const Tokenizer tok = Tokenizer::from_files(kDir + family + "/tokenizer.json", nullptr);
    for (int trial = 0; trial < 100; ++trial) {
      const auto ids = tok.encode(random_text(rng, 1 + rng() % 30), true);
      StreamDecoder stream(tok, false);
      std::string all;
      for (int32_t id : ids) {
        const std::string chunk = stream.push(id);
        ASSERT_FALSE(unicode::find_invalid_utf8(chunk).has_value()) << family << " trial " << trial;
        all += chunk;
      }
      all += stream.flush();
      ASSERT_EQ(all, tok.decode(ids, false)) << family << " trial " << trial;
    }
  }
}

TEST(ChatTemplateProperty, RandomTemplatesRenderOrThrowErrors) {
  static const char* kPieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " ", "\n", "if", "for", "in", "set",
                                  "endif", "endfor", "else", "x", "messages", "loop", ".", "[", "]", "(", ")", "'a'",
                                  "1", "|", "length", "is", "defined", "not", "and", "~", "=", ",", ":", "ns",
                                  "namespace", "\"", "\\", "*", "//", "%", "raise_exception", "trim", "0", "-1"};
  std::mt19937 rng(7);
  size_t rendered = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string src;
    const size_t n = 1 + rng() % 16;
    for (size_t k = 0; k < n; ++k) src += kPieces[rng() % std::size(kPieces)];
    try {
      const ChatTemplate tmpl = ChatTemplate::from_string(src);
      tmpl.render({{"user", "hi"}, {"assistant", "yo"}}, true, {{"x", {1, 2}}});
      ++rendered;
    } catch (const Error&) {
      // Rejected cleanly: a syntax error, an unsupported construct or a render error.
    }
  }
  EXPECT_GT(rendered, 100u);  // the generator is not so hostile that nothing renders
}

}  // namespace
}  // namespace fp4serve::text
