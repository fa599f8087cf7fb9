// SPDX-License-Identifier: Apache-2.0
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer_regex.h"

#include <pcre2.h>

#include <cctype>

#include "fp4serve/error.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text {

struct TokenizerRegex::Impl {
  pcre2_code* code = nullptr;
};

TokenizerRegex::TokenizerRegex(std::string_view pattern, std::string_view where) : impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw FormatError(std::string(where) + ": regex /" + std::string(pattern) + "/ does not compile at offset " +
                      std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
  }
  // JIT is an optimization only: when unavailable, pcre2_match interprets the pattern.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

TokenizerRegex::~TokenizerRegex() {
  if (impl_ != nullptr) pcre2_code_free(impl_->code);
}

std::vector<std::pair<size_t, size_t>> TokenizerRegex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    // The text was validated once when encode() started, so skip PCRE2's per-call UTF check.
    const int rc = pcre2_match(impl_->code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: no further matches either way
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
    const size_t start = ov[0], end = ov[1];
    if (start == end && have_last && last_match_end == end) {
      last_end += last_end < text.size() ? unicode::sequence_length(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    last_end = end;
    have_last = true;
    last_match_end = end;
    matches.emplace_back(start, end);
  }
  return matches;
}

std::string TokenizerRegex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace fp4serve::text
