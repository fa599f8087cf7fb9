// SPDX-License-Identifier: Apache-2.0
#include "quant/name_match.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fnmatch.h>
#include <pcre2.h>

#include <algorithm>
#include <string>

#include "fp4serve/error.h"

namespace fp4serve::quant {

struct PrefixRegex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_data* match_data = nullptr;
  ~Compiled() {
    if (match_data != nullptr) pcre2_match_data_free(match_data);
    if (code != nullptr) pcre2_code_free(code);
  }
};

PrefixRegex::PrefixRegex(std::string_view pattern, std::string_view where)
    : pattern_(pattern), compiled_(std::make_shared<Compiled>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_ANCHORED anchors at the start only, which is exactly Python's re.match; `$` in the pattern is what
  // anchors the end, as in the producers' configs.
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                  PCRE2_ANCHORED | PCRE2_UTF, &error_code, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw FormatError(std::string(where) + ": regular expression '" + pattern_ + "' does not compile at offset " +
                      std::to_string(error_offset) + ": " + reinterpret_cast<const char*>(message));
  }
  compiled_->match_data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
}

bool PrefixRegex::matches(std::string_view name) const {
  const int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0,
                             compiled_->match_data, nullptr);
  return rc >= 0;
}

std::string_view match_kind_name(MatchKind kind) {
  switch (kind) {
    case MatchKind::Exact: return "exact name";
    case MatchKind::Regex: return "regex";
    case MatchKind::ClassName: return "class name";
  }
  return "?";
}

CtTarget::CtTarget(std::string_view text, std::string_view where) : text_(text) {
  if (text_.starts_with("re:")) regex_.emplace(std::string_view(text_).substr(3), where);
}

std::optional<MatchKind> CtTarget::match(std::string_view name, std::span<const std::string_view> class_names) const {
  if (regex_) {
    if (regex_->matches(name)) return MatchKind::Regex;
    return std::nullopt;
  }
  if (text_ == name) return MatchKind::Exact;
  if (std::find(class_names.begin(), class_names.end(), text_) != class_names.end()) return MatchKind::ClassName;
  return std::nullopt;
}

bool fnmatch_case(std::string_view pattern, std::string_view name) {
  // POSIX fnmatch without FNM_PATHNAME/FNM_PERIOD lets `*` cross '.' and '/', as Python's does; FNM_NOESCAPE
  // makes '\' literal, as in Python's fnmatch.translate.
  const std::string p(pattern);
  const std::string n(name);
  return ::fnmatch(p.c_str(), n.c_str(), FNM_NOESCAPE) == 0;
}

}  // namespace fp4serve::quant
