// SPDX-License-Identifier: Apache-2.0
// Built with -DFP4SERVE_XGRAMMAR=OFF: no grammar engine. Every entry point refuses with UnsupportedError, so the
// server answers constrained requests with 400 and everything else runs as before.
#include "runtime/structured_output.h"

#include "fp4serve/error.h"

namespace fp4serve::runtime {
namespace {

[[noreturn]] void refuse() {
  throw UnsupportedError("structured outputs need the grammar engine, and this build has none (configured with "
                         "-DFP4SERVE_XGRAMMAR=OFF; scripts/install-deps.sh builds xgrammar)");
}

}  // namespace

class CompiledGrammar {};
struct GrammarCompiler::Impl {};
struct GrammarMatcher::Impl {};

bool grammar_engine_available() { return false; }
std::string grammar_engine_description() { return "none (built with -DFP4SERVE_XGRAMMAR=OFF)"; }
VocabularyInfo vocabulary_info(const text::Tokenizer&, const std::string&, int64_t, std::vector<int32_t>) { refuse(); }
GrammarCompiler::GrammarCompiler(const VocabularyInfo&, int, int64_t, const GrammarLimits&) { refuse(); }
GrammarCompiler::~GrammarCompiler() = default;
std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec&) const { refuse(); }
int64_t GrammarCompiler::vocab_size() const { return 0; }
const GrammarLimits& GrammarCompiler::limits() const {
  static const GrammarLimits kNone;
  return kNone;
}
int GrammarCompiler::overdue_compiles() const { return 0; }
int64_t GrammarCompiler::cache_size_bytes() const { return 0; }
int64_t bitmask_words(int64_t vocab_size) { return (vocab_size + 31) / 32; }
GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar>) { refuse(); }
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
std::span<const int32_t> GrammarMatcher::next_token_bitmask() { refuse(); }
bool GrammarMatcher::accept(int32_t) { refuse(); }
bool GrammarMatcher::terminated() const { return false; }
bool GrammarMatcher::completed() const { return false; }
int64_t GrammarMatcher::vocab_size() const { return 0; }

}  // namespace fp4serve::runtime
