// SPDX-License-Identifier: Apache-2.0
// Constrained decoding: the sampler's bitmask against a per-bit reference, and the whole loop (engine bitmask →
// apply_token_bitmask → Sampler → accept) against the engine's own matcher on random walks over the real SmolLM2
// vocabulary; the texts the walks end with are checked by independent code (nlohmann's JSON parser, std::regex).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "fp4serve/error.h"
#include "runtime/sampler.h"
#include "runtime/structured_output.h"
#include "text/tokenizer.h"

namespace fp4serve::runtime {
namespace {

using nlohmann::json;

TEST(TokenBitmask, MasksExactlyTheClearedBits) {
  std::mt19937_64 rng(41);
  for (const size_t vocab : {1u, 31u, 32u, 33u, 1000u, 49157u}) {
    for (const bool short_mask : {false, true}) {
      const size_t words = (vocab + 31) / 32 - (short_mask && vocab > 32 ? 1 : 0);
      std::vector<int32_t> mask(words);
      for (auto& w : mask) {
        const int kind = static_cast<int>(rng() % 3);  // all allowed, none, random
        w = kind == 0 ? -1 : kind == 1 ? 0 : static_cast<int32_t>(rng());
      }
      std::vector<float> logits(vocab);
      for (auto& x : logits) x = std::uniform_real_distribution<float>(-5, 5)(rng);
      const std::vector<float> before = logits;
      apply_token_bitmask(logits, mask);
      for (size_t t = 0; t < vocab; ++t) {
        const bool allowed = t / 32 < words && ((static_cast<uint32_t>(mask[t / 32]) >> (t % 32)) & 1u) != 0;
        if (allowed) {
          EXPECT_EQ(logits[t], before[t]) << "vocab " << vocab << " token " << t;
        } else {
          EXPECT_TRUE(std::isinf(logits[t]) && logits[t] < 0) << "vocab " << vocab << " token " << t;
        }
      }
    }
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Smollm2 {
  text::Tokenizer tokenizer;
  VocabularyInfo vocab;
  int32_t eos;
};

const Smollm2& smollm2() {
  static const Smollm2 fixture = [] {
    const std::string dir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/smollm2-real/";
    const std::string text = read_text(dir + "tokenizer.json");
    const json config = json::parse(read_text(dir + "tokenizer_config.json"));
    text::Tokenizer tok = text::Tokenizer::from_json(json::parse(text), config);
    const int32_t eos = *tok.eos_id();
    // A logits row wider than the tokenizer, as models pad theirs: the extra ids must never be allowed.
    VocabularyInfo vocab = vocabulary_info(tok, text, tok.vocab_size() + 64, {eos});
    return Smollm2{std::move(tok), std::move(vocab), eos};
  }();
  return fixture;
}

class StructuredOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!grammar_engine_available()) GTEST_SKIP() << grammar_engine_description();
  }
};

TEST_F(StructuredOutput, VocabularyIsReadAsByteLevel) {
  const Smollm2& f = smollm2();
  EXPECT_EQ(f.vocab.encoding, VocabEncoding::kByteLevel);  // tokenizer.json's decoder is ByteLevel
  EXPECT_FALSE(f.vocab.add_prefix_space);
  EXPECT_EQ(f.vocab.tokens.size(), static_cast<size_t>(f.tokenizer.vocab_size()));
  EXPECT_EQ(f.vocab.tokens[static_cast<size_t>(*f.tokenizer.token_to_id("Ġthe"))], "Ġthe");
}

// Walks `spec` with random logits: at every step the sampled token must be one the bitmask allows and the
// engine's matcher must accept it; a few tokens the mask forbids must be rejected (leaving the state alone) and a
// few it allows must be accepted by a second matcher that replays the same prefix. Returns the text once the
// grammar terminates (the stop token is favoured whenever allowed), or nullopt after `max_steps`.
std::optional<std::string> random_walk(const GrammarCompiler& compiler, const GrammarSpec& spec, uint64_t seed,
                                       int max_steps) {
  const Smollm2& f = smollm2();
  const auto grammar = compiler.compile(spec);
  GrammarMatcher matcher(grammar);
  std::mt19937_64 rng(seed);
  SamplingParams params;
  params.seed = seed;
  Sampler sampler(params);
  std::vector<int32_t> prefix;
  const auto vocab = static_cast<size_t>(compiler.vocab_size());
  for (int step = 0; step < max_steps; ++step) {
    const auto mask = matcher.next_token_bitmask();
    EXPECT_EQ(mask.size(), static_cast<size_t>(bitmask_words(static_cast<int64_t>(vocab))));
    auto allowed = [&](size_t t) { return ((static_cast<uint32_t>(mask[t / 32]) >> (t % 32)) & 1u) != 0; };
    std::vector<int32_t> yes, no;
    for (size_t t = 0; t < vocab; ++t) (allowed(t) ? yes : no).push_back(static_cast<int32_t>(t));
    EXPECT_FALSE(yes.empty());
    for (size_t t = f.vocab.tokens.size(); t < vocab; ++t) EXPECT_FALSE(allowed(t)) << "padding id " << t;
    // Forbidden tokens: rejected, state unchanged.
    for (int k = 0; k < 4 && !no.empty(); ++k) {
      const int32_t t = no[rng() % no.size()];
      EXPECT_FALSE(matcher.accept(t)) << "token " << t << " is masked but accepted after " << prefix.size();
    }
    // Allowed tokens: a twin matcher fed the same prefix accepts each.
    for (int k = 0; k < 2; ++k) {
      const int32_t t = yes[rng() % yes.size()];
      GrammarMatcher twin(grammar);
      for (const int32_t p : prefix) EXPECT_TRUE(twin.accept(p));
      EXPECT_TRUE(twin.accept(t)) << "token " << t << " is allowed but rejected";
    }
    std::vector<float> logits(vocab);
    for (auto& x : logits) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
    logits[static_cast<size_t>(f.eos)] += 30.0f;  // end as soon as the grammar allows
    apply_token_bitmask(logits, mask);
    const int32_t token = sampler.sample(logits);
    EXPECT_TRUE(allowed(static_cast<size_t>(token))) << "sampled a masked token " << token;
    EXPECT_TRUE(matcher.accept(token));
    if (matcher.terminated()) {
      EXPECT_EQ(token, f.eos);
      return f.tokenizer.decode(prefix, /*skip_special_tokens=*/false);
    }
    prefix.push_back(token);
  }
  return std::nullopt;
}

TEST_F(StructuredOutput, RandomWalksFollowJsonSchema) {
  const GrammarCompiler compiler(smollm2().vocab);
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kJsonSchema;
  spec.any_whitespace = false;
  spec.source = R"({"type": "object", "properties": {
      "n": {"type": "integer", "minimum": 3, "maximum": 42},
      "color": {"enum": ["red", "green", "blue"]},
      "ok": {"type": "boolean"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}},
    "required": ["n", "color", "ok", "tags"]})";
  int finished = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto text = random_walk(compiler, spec, seed, 80);
    if (!text) continue;
    ++finished;
    const json v = json::parse(*text);  // throws (fails the test) when not JSON
    ASSERT_TRUE(v.is_object()) << *text;
    EXPECT_EQ(v.size(), 4u) << *text;  // strict: no properties beyond the schema's
    ASSERT_TRUE(v["n"].is_number_integer()) << *text;
    EXPECT_GE(v["n"].get<int>(), 3);
    EXPECT_LE(v["n"].get<int>(), 42);
    const std::string color = v["color"].get<std::string>();
    EXPECT_TRUE(color == "red" || color == "green" || color == "blue") << *text;
    EXPECT_TRUE(v["ok"].is_boolean());
    ASSERT_TRUE(v["tags"].is_array());
    EXPECT_GE(v["tags"].size(), 1u);
    EXPECT_LE(v["tags"].size(), 3u);
  }
  EXPECT_GE(finished, 4);
}

TEST_F(StructuredOutput, RandomWalksFollowRegexChoiceAndGrammar) {
  const GrammarCompiler compiler(smollm2().vocab);
  GrammarSpec regex;
  regex.kind = GrammarSpec::Kind::kRegex;
  regex.source = "[a-z]{2,4}-[0-9]{3}( ok)?";
  GrammarSpec choice;
  choice.kind = GrammarSpec::Kind::kChoice;
  choice.choices = {"yes", "no", "maybe \"so\"", "né\n"};
  GrammarSpec ebnf;
  ebnf.kind = GrammarSpec::Kind::kGrammar;
  ebnf.source = "root ::= \"(\" item (\",\" item)* \")\"\nitem ::= [0-9] | \"x\"";
  GrammarSpec lark;
  lark.kind = GrammarSpec::Kind::kGrammar;
  lark.source = "start: \"<\" WORD \">\"\nWORD: /[A-Z]{1,3}/";
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    auto text = random_walk(compiler, regex, seed, 40);
    ASSERT_TRUE(text.has_value());
    EXPECT_TRUE(std::regex_match(*text, std::regex("[a-z]{2,4}-[0-9]{3}( ok)?"))) << *text;
    text = random_walk(compiler, choice, seed, 40);
    ASSERT_TRUE(text.has_value());
    EXPECT_TRUE(std::find(choice.choices.begin(), choice.choices.end(), *text) != choice.choices.end()) << *text;
    text = random_walk(compiler, ebnf, seed, 60);
    if (text) {
      EXPECT_TRUE(std::regex_match(*text, std::regex(R"(\(([0-9]|x)(,([0-9]|x))*\))"))) << *text;
    }
    text = random_walk(compiler, lark, seed, 40);
    ASSERT_TRUE(text.has_value());
    EXPECT_TRUE(std::regex_match(*text, std::regex("<[A-Z]{1,3}>"))) << *text;
  }
}

TEST_F(StructuredOutput, InvalidSpecsAreUsageErrors) {
  const GrammarCompiler compiler(smollm2().vocab);
  auto compile = [&](GrammarSpec::Kind kind, std::string source) {
    GrammarSpec s;
    s.kind = kind;
    s.source = std::move(source);
    return compiler.compile(s);
  };
  EXPECT_THROW(compile(GrammarSpec::Kind::kRegex, "(ab"), UsageError);
  EXPECT_THROW(compile(GrammarSpec::Kind::kGrammar, "root ::= undefined_rule"), UsageError);
  EXPECT_THROW(compile(GrammarSpec::Kind::kJsonSchema, "{not json"), UsageError);
  EXPECT_THROW(compile(GrammarSpec::Kind::kStructuralTag, R"({"type": "structural_tag", "format": {"type": "nope"}})"),
               UsageError);
  EXPECT_THROW(compile(GrammarSpec::Kind::kChoice, ""), UsageError);  // no choices
}

TEST_F(StructuredOutput, CompiledGrammarsAreCached) {
  const GrammarCompiler compiler(smollm2().vocab);
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kJsonSchema;
  spec.source = R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})";
  const int64_t empty = compiler.cache_size_bytes();
  compiler.compile(spec);
  const int64_t once = compiler.cache_size_bytes();
  EXPECT_GT(once, empty);
  compiler.compile(spec);
  EXPECT_EQ(compiler.cache_size_bytes(), once);  // the second compile came from the cache
  spec.any_whitespace = false;                   // another option is another grammar
  compiler.compile(spec);
  EXPECT_GT(compiler.cache_size_bytes(), once);
}

// Hostile constraints end fast with a UsageError that says what was too big, before the engine sees them: a
// schema nested 100 000 levels (the engine's recursive descent would overflow the stack), a 1 MB schema, a regex
// and a grammar with 20 000 nested groups.
TEST_F(StructuredOutput, OversizedAndDeeplyNestedConstraintsAreRefused) {
  const GrammarCompiler compiler(smollm2().vocab);
  auto refusal = [&](GrammarSpec::Kind kind, std::string source) -> std::string {
    GrammarSpec s;
    s.kind = kind;
    s.source = std::move(source);
    const auto start = std::chrono::steady_clock::now();
    try {
      compiler.compile(s);
    } catch (const UsageError& e) {
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
      return e.what();
    }
    ADD_FAILURE() << "compiled";
    return {};
  };
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "object", "properties": {"a": )";
  deep += "{}";
  for (int i = 0; i < 100000; ++i) deep += "}}";
  EXPECT_NE(refusal(GrammarSpec::Kind::kJsonSchema, deep).find("the JSON schema is"), std::string::npos);  // bytes first
  std::string nested = R"({"type": "object", "properties": {"a": )";
  std::string tail = "}}";
  std::string schema = "{}";
  for (int i = 0; i < 40; ++i) schema = nested + schema + tail;  // 81 levels, a few KB
  EXPECT_NE(refusal(GrammarSpec::Kind::kJsonSchema, schema).find("the JSON schema nests 81 levels deep; at most 64"),
            std::string::npos);
  std::string big = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 40000; ++i) big += (i ? ", " : "") + fmt::format(R"("p{}": {{"type": "string"}})", i);
  big += "}}";
  EXPECT_NE(refusal(GrammarSpec::Kind::kJsonSchema, big).find("at most 131072 are accepted"), std::string::npos);
  const std::string groups = std::string(20000, '(') + "a" + std::string(20000, ')');
  EXPECT_NE(refusal(GrammarSpec::Kind::kRegex, groups).find("the regex nests 20000 levels deep"), std::string::npos);
  EXPECT_NE(refusal(GrammarSpec::Kind::kGrammar, "root ::= " + groups).find("the grammar nests 20000 levels deep"),
            std::string::npos);
  GrammarSpec choices;
  choices.kind = GrammarSpec::Kind::kChoice;
  choices.choices.assign(3000, std::string(50, 'x'));
  EXPECT_THROW(compiler.compile(choices), UsageError);
  // Brackets inside literals, classes and escapes do not count.
  EXPECT_EQ(grammar_nesting(R"(root ::= "((((" [(\[] "\"(" ( "a" ))", GrammarSyntax::kEbnf), 1);
  EXPECT_EQ(grammar_nesting(R"(\((a[)]b)\))", GrammarSyntax::kRegex), 2);
  // A regex's quote is an ordinary character: it does not hide the groups after it (it did, and a regex of 100
  // groups behind a '"' was compiled).
  const std::string quoted = "\"" + std::string(100, '(') + "a" + std::string(100, ')');
  EXPECT_EQ(grammar_nesting(quoted, GrammarSyntax::kRegex), 100);
  EXPECT_NE(refusal(GrammarSpec::Kind::kRegex, quoted).find("the regex nests 100 levels deep"), std::string::npos);
  // A schema's "pattern" regexes count toward its nesting.
  const std::string deep_pattern = R"({"type": "string", "pattern": ")" + std::string(100, '(') + "a" +
                                   std::string(100, ')') + R"("})";
  EXPECT_NE(refusal(GrammarSpec::Kind::kJsonSchema, deep_pattern).find("the JSON schema nests 100 levels deep"),
            std::string::npos);
  EXPECT_EQ(json_nesting(R"({"a": "[[[[", "b": [{"c": "\"{"}]})"), 3);
}

// Catastrophic-backtracking regexes are no threat to the engine (it matches by automaton and Earley parsing, not
// backtracking): each compiles, or is refused, well within the deadline.
TEST_F(StructuredOutput, CatastrophicRegexesCompileFast) {
  GrammarLimits limits;
  limits.compile_timeout_seconds = 5;
  const GrammarCompiler compiler(smollm2().vocab, 2, int64_t{256} << 20, limits);
  for (const char* re : {"(a+)+b", "(a|a)*c", "(a*)*b", "((a+)+)+b", "(x+x+)+y", "(.*a){12}", "([a-z]+)*@"}) {
    GrammarSpec s;
    s.kind = GrammarSpec::Kind::kRegex;
    s.source = re;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(compiler.compile(s)) << re;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << re;
  }
}

// A schema whose string patterns nest bounded repetitions, which the engine unrolls: about 0.25–0.9 s to compile per
// pattern on the 2-core test machine depending on its load (8 of them: 2–7 s), ten times that under ASan. 3 keep a
// 0.2 s deadline (and a second 0.2 s wait for a compile slot) far below one compile, while two background compiles
// still end within the tests' two minutes under ASan (8 took 60 s there).
std::string slow_schema(int patterns = 3) {
  json props = json::object();
  json required = json::array();
  const std::string letters = "abcdefghijklmnopqrstuvwxyz";
  for (int i = 0; i < patterns; ++i) {
    const std::string a(1, letters[static_cast<size_t>(3 * i)]), b(1, letters[static_cast<size_t>(3 * i + 1)]),
        c(1, letters[static_cast<size_t>(3 * i + 2)]);
    props["p" + std::to_string(i)] = {{"type", "string"}, {"pattern", "((" + a + "|" + b + "){1,100}" + c + "){1,100}"}};
    required.push_back("p" + std::to_string(i));
  }
  return json{{"type", "object"}, {"properties", props}, {"required", required}}.dump();
}

// A constraint that takes seconds to compile (slow_schema) is answered at the deadline; while it finishes in the background, a new constraint is
// refused as busy (max_overdue_compiles 1); once it has finished, its result is in the cache and the same request
// compiles at once.
TEST_F(StructuredOutput, SlowCompilesEndAtTheDeadline) {
  GrammarLimits limits;
  limits.compile_timeout_seconds = 0.2;
  limits.max_overdue_compiles = 1;
  const GrammarCompiler compiler(smollm2().vocab, 2, int64_t{256} << 20, limits);
  GrammarSpec slow;
  slow.kind = GrammarSpec::Kind::kJsonSchema;
  slow.source = slow_schema();
  auto start = std::chrono::steady_clock::now();
  try {
    compiler.compile(slow);
    ADD_FAILURE() << "the slow schema compiled within 0.2 s: the test needs a slower one";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the JSON schema did not compile within 0.2 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(compiler.overdue_compiles(), 1);
  GrammarSpec other;
  other.kind = GrammarSpec::Kind::kRegex;
  other.source = "[0-9]+";
  EXPECT_THROW(compiler.compile(other), GrammarBusyError);
  for (int i = 0; i < 1200 && compiler.overdue_compiles() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(compiler.overdue_compiles(), 0) << "the background compile did not end within 120 s";
  start = std::chrono::steady_clock::now();
  EXPECT_NE(compiler.compile(slow), nullptr);  // from the cache
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_NE(compiler.compile(other), nullptr);
}

// Slow constraints sent all at once: at most max_overdue_compiles of them start (each answered at its deadline),
// the others wait a deadline for a slot and are refused as busy. (Before, the busy check counted only compiles
// already past their deadline, so all five started and all five ran on in the background.)
TEST_F(StructuredOutput, ConcurrentSlowCompilesAreBounded) {
  GrammarLimits limits;
  limits.compile_timeout_seconds = 0.2;
  limits.max_overdue_compiles = 2;
  const GrammarCompiler compiler(smollm2().vocab, 2, int64_t{256} << 20, limits);
  std::atomic<int> timed_out{0}, busy{0}, compiled{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 5; ++i) {
    clients.emplace_back([&, i] {
      GrammarSpec slow;
      slow.kind = GrammarSpec::Kind::kJsonSchema;
      // Distinct schemas (a title of their own), so that none is the engine's cached copy of another.
      json schema = json::parse(slow_schema());
      schema["title"] = "slow " + std::to_string(i);
      slow.source = schema.dump();
      try {
        compiler.compile(slow);
        ++compiled;
      } catch (const GrammarBusyError&) {
        ++busy;
      } catch (const UsageError&) {
        ++timed_out;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_LE(timed_out.load() + compiled.load(), 2);
  EXPECT_GE(busy.load(), 3);
  EXPECT_LE(compiler.overdue_compiles(), 2);
  for (int i = 0; i < 1200 && compiler.overdue_compiles() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(compiler.overdue_compiles(), 0) << "the background compiles did not end within 120 s";
}

}  // namespace
}  // namespace fp4serve::runtime
