// SPDX-License-Identifier: Apache-2.0
// PCRE2 (UTF + Unicode properties, JIT) behind the one operation the tokenizer needs: list the matches of a
// pattern in a string with the iteration rules of the HF `tokenizers` library's Oniguruma wrapper.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp4serve::text {

/// A compiled regular expression. Immutable after construction; `find_all` may be called from many threads.
class TokenizerRegex {
 public:
  /// Compiles `pattern` with PCRE2_UTF | PCRE2_UCP (so \s, \w, \d and \p{..} are Unicode-aware) and JIT.
  /// Throws FormatError naming `where` (e.g. "tokenizer.json pre_tokenizer.pretokenizers[0]") and the PCRE2
  /// message and offset when the pattern does not compile.
  TokenizerRegex(std::string_view pattern, std::string_view where);
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  /// Byte ranges [begin, end) of the successive non-overlapping matches in `text` (valid UTF-8). An empty match
  /// directly after the previous match is skipped and the search moves one code point on, exactly as the
  /// `onig` crate's find_iter does, so patterns that can match empty split the same way as in `tokenizers`.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  /// PCRE2 syntax of a literal string (every non-alphanumeric ASCII character escaped).
  static std::string escape(std::string_view literal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4serve::text
