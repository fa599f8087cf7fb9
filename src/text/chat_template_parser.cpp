// SPDX-License-Identifier: Apache-2.0
// Recursive-descent parser for the chat-template Jinja subset (tokens from chat_template_lexer.h). Operator
// precedence and statement forms follow jinja2 3.1 (parser.py parse_* methods).
#include <algorithm>
#include <set>

#include "fp4serve/error.h"
#include "text/chat_template_ast.h"
#include "text/chat_template_lexer.h"
#include "text/chat_template_names.h"

namespace fp4serve::text::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_all() {
    std::string stop;
    Body body = parse_body({}, stop);
    if (peek().type != Token::Type::End) syntax_error(peek().line, "unexpected {% " + stop + " %}");
    // A call of a name that is neither a global function nor a macro of this template can never render.
    for (const auto& [name, line] : macro_calls_) {
      if (!macro_names_.count(name) && name != "caller") {
        std::set<std::string> known = kFunctions;
        known.insert(macro_names_.begin(), macro_names_.end());
        unsupported(line, "function " + name + "()", known);
      }
    }
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(k_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(k_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::Op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Token::Type::Name && peek(ahead).text == name;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) syntax_error(peek().line, std::string("expected '") + op + "', found '" + describe(peek()) + "'");
    ++k_;
  }
  void expect_block_end() {
    if (peek().type != Token::Type::BlockEnd) syntax_error(peek().line, "expected '%}', found '" + describe(peek()) + "'");
    ++k_;
  }
  std::string expect_name() {
    if (peek().type != Token::Type::Name) syntax_error(peek().line, "expected a name, found '" + describe(peek()) + "'");
    return next().text;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::Text: return "text";
      case Token::Type::VarBegin: return "{{";
      case Token::Type::VarEnd: return "}}";
      case Token::Type::BlockBegin: return "{%";
      case Token::Type::BlockEnd: return "%}";
      case Token::Type::Name: case Token::Type::Int: case Token::Type::Float: case Token::Type::Op: return t.text;
      case Token::Type::String: return "string literal";
      case Token::Type::End: return "end of template";
    }
    return "?";
  }

  // Parses nodes until a block tag whose keyword is in `stops` (left unconsumed, its name in `stop`).
  Body parse_body(const std::set<std::string>& stops, std::string& stop) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.type == Token::Type::End) {
        if (!stops.empty()) syntax_error(tok.line, "missing {% " + *stops.rbegin() + " %}");
        return body;
      }
      if (tok.type == Token::Type::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->text = next().text;
        body.push_back(std::move(n));
      } else if (tok.type == Token::Type::VarBegin) {
        ++k_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->line = tok.line;
        n->expr = parse_expression(true);
        if (peek().type != Token::Type::VarEnd) syntax_error(peek().line, "expected '}}', found '" + describe(peek()) + "'");
        ++k_;
        body.push_back(std::move(n));
      } else if (tok.type == Token::Type::BlockBegin) {
        const Token& kw = peek(1);
        if (kw.type != Token::Type::Name) syntax_error(kw.line, "expected a statement after '{%'");
        if (stops.count(kw.text)) {
          stop = kw.text;
          return body;
        }
        k_ += 2;
        body.push_back(parse_statement(kw.text, kw.line));
      } else {
        syntax_error(tok.line, "unexpected '" + describe(tok) + "'");
      }
    }
  }

  void consume_tag(const char* keyword) {  // at {% keyword ... the caller checked keyword
    k_ += 2;
    (void)keyword;
  }

  std::unique_ptr<Node> parse_statement(const std::string& kw, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string stop;
    if (kw == "if") {
      n->kind = Node::Kind::If;
      n->conditions.push_back(parse_expression(true));
      expect_block_end();
      while (true) {
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, stop));
        consume_tag(stop.c_str());
        if (stop == "elif") {
          n->conditions.push_back(parse_expression(true));
          expect_block_end();
        } else if (stop == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"}, stop);
          consume_tag("endif");
          expect_block_end();
          return n;
        } else {
          expect_block_end();
          return n;
        }
      }
    }
    if (kw == "for") {
      n->kind = Node::Kind::For;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++k_;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) syntax_error(peek().line, "expected 'in' in for loop");
      ++k_;
      n->expr = parse_expression(false);
      if (is_name("if")) {
        ++k_;
        n->filter = parse_expression(false);
      }
      if (is_name("recursive")) throw UnsupportedError("chat template line " + std::to_string(line) + ": recursive for loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"}, stop);
      consume_tag(stop.c_str());
      expect_block_end();
      if (stop == "else") {
        n->else_body = parse_body({"endfor"}, stop);
        consume_tag("endfor");
        expect_block_end();
      }
      return n;
    }
    if (kw == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        ++k_;
        n->attr = expect_name();
      }
      while (is_op(",") && n->attr.empty()) {
        ++k_;
        n->targets.push_back(expect_name());
      }
      if (peek().type == Token::Type::BlockEnd && n->targets.size() == 1 && n->attr.empty()) {
        ++k_;
        n->kind = Node::Kind::SetBlock;
        n->body = parse_body({"endset"}, stop);
        consume_tag("endset");
        expect_block_end();
        return n;
      }
      n->kind = Node::Kind::Set;
      expect_op("=");
      n->expr = parse_expression(true);
      if (is_op(",")) {  // set a, b = x, y: a tuple on the right
        auto tuple = std::make_unique<Expr>();
        tuple->kind = Expr::Kind::ListLit;
        tuple->args.push_back(std::move(n->expr));
        while (is_op(",")) {
          ++k_;
          tuple->args.push_back(parse_expression(true));
        }
        n->expr = std::move(tuple);
      }
      expect_block_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' AssistantTracker block: marks assistant text, renders as is
      n->kind = Node::Kind::Block;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, stop);
      consume_tag("endgeneration");
      expect_block_end();
      return n;
    }
    if (kw == "macro") {
      n->kind = Node::Kind::Macro;
      n->targets.push_back(expect_name());
      macro_names_.insert(n->targets[0]);
      parse_params(*n);
      expect_block_end();
      n->body = parse_body({"endmacro"}, stop);
      consume_tag("endmacro");
      if (peek().type == Token::Type::Name) ++k_;  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (kw == "call") {
      n->kind = Node::Kind::CallBlock;
      if (is_op("(")) parse_params(*n);
      n->expr = parse_expression(true);
      if (n->expr->kind != Expr::Kind::Call || !n->expr->is_macro) {
        syntax_error(line, "{% call %} needs a macro call");
      }
      expect_block_end();
      n->body = parse_body({"endcall"}, stop);
      consume_tag("endcall");
      expect_block_end();
      return n;
    }
    static const std::set<std::string> kKnownUnsupported = {
        "filter", "include", "import", "from", "extends", "block", "with", "raw", "autoescape", "do"};
    if (kKnownUnsupported.count(kw)) {
      throw UnsupportedError("chat template line " + std::to_string(line) + ": {% " + kw +
                             " %} is not supported by fp4serve's Jinja subset (supported statements: if/elif/else, "
                             "for/else, set, set-block, macro, call, break, continue, generation)");
    }
    syntax_error(line, "unknown statement {% " + kw + " %}");
  }

  // (name, name = default, ...) of a macro or call block.
  void parse_params(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      n.params.push_back(expect_name());
      if (is_op("=")) {
        ++k_;
        n.defaults.push_back(parse_expression(true));
      } else {
        n.defaults.emplace_back();
      }
      if (!is_op(",")) break;
      ++k_;
    }
    expect_op(")");
  }

  // ------------------------------------------------------------------------------------------ expressions

  static std::unique_ptr<Expr> make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  std::unique_ptr<Expr> parse_expression(bool with_conditional) {
    auto e = parse_or();
    while (with_conditional && is_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Kind::Conditional, line);
      auto test = parse_or();
      std::unique_ptr<Expr> otherwise;
      if (is_name("else")) {
        ++k_;
        otherwise = parse_expression(true);
      }
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(e));
      cond->args.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  std::unique_ptr<Expr> binary(const std::string& op, std::unique_ptr<Expr> l, std::unique_ptr<Expr> r, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  std::unique_ptr<Expr> parse_or() {
    auto e = parse_and();
    while (is_name("or")) e = binary("or", std::move(e), (++k_, parse_and()), peek().line);
    return e;
  }
  std::unique_ptr<Expr> parse_and() {
    auto e = parse_not();
    while (is_name("and")) e = binary("and", std::move(e), (++k_, parse_not()), peek().line);
    return e;
  }
  std::unique_ptr<Expr> parse_not() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::Not, next().line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  std::unique_ptr<Expr> parse_compare() {
    auto first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (peek().type == Token::Type::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++k_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        k_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, peek().line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  std::unique_ptr<Expr> parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), parse_concat(), peek().line);
    }
    return e;
  }
  std::unique_ptr<Expr> parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) e = binary("~", std::move(e), (++k_, parse_math2()), peek().line);
    return e;
  }
  std::unique_ptr<Expr> parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      e = binary(op, std::move(e), parse_pow(), peek().line);
    }
    return e;
  }
  std::unique_ptr<Expr> parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) e = binary("**", std::move(e), (++k_, parse_unary(true)), peek().line);
    return e;
  }
  std::unique_ptr<Expr> parse_unary(bool with_filter) {
    std::unique_ptr<Expr> e;
    if (is_op("-")) {
      e = make(Expr::Kind::Negate, next().line);
      e->args.push_back(parse_unary(false));
    } else if (is_op("+")) {
      ++k_;
      e = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  std::unique_ptr<Expr> parse_primary() {
    const Token& tok = peek();
    switch (tok.type) {
      case Token::Type::Name: {
        ++k_;
        auto e = make(Expr::Kind::Literal, tok.line);
        if (tok.text == "true" || tok.text == "True") {
          e->value = Value::boolean(true);
        } else if (tok.text == "false" || tok.text == "False") {
          e->value = Value::boolean(false);
        } else if (tok.text == "none" || tok.text == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::Name;
          e->name = tok.text;
        }
        return e;
      }
      case Token::Type::String: {
        auto e = make(Expr::Kind::Literal, tok.line);
        std::string s;
        while (peek().type == Token::Type::String) s += next().literal.s;  // adjacent literals concatenate
        e->value = Value::string(std::move(s));
        return e;
      }
      case Token::Type::Int:
      case Token::Type::Float: {
        auto e = make(Expr::Kind::Literal, tok.line);
        e->value = next().literal;
        return e;
      }
      case Token::Type::Op:
        if (tok.text == "(") {
          ++k_;
          if (is_op(")")) {
            ++k_;
            auto empty = make(Expr::Kind::ListLit, tok.line);
            empty->is_tuple = true;
            return empty;
          }
          auto first = parse_expression(true);
          if (!is_op(",")) {
            expect_op(")");
            return first;
          }
          auto tuple = make(Expr::Kind::ListLit, tok.line);
          tuple->is_tuple = true;
          tuple->args.push_back(std::move(first));
          while (is_op(",")) {
            ++k_;
            if (is_op(")")) break;
            tuple->args.push_back(parse_expression(true));
          }
          expect_op(")");
          return tuple;
        }
        if (tok.text == "[") {
          ++k_;
          auto list = make(Expr::Kind::ListLit, tok.line);
          while (!is_op("]")) {
            list->args.push_back(parse_expression(true));
            if (!is_op(",")) break;
            ++k_;
          }
          expect_op("]");
          return list;
        }
        if (tok.text == "{") {
          ++k_;
          auto dict = make(Expr::Kind::DictLit, tok.line);
          while (!is_op("}")) {
            dict->args.push_back(parse_expression(true));
            expect_op(":");
            dict->args.push_back(parse_expression(true));
            if (!is_op(",")) break;
            ++k_;
          }
          expect_op("}");
          return dict;
        }
        break;
      case Token::Type::Text: case Token::Type::VarBegin: case Token::Type::VarEnd: case Token::Type::BlockBegin:
      case Token::Type::BlockEnd: case Token::Type::End:
        break;
    }
    syntax_error(tok.line, "unexpected '" + describe(tok) + "' in expression");
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == Token::Type::Name && is_op("=", 1)) {
        std::string key = next().text;
        ++k_;
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        e.args.push_back(parse_expression(true));
      }
      if (!is_op(",")) break;
      ++k_;
    }
    expect_op(")");
  }

  std::unique_ptr<Expr> parse_postfix(std::unique_ptr<Expr> e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (peek().type == Token::Type::Int) {  // foo.0 is foo[0]
          auto item = make(Expr::Kind::GetItem, line);
          item->args.push_back(std::move(e));
          auto idx = make(Expr::Kind::Literal, line);
          idx->value = next().literal;
          item->args.push_back(std::move(idx));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::GetAttr, line);
        attr->name = expect_name();
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (is_op("[")) {
        const int line = next().line;
        std::unique_ptr<Expr> parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++colons > 2) syntax_error(line, "too many ':' in subscript");
            ++k_;
            continue;
          }
          parts[colons] = parse_expression(true);
        }
        ++k_;
        auto sub = make(colons ? Expr::Kind::Slice : Expr::Kind::GetItem, line);
        sub->args.push_back(std::move(e));
        if (!colons && !parts[0]) syntax_error(line, "empty subscript");
        for (int p = 0; p < (colons ? 3 : 1); ++p) sub->args.push_back(std::move(parts[p]));
        e = std::move(sub);
      } else if (is_op("(")) {
        const int line = peek().line;
        auto call = make(Expr::Kind::Call, line);
        if (e->kind == Expr::Kind::Name) {
          call->name = e->name;
          if (!kFunctions.count(call->name)) {  // a macro, possibly defined further down; checked at the end
            call->is_macro = true;
            macro_calls_.emplace_back(call->name, line);
          }
        } else if (e->kind == Expr::Kind::GetAttr) {
          call->name = e->name;
          call->is_method = true;
          if (!kMethods.count(call->name)) unsupported(line, "method ." + call->name + "()", kMethods);
          call->args.push_back(std::move(e->args[0]));
        } else {
          throw UnsupportedError("chat template line " + std::to_string(line) + ": calling an expression result");
        }
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  std::unique_ptr<Expr> parse_filters(std::unique_ptr<Expr> e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto f = make(Expr::Kind::Filter, line);
        f->name = expect_name();
        if (!kFilters.count(f->name)) unsupported(line, "filter '" + f->name + "'", kFilters);
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::Kind::Test, line);
        if (is_name("not")) {
          ++k_;
          t->negated = true;
        }
        // `is none` / `is true`: the test names are also literals, so take the token's text.
        if (peek().type != Token::Type::Name) syntax_error(line, "expected a test name after 'is'");
        t->name = next().text;
        if (!kTests.count(t->name)) unsupported(line, "test 'is " + t->name + "'", kTests);
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((peek().type == Token::Type::String || peek().type == Token::Type::Int ||
                    peek().type == Token::Type::Float || peek().type == Token::Type::Name) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") &&
                   !is_name("not")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  [[noreturn]] static void unsupported(int line, const std::string& what, const std::set<std::string>& known) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    throw UnsupportedError("chat template line " + std::to_string(line) + ": " + what +
                           " is not supported by fp4serve's Jinja subset (supported: " + list + ")");
  }

  std::vector<Token> t_;
  size_t k_ = 0;
  std::set<std::string> macro_names_;
  std::vector<std::pair<std::string, int>> macro_calls_;
};

}  // namespace

Body parse_template(std::string_view source) {
  Parser parser(lex_template(source));
  return parser.parse_all();
}

}  // namespace fp4serve::text::jinja
