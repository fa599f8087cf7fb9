// SPDX-License-Identifier: Apache-2.0
#include "plan/name_pattern.h"

#include <algorithm>
#include <cctype>

namespace fp4serve::plan {

std::string name_pattern(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view part = name.substr(start, end - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    out += digits ? std::string_view("*") : part;
    if (end == name.size()) break;
    out += '.';
    start = end + 1;
  }
  return out;
}

}  // namespace fp4serve::plan
