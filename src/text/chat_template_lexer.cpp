// SPDX-License-Identifier: Apache-2.0
// Lexer of the chat-template Jinja subset; the whitespace rules follow jinja2 3.1 (lexer.py tokeniter).
#include <algorithm>

#include "fp4serve/error.h"
#include "text/chat_template_lexer.h"
#include "text/tokenizer_unicode.h"

namespace fp4serve::text::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python string-literal unescaping, as jinja2 applies "unicode-escape" to literal contents.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\\' || k + 1 == s.size()) {
      out += s[k];
      continue;
    }
    const char c = s[++k];
    auto hex = [&](size_t digits) {
      const std::string h(s.substr(k + 1, std::min(digits, s.size() - k - 1)));
      if (h.size() != digits || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        syntax_error(line, "bad escape \\" + std::string(1, c) + h);
      }
      k += digits;
      const auto cp = static_cast<char32_t>(std::stoul(h, nullptr, 16));
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) syntax_error(line, "escape outside Unicode: " + h);
      unicode::append_utf8(out, cp);
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '0': out += '\0'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // line continuation
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default: out += '\\'; out += c;  // unknown escapes stay as written, as in Python
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    // jinja2 normalizes newlines and, with keep_trailing_newline off, drops one final newline.
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] == '\r') {
        src_ += '\n';
        if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
      } else {
        src_ += raw[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == src_.size()) {
        emit_text(text);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: block and comment tags only
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(), is_space)) {
          text.resize(l_pos);
        }
      }
      emit_text(text);
      count_lines(pos_, tag);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) syntax_error(line_, "unterminated comment");
        const char end_sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
        count_lines(pos_, end);
        pos_ = end + 2;
        line_starting = finish_tag(end_sign, true);
        continue;
      }
      tokens_.push_back({kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin, "", line_, {}});
      line_starting = lex_tag(kind == '{');
    }
    tokens_.push_back({Token::Type::End, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k) {
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return src_.size();
  }
  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Type::Text, text, line_, {}});
  }
  void count_lines(size_t from, size_t to) { line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(from), src_.begin() + static_cast<std::ptrdiff_t>(to), '\n')); }

  // After a tag's closing delimiter: '-' eats all whitespace, block/comment ends eat one newline
  // (trim_blocks) unless '+'. Returns whether the consumed text ended a line (jinja2's line_starting).
  bool finish_tag(char end_sign, bool block) {
    const size_t start = pos_;
    if (end_sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (block && end_sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    count_lines(start, pos_);
    return pos_ > start ? src_[pos_ - 1] == '\n' : false;
  }

  bool lex_tag(bool variable) {
    const std::string close = variable ? "}}" : "%}";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) syntax_error(line_, std::string("unterminated ") + (variable ? "{{" : "{%"));
      for (const char sign : {'-', '+', '\0'}) {
        if (variable && sign == '+') continue;
        const std::string end = sign ? std::string(1, sign) + close : close;
        if (src_.compare(pos_, end.size(), end) == 0) {
          pos_ += end.size();
          tokens_.push_back({variable ? Token::Type::VarEnd : Token::Type::BlockEnd, "", line_, {}});
          return finish_tag(sign, !variable);
        }
      }
      lex_one();
    }
  }

  void lex_one() {
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      tokens_.push_back({Token::Type::Name, src_.substr(pos_, e - pos_), line_, {}});
      pos_ = e;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos_;
      auto digits = [&] {
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      };
      digits();
      bool is_float = false;
      if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
        is_float = true;
        ++e;
        digits();
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
          is_float = true;
          e = x;
          digits();
        }
      }
      std::string num = src_.substr(pos_, e - pos_);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      try {
        tokens_.push_back(is_float ? Token{Token::Type::Float, num, line_, Value::floating(std::stod(num))}
                                   : Token{Token::Type::Int, num, line_, Value::integer(std::stoll(num))});
      } catch (const std::exception&) {
        syntax_error(line_, "number out of range: " + num);
      }
      pos_ = e;
      return;
    }
    if (c == '\'' || c == '"') {
      size_t e = pos_ + 1;
      while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
      if (e >= src_.size()) syntax_error(line_, "unterminated string literal");
      const int line = line_;
      count_lines(pos_, e);
      tokens_.push_back({Token::Type::String, "", line, Value::string(unescape(src_.substr(pos_ + 1, e - pos_ - 1), line))});
      pos_ = e + 1;
      return;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                       "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : kOps) {
      if (src_.compare(pos_, std::char_traits<char>::length(op), op) == 0) {
        tokens_.push_back({Token::Type::Op, op, line_, {}});
        pos_ += std::char_traits<char>::length(op);
        return;
      }
    }
    syntax_error(line_, std::string("unexpected character '") + c + "'");
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

void syntax_error(int line, const std::string& what) {
  throw FormatError("chat template line " + std::to_string(line) + ": " + what);
}

std::vector<Token> lex_template(std::string_view source) { return Lexer(source).run(); }

}  // namespace fp4serve::text::jinja
