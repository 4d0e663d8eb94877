// The Jinja parser's class (jinja_parser.cpp: statements,
// jinja_parser_expr.cpp: expressions). Internal to the interpreter.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "tokenizer/jinja_ast.h"

namespace kvant::jinja {

constexpr int kMaxNesting = 200;  // expression and statement nesting while parsing

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse() {
    Body body = subparse({});
    if (cur().kind != Token::Eof) fail("unexpected '" + cur().text + "'");
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_name(std::string_view n) const { return cur().kind == Token::Name && cur().text == n; }
  bool is_op(std::string_view op) const { return cur().kind == Token::Op && cur().text == op; }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(std::string msg) const { throw SyntaxError{std::move(msg), cur().pos}; }
  std::string describe() const {
    switch (cur().kind) {
      case Token::Eof:
        return "end of template";
      case Token::BlockEnd:
        return "end of statement block";
      case Token::VarEnd:
        return "end of print statement";
      case Token::Data:
        return "template data";
      default:
        return "'" + cur().text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe());
  }
  std::string expect_name() {
    if (cur().kind != Token::Name) fail("expected a name, got " + describe());
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) fail("expected '" + std::string(n) + "', got " + describe());
  }
  void expect_kind(Token::Kind k) {
    if (cur().kind != k)
      fail("expected " + std::string(k == Token::BlockEnd ? "'%}'" : "'}}'") + ", got " +
           describe());
    next();
  }
  ExprPtr node(Expr::Kind k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }
  // A node that a loop stacks on the previous one (a + b + c, a.b.c,
  // x|f|g) deepens the tree as a recursion level would, and counts as one.
  struct Chain {
    explicit Chain(Parser& p) : p_(p) {}
    void add() {
      ++n_;
      if (++p_.depth_ > kMaxNesting) p_.fail("template nested too deeply");
    }
    ~Chain() { p_.depth_ -= n_; }
    Parser& p_;
    int n_ = 0;
  };
  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.fail("template nested too deeply");
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  // ---- statements ----
  Body subparse(std::initializer_list<std::string_view> end_tags);
  Body parse_statements(std::initializer_list<std::string_view> end_tags, bool drop_needle);
  StmtPtr parse_statement();
  StmtPtr parse_if();
  StmtPtr parse_for();
  StmtPtr parse_set();
  StmtPtr parse_macro(bool call_block);
  StmtPtr parse_with();
  void parse_signature(Stmt& s);
  ExprPtr parse_assign_target(bool with_tuple, bool with_namespace,
                              std::string_view extra_end = {});

  // ---- expressions ----
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary(bool with_namespace = false);
  ExprPtr parse_tuple(bool simplified = false, bool with_condexpr = true,
                      std::string_view extra_end = {}, bool explicit_parens = false,
                      bool with_namespace = false);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr n);
  ExprPtr parse_filter_expr(ExprPtr n);
  ExprPtr parse_subscript(ExprPtr n);
  ExprPtr parse_subscribed();
  void parse_call_args(Expr& call);
  ExprPtr parse_filter(ExprPtr n, bool start_inline = false);
  ExprPtr parse_test(ExprPtr n);
  std::string dotted_name();
  bool is_tuple_end(std::string_view extra_end) const {
    if (cur().kind == Token::VarEnd || cur().kind == Token::BlockEnd || is_op(")")) return true;
    return !extra_end.empty() && is_name(extra_end);
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // enclosing for loops (break/continue are only allowed inside one)
  std::vector<std::string> tags_;  // open block tags, for error messages
};

}  // namespace kvant::jinja
