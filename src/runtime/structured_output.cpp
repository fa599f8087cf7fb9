// SPDX-License-Identifier: Apache-2.0
// The grammar engine wrapper over xgrammar (FP4SERVE_XGRAMMAR=ON builds; structured_output_unavailable.cpp
// otherwise). xgrammar reports bad input by throwing std::runtime_error subclasses (XGrammarError, its
// LogFatalError); each is turned into a UsageError carrying the engine's message.
#include "runtime/structured_output.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "fp4serve/error.h"
#include "text/tokenizer.h"

namespace fp4serve::runtime {
namespace {

constexpr const char* kEngineVersion = "0.2.9";  // scripts/build-xgrammar.sh pins it

xgrammar::VocabType vocab_type(VocabEncoding e) {
  switch (e) {
    case VocabEncoding::kRaw: return xgrammar::VocabType::RAW;
    case VocabEncoding::kByteFallback: return xgrammar::VocabType::BYTE_FALLBACK;
    case VocabEncoding::kByteLevel: return xgrammar::VocabType::BYTE_LEVEL;
  }
  return xgrammar::VocabType::RAW;
}

// A string literal of xgrammar's EBNF: C escapes for the quote, the backslash and control bytes; other bytes
// (UTF-8 included) as they are.
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// vLLM's choice → grammar: the output is exactly one of the strings.
std::string choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw UsageError("the choice list is empty: give at least one string");
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) g += (i == 0 ? "" : " | ") + ebnf_literal(choices[i]);
  return g;
}

}  // namespace

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

bool grammar_engine_available() { return true; }
std::string grammar_engine_description() { return fmt::format("xgrammar {}", kEngineVersion); }

VocabularyInfo vocabulary_info(const text::Tokenizer& tokenizer, const std::string& tokenizer_json, int64_t vocab_size,
                               std::vector<int32_t> stop_token_ids) {
  VocabularyInfo info;
  std::string metadata;
  try {
    metadata = xgrammar::TokenizerInfo::DetectMetadataFromHF(tokenizer_json);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("tokenizer.json: the grammar engine cannot read it: {}", e.what()));
  }
  // {"vocab_type": 0|1|2, "add_prefix_space": bool}: xgrammar's VocabType numbering.
  const nlohmann::json meta = nlohmann::json::parse(metadata);
  const int type = meta.value("vocab_type", 0);
  info.encoding = type == 2 ? VocabEncoding::kByteLevel : type == 1 ? VocabEncoding::kByteFallback : VocabEncoding::kRaw;
  info.add_prefix_space = meta.value("add_prefix_space", false);
  const int64_t n = std::min(tokenizer.vocab_size(), vocab_size);
  info.tokens.resize(static_cast<size_t>(n));
  for (int64_t id = 0; id < n; ++id) {
    try {
      info.tokens[static_cast<size_t>(id)] = tokenizer.id_to_token(static_cast<int32_t>(id));
    } catch (const UsageError&) {
      // An id with no token stays "": the engine treats it as special and never allows it.
    }
  }
  info.vocab_size = vocab_size;
  info.stop_token_ids = std::move(stop_token_ids);
  return info;
}

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo tokenizer_info;
  mutable xgrammar::GrammarCompiler compiler;
  int64_t vocab_size;
  GrammarLimits limits;
  // Compiles past their deadline, still running; shared with the workers, which may outlive the compiler.
  std::shared_ptr<std::atomic<int>> overdue = std::make_shared<std::atomic<int>>(0);
  // Compiles running (on time or overdue), at most limits.max_overdue_compiles: counted from before a worker starts
  // to its end, so that concurrent slow constraints cannot all start and then all run past the deadline.
  struct Slots {
    std::mutex mutex;
    std::condition_variable freed;
    int running = 0;
  };
  std::shared_ptr<Slots> slots = std::make_shared<Slots>();
};

namespace {

// The engine's compile of one spec (on a worker thread).
xgrammar::CompiledGrammar run_compile(xgrammar::GrammarCompiler& c, const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema: return c.CompileJSONSchema(spec.source, spec.any_whitespace);
    case GrammarSpec::Kind::kJsonObject:
      // vLLM's json_object: any JSON object (xgrammar's builtin grammar also admits arrays and scalars).
      return c.CompileJSONSchema(R"({"type": "object"})", spec.any_whitespace, std::nullopt, std::nullopt, false);
    case GrammarSpec::Kind::kRegex: return c.CompileRegex(spec.source);
    case GrammarSpec::Kind::kChoice: return c.CompileGrammar(choice_grammar(spec.choices), "root");
    case GrammarSpec::Kind::kGrammar:
      if (spec.source.find("::=") == std::string::npos) return c.CompileLark(spec.source);  // as vLLM tells them apart
      return c.CompileGrammar(spec.source, "root");
    case GrammarSpec::Kind::kStructuralTag: return c.CompileStructuralTag(spec.source);
  }
  throw UsageError("unknown grammar kind");
}

// What a worker hands back: the grammar or the engine's error, once done.
struct CompileResult {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  bool overdue = false;  // the caller stopped waiting: the worker counts itself out of Impl::overdue
  std::optional<xgrammar::CompiledGrammar> grammar;
  std::exception_ptr error;
};

}  // namespace

GrammarCompiler::GrammarCompiler(const VocabularyInfo& vocabulary, int threads, int64_t cache_bytes,
                                 const GrammarLimits& limits) {
  if (vocabulary.tokens.empty() || vocabulary.vocab_size < static_cast<int64_t>(vocabulary.tokens.size())) {
    throw UsageError(fmt::format("grammar compiler: a vocabulary of {} tokens for logits rows of {}",
                                 vocabulary.tokens.size(), vocabulary.vocab_size));
  }
  if (limits.max_source_bytes <= 0 || limits.max_nesting <= 0 || limits.max_overdue_compiles < 0) {
    throw UsageError(fmt::format("grammar compiler: limits must be positive (max bytes {}, max nesting {}, overdue "
                                 "compiles {})",
                                 limits.max_source_bytes, limits.max_nesting, limits.max_overdue_compiles));
  }
  try {
    xgrammar::TokenizerInfo info(vocabulary.tokens, vocab_type(vocabulary.encoding),
                                 static_cast<int>(vocabulary.vocab_size), vocabulary.stop_token_ids,
                                 vocabulary.add_prefix_space);
    impl_ = std::make_unique<Impl>(Impl{info, xgrammar::GrammarCompiler(info, std::max(threads, 1), true, cache_bytes),
                                        vocabulary.vocab_size, limits});
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("grammar compiler: {}", e.what()));
  }
}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) const {
  const GrammarLimits& limits = impl_->limits;
  check_grammar_limits(spec, limits);
  // A slot first: wait for one up to the deadline (a burst of fast compiles queues briefly), else busy.
  const int max_running = std::max(limits.max_overdue_compiles, 1);
  const std::shared_ptr<Impl::Slots> slots = impl_->slots;
  {
    std::unique_lock lock(slots->mutex);
    const auto free = [&] { return slots->running < max_running; };
    if (limits.compile_timeout_seconds > 0) {
      if (!slots->freed.wait_for(lock, std::chrono::duration<double>(limits.compile_timeout_seconds), free)) {
        throw GrammarBusyError(fmt::format("{} grammar compiles are running ({} of them past their {} s deadline; at "
                                           "most {} at once); retry later",
                                           slots->running, impl_->overdue->load(), limits.compile_timeout_seconds,
                                           max_running));
      }
    } else {
      slots->freed.wait(lock, free);
    }
    ++slots->running;
  }
  const auto release_slot = [](Impl::Slots& s) {
    {
      std::lock_guard lock(s.mutex);
      --s.running;
    }
    s.freed.notify_one();
  };
  // The engine cannot be interrupted: it runs on a worker of its own, and the caller waits up to the deadline.
  auto result = std::make_shared<CompileResult>();
  try {
    std::thread([result, compiler = impl_->compiler, overdue = impl_->overdue, slots, release_slot, spec]() mutable {
      std::optional<xgrammar::CompiledGrammar> grammar;
      std::exception_ptr error;
      try {
        grammar.emplace(run_compile(compiler, spec));
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(result->mutex);
        result->grammar = std::move(grammar);
        result->error = error;
        result->done = true;
        if (result->overdue) --*overdue;
        result->done_cv.notify_all();
      }
      release_slot(*slots);
    }).detach();
  } catch (const std::system_error& e) {  // no thread to be had: the machine is out of them, a transient state
    release_slot(*slots);
    throw GrammarBusyError(fmt::format("could not start a grammar compile: {}; retry later", e.what()));
  }
  std::unique_lock lock(result->mutex);
  if (limits.compile_timeout_seconds > 0) {
    const auto deadline = std::chrono::duration<double>(limits.compile_timeout_seconds);
    if (!result->done_cv.wait_for(lock, deadline, [&] { return result->done; })) {
      result->overdue = true;
      ++*impl_->overdue;
      throw UsageError(fmt::format("{} did not compile within {} s (--grammar-compile-timeout): simplify it",
                                   grammar_spec_description(spec.kind), limits.compile_timeout_seconds));
    }
  } else {
    result->done_cv.wait(lock, [&] { return result->done; });
  }
  if (result->error) {
    try {
      std::rethrow_exception(result->error);
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
  }
  return std::make_shared<CompiledGrammar>(std::move(*result->grammar));
}

const GrammarLimits& GrammarCompiler::limits() const { return impl_->limits; }
int GrammarCompiler::overdue_compiles() const { return impl_->overdue->load(); }

int64_t GrammarCompiler::vocab_size() const { return impl_->vocab_size; }
int64_t GrammarCompiler::cache_size_bytes() const { return impl_->compiler.GetCacheSizeBytes(); }

int64_t bitmask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
  int64_t vocab_size;
  std::vector<int32_t> bitmask;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) {
  if (grammar == nullptr) throw UsageError("GrammarMatcher: no grammar");
  const auto vocab = static_cast<int64_t>(grammar->grammar.GetTokenizerInfo().GetVocabSize());
  xgrammar::GrammarMatcher m(grammar->grammar);
  impl_ = std::make_unique<Impl>(Impl{std::move(grammar), std::move(m), vocab,
                                      std::vector<int32_t>(static_cast<size_t>(bitmask_words(vocab)))});
}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

std::span<const int32_t> GrammarMatcher::next_token_bitmask() {
  std::vector<int32_t>& words = impl_->bitmask;
  int64_t shape[2] = {1, static_cast<int64_t>(words.size())};
  DLTensor t{};
  t.data = words.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  impl_->matcher.FillNextTokenBitmask(&t, 0);
  return words;
}

bool GrammarMatcher::accept(int32_t token) {
  if (token < 0 || token >= impl_->vocab_size) return false;
  return impl_->matcher.AcceptToken(token);
}

bool GrammarMatcher::terminated() const { return impl_->matcher.IsTerminated(); }
bool GrammarMatcher::completed() const { return impl_->matcher.IsCompleted(); }
int64_t GrammarMatcher::vocab_size() const { return impl_->vocab_size; }

}  // namespace fp4serve::runtime
