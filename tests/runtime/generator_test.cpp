// SPDX-License-Identifier: Apache-2.0
// The generation loop: StopMatcher on hand-built streams, then generate() on the tiny llama-nvfp4a16 reference
// fixture, whose greedy continuation transformers computed (tests/data/ref, golden.safetensors greedy.prompt0):
// the loop must reproduce it, and EOS / ignore_eos / max_new_tokens / stop strings / cancellation cut it where
// the request says.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "fp4serve/error.h"
#include "backends/load_model.h"
#include "runtime/generator.h"
#include "runtime/text_setup.h"

namespace fp4serve::runtime {
namespace {

namespace fs = std::filesystem;

// Pushes `pieces` one at a time; returns everything emitted (finish() included) and checks that no stop string
// was emitted and that every emitted piece is whole UTF-8.
std::string run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  auto whole_utf8 = [](const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
      const auto b = static_cast<unsigned char>(s[i]);
      const size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
      if (len == 0 || i + len > s.size()) return false;
      for (size_t k = 1; k < len; ++k) {
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      }
      i += len;
    }
    return true;
  };
  for (const auto& p : pieces) {
    const std::string emitted = m.push(p);
    EXPECT_TRUE(whole_utf8(emitted)) << "piece splits a UTF-8 sequence after pushing '" << p << "'";
    out += emitted;
  }
  const std::string tail = m.finish();
  EXPECT_TRUE(whole_utf8(tail));
  return out + tail;
}

std::vector<std::string> bytes_of(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

TEST(StopMatcher, StopStringSplitAcrossPieces) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(run(m, {"Hello <", "/", "s>tail"}), "Hello ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, WithoutAStopEverythingComesOutInOrder) {
  for (const auto& pieces : std::vector<std::vector<std::string>>{
           {"ab", "cx", "yq", "x"}, bytes_of("abcxyqx"), {"abcxyqx"}, {"", "abc", "", "xyqx"}}) {
    StopMatcher m({"xyz", "qq"});
    EXPECT_EQ(run(m, pieces), "abcxyqx");
    EXPECT_FALSE(m.stopped());
  }
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStillBecomeAStop) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abcdef"), "abc");  // the last 3 bytes could begin "STOP"
  EXPECT_EQ(m.push("g"), "d");
  EXPECT_EQ(m.finish(), "efg");
}

TEST(StopMatcher, OverlappingPrefixes) {
  {  // "aab" begins one byte into "aaab": the first 'a' must come out, the rest not.
    StopMatcher m({"aab"});
    EXPECT_EQ(run(m, bytes_of("aaab")), "a");
    EXPECT_TRUE(m.stopped());
  }
  {  // a held-back prefix of "abc" turns out to start the other stop string "bd".
    StopMatcher m({"abc", "bd"});
    EXPECT_EQ(run(m, bytes_of("xabd")), "xa");
  }
  {  // both complete in one piece: the earliest start wins.
    StopMatcher m({"cd", "abcd", "b"});
    EXPECT_EQ(run(m, {"xxabcd"}), "xx");
  }
  {  // a partial match that fails does not swallow text.
    StopMatcher m({"abab"});
    EXPECT_EQ(run(m, bytes_of("abaabaXab")), "abaabaXab");
    EXPECT_FALSE(m.stopped());
  }
}

TEST(StopMatcher, MultiByteUtf8SplitAcrossPieces) {
  {  // a two-byte stop string arriving one byte per piece
    StopMatcher m({"é"});
    EXPECT_EQ(run(m, {"caf", "\xC3", "\xA9 au lait"}), "caf");
    EXPECT_TRUE(m.stopped());
  }
  {  // no stop: characters split across pieces are emitted whole, before and after a stop-string prefix
    StopMatcher m({"zz"});
    EXPECT_EQ(run(m, {"a\xC3", "\xA9z", "b\xE2\x82", "\xAC", "\xF0\x9F", "\x98", "\x80!"}), "aézb€😀!");
  }
  {  // the same with no stop string at all (nothing needs holding back except an incomplete character)
    StopMatcher m({});
    EXPECT_EQ(run(m, {"a\xC3", "\xA9", "\xE2\x82", "\xAC\xF0\x9F\x98", "\x80"}), "aé€😀");
  }
  {  // a stop string of whole characters found after a split character
    StopMatcher m({"€!"});
    EXPECT_EQ(run(m, {"x\xE2", "\x82\xAC", "!y"}), "x");
  }
}

TEST(StopMatcher, StopAtTheVeryStart) {
  StopMatcher m({"Hi"});
  EXPECT_EQ(m.push("Hi there"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.finish(), "");
  StopMatcher n({"Hi"});
  EXPECT_EQ(run(n, {"H", "i"}), "");
  EXPECT_TRUE(n.stopped());
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", "x"});
  EXPECT_EQ(run(m, {"ab", "cxd"}), "abc");
}

// ---------------------------------------------------------------------------------------------------------------
// generate() on the reference fixture

const fs::path kFixture = fs::path(FP4SERVE_TEST_DATA) / "ref" / "llama-nvfp4a16";

std::vector<int32_t> golden_ids(const std::string& name) {
  const checkpoint::SafetensorsFile golden(kFixture / "golden.safetensors");
  const auto view = golden.view(*golden.find(name));
  std::vector<int32_t> ids(static_cast<size_t>(view.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(view.load<int64_t>(i));
  return ids;
}

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model::LoadOptions options;
    model_ = std::make_unique<model::LoadedModel>(model::load_model(kFixture, options));
    tokenizer_ = std::make_unique<text::Tokenizer>(load_tokenizer(model_->checkpoint));
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    model_.reset();
  }

  static GenerationRequest greedy_request(int64_t max_new_tokens) {
    GenerationRequest r;
    r.prompt = golden_ids("prompt0");
    r.sampling.temperature = 0.0f;
    r.max_new_tokens = max_new_tokens;
    return r;
  }

  // Runs `request` on a fresh one-slot cache; checks that the streamed pieces add up to the result's text and
  // that the slot was given back.
  static GenerationResult run_generate(const GenerationRequest& request, int stop_after_pieces = -1) {
    model::KvCache cache = model_->decoder->make_cache(64, 1);
    std::string streamed;
    int pieces = 0;
    GenerationResult result = generate(*model_->decoder, cache, *tokenizer_, request, [&](std::string_view piece) {
      streamed += piece;
      return ++pieces != stop_after_pieces;
    });
    EXPECT_EQ(streamed, result.text);
    EXPECT_EQ(cache.free_slots(), 1);
    EXPECT_EQ(result.prompt_tokens, static_cast<int64_t>(request.prompt.size()));
    return result;
  }

  static std::unique_ptr<model::LoadedModel> model_;
  static std::unique_ptr<text::Tokenizer> tokenizer_;
};

std::unique_ptr<model::LoadedModel> Generate::model_;
std::unique_ptr<text::Tokenizer> Generate::tokenizer_;

TEST_F(Generate, GreedyReproducesTransformersContinuation) {
  const std::vector<int32_t> want = golden_ids("greedy.prompt0");
  ASSERT_EQ(want.size(), 8u);
  const GenerationResult r = run_generate(greedy_request(8));
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.text, tokenizer_->decode(want, /*skip_special_tokens=*/true));
}

TEST_F(Generate, MaxNewTokensEndsWithLength) {
  const std::vector<int32_t> want = golden_ids("greedy.prompt0");
  const GenerationResult r = run_generate(greedy_request(3));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + 3));
  EXPECT_EQ(r.finish_reason, "length");
}

TEST_F(Generate, EosEndsWithStopAndIsExcluded) {
  const std::vector<int32_t> want = golden_ids("greedy.prompt0");
  // The first golden token (after the first) that did not occur before it: generation must stop right there.
  size_t at = 1;
  while (std::find(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(at), want[at]) != want.begin() + static_cast<std::ptrdiff_t>(at)) ++at;
  GenerationRequest request = greedy_request(8);
  request.eos_token_ids = {9999, want[at]};
  const GenerationResult r = run_generate(request);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(at)));
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, tokenizer_->decode(r.tokens, true));

  request.ignore_eos = true;
  const GenerationResult all = run_generate(request);
  EXPECT_EQ(all.tokens, want);
  EXPECT_EQ(all.finish_reason, "length");

  request.ignore_eos = false;  // EOS as the very first token: nothing generated
  request.eos_token_ids = {want[0]};
  const GenerationResult none = run_generate(request);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.text, "");
  EXPECT_EQ(none.finish_reason, "stop");
}

TEST_F(Generate, StopStringCutsTheText) {
  const std::vector<int32_t> want = golden_ids("greedy.prompt0");
  const std::string full = tokenizer_->decode(want, true);
  // A stop string that begins inside the text and spans a token boundary: the last 3 bytes of the decode of
  // the first 6 tokens plus the next byte.
  const std::string six = tokenizer_->decode(std::vector<int32_t>(want.begin(), want.begin() + 6), true);
  ASSERT_GT(full.size(), six.size());
  const std::string stop = full.substr(six.size() - 3, 4);
  const size_t first = full.find(stop);
  GenerationRequest request = greedy_request(8);
  request.stop = {"never appears", stop};
  const GenerationResult r = run_generate(request);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, full.substr(0, first));
  EXPECT_LE(r.tokens.size(), 7u);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(r.tokens.size())));

  request.stop = {full.substr(0, 2)};  // at the very start
  const GenerationResult start = run_generate(request);
  EXPECT_EQ(start.text, "");
  EXPECT_EQ(start.finish_reason, "stop");
}

TEST_F(Generate, CallbackFalseAborts) {
  const GenerationResult r = run_generate(greedy_request(8), /*stop_after_pieces=*/1);
  EXPECT_EQ(r.finish_reason, "abort");
  EXPECT_LT(r.tokens.size(), 8u);
}

TEST_F(Generate, RejectsBadRequests) {
  model::KvCache cache = model_->decoder->make_cache(20, 1);
  auto ignore = [](std::string_view) { return true; };
  GenerationRequest empty = greedy_request(4);
  empty.prompt.clear();
  EXPECT_THROW(generate(*model_->decoder, cache, *tokenizer_, empty, ignore), UsageError);
  EXPECT_THROW(generate(*model_->decoder, cache, *tokenizer_, greedy_request(7), ignore), UsageError);  // 14 + 7 > 20
  const int slot = cache.acquire();
  EXPECT_THROW(generate(*model_->decoder, cache, *tokenizer_, greedy_request(4), ignore), UsageError);  // no slot
  cache.release(slot);
  EXPECT_NO_THROW(generate(*model_->decoder, cache, *tokenizer_, greedy_request(6), ignore));
}

}  // namespace
}  // namespace fp4serve::runtime
