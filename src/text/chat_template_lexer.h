// SPDX-License-Identifier: Apache-2.0
// The chat-template lexer: template source → tokens, with jinja2 3.1's whitespace control (lexer.py tokeniter:
// `-` / `+` markers, lstrip_blocks and trim_blocks as transformers renders templates). Internal to text/.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template_value.h"

namespace fp4serve::text::jinja {

struct Token {
  enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Type type;
  std::string text;
  int line;
  Value literal;  ///< the value of a String, Int or Float token
};

/// Tokens of `source`, ending with one Token::Type::End. Throws FormatError("chat template line N: …") for an
/// unterminated tag or string, a number out of range, or a character no token starts with.
std::vector<Token> lex_template(std::string_view source);

/// Throws FormatError("chat template line `line`: `what`"): the one message form of lexer and parser errors.
[[noreturn]] void syntax_error(int line, const std::string& what);

}  // namespace fp4serve::text::jinja
