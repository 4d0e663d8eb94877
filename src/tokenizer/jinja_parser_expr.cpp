// The Jinja parser's expressions, precedence from loosest to tightest:
// a if b else c, or, and, not, comparisons (chained, with in / not in),
// + -, ~, * / // %, ** (left to right, as jinja2 has it), unary - +, then
// postfix .attr [key] [a:b:c] (call) | filter and `is` tests.
#include "tokenizer/jinja_parser.h"

namespace kvant::jinja {

ExprPtr Parser::parse_expression(bool with_condexpr) {
  Nest nest(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  Chain chain(*this);
  ExprPtr e = parse_or();
  while (is_name("if")) {
    chain.add();
    const size_t pos = cur().pos;
    next();
    auto c = node(Expr::Cond, pos);
    c->args.push_back(parse_or());
    c->args.push_back(std::move(e));
    c->args.push_back(skip_name("else") ? parse_expression() : nullptr);
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::parse_or() {
  Chain chain(*this);
  ExprPtr e = parse_and();
  while (is_name("or")) {
    chain.add();
    auto o = node(Expr::Or, cur().pos);
    next();
    o->args.push_back(std::move(e));
    o->args.push_back(parse_and());
    e = std::move(o);
  }
  return e;
}

ExprPtr Parser::parse_and() {
  Chain chain(*this);
  ExprPtr e = parse_not();
  while (is_name("and")) {
    chain.add();
    auto a = node(Expr::And, cur().pos);
    next();
    a->args.push_back(std::move(e));
    a->args.push_back(parse_not());
    e = std::move(a);
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    Nest nest(*this);
    auto n = node(Expr::Not, cur().pos);
    next();
    n->args.push_back(parse_not());
    return n;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const size_t pos = cur().pos;
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  for (;;) {
    CmpOp op;
    if (is_op("=="))
      op = CmpOp::Eq;
    else if (is_op("!="))
      op = CmpOp::Ne;
    else if (is_op("<"))
      op = CmpOp::Lt;
    else if (is_op("<="))
      op = CmpOp::Le;
    else if (is_op(">"))
      op = CmpOp::Gt;
    else if (is_op(">="))
      op = CmpOp::Ge;
    else if (is_name("in"))
      op = CmpOp::In;
    else if (is_name("not") && look().kind == Token::Name && look().text == "in") {
      op = CmpOp::NotIn;
      next();
    } else {
      break;
    }
    next();
    if (!cmp) {
      cmp = node(Expr::Compare, pos);
      cmp->args.push_back(std::move(first));
    }
    cmp->cmps.push_back(op);
    cmp->args.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  Chain chain(*this);
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    chain.add();
    auto b = node(Expr::Binary, cur().pos);
    b->op = cur().text == "+" ? BinOp::Add : BinOp::Sub;
    next();
    b->args.push_back(std::move(e));
    b->args.push_back(parse_concat());
    e = std::move(b);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  const size_t pos = cur().pos;
  ExprPtr e = parse_math2();
  if (!is_op("~")) return e;
  auto c = node(Expr::Concat, pos);
  c->args.push_back(std::move(e));
  while (skip_op("~")) c->args.push_back(parse_math2());
  return c;
}

ExprPtr Parser::parse_math2() {
  Chain chain(*this);
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    chain.add();
    auto b = node(Expr::Binary, cur().pos);
    const std::string& t = cur().text;
    b->op = t == "*"    ? BinOp::Mul
            : t == "/"  ? BinOp::Div
            : t == "//" ? BinOp::FloorDiv
                        : BinOp::Mod;
    next();
    b->args.push_back(std::move(e));
    b->args.push_back(parse_pow());
    e = std::move(b);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  Chain chain(*this);
  ExprPtr e = parse_unary();
  while (is_op("**")) {
    chain.add();
    auto b = node(Expr::Binary, cur().pos);
    b->op = BinOp::Pow;
    next();
    b->args.push_back(std::move(e));
    b->args.push_back(parse_unary());
    e = std::move(b);
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  Nest nest(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(is_op("-") ? Expr::Neg : Expr::Pos, cur().pos);
    next();
    e->args.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary(bool with_namespace) {
  const Token& tok = cur();
  const size_t pos = tok.pos;
  if (tok.kind == Token::Name) {
    const std::string n = tok.text;
    next();
    if (n == "true" || n == "false" || n == "True" || n == "False") {
      auto c = node(Expr::Const, pos);
      c->value = Value::boolean(n == "true" || n == "True");
      return c;
    }
    if (n == "none" || n == "None") {
      auto c = node(Expr::Const, pos);
      c->value = Value::none();
      return c;
    }
    if (with_namespace && is_op(".")) {
      next();
      auto r = node(Expr::NsRef, pos);
      r->name = n;
      r->attr = expect_name();
      return r;
    }
    auto e = node(Expr::Name, pos);
    e->name = n;
    return e;
  }
  if (tok.kind == Token::String) {
    std::string s;
    while (cur().kind == Token::String) {
      s += cur().text;
      next();
    }
    auto c = node(Expr::Const, pos);
    c->value = Value::string(std::move(s));
    return c;
  }
  if (tok.kind == Token::Int || tok.kind == Token::Float) {
    auto c = node(Expr::Const, pos);
    c->value = tok.kind == Token::Int ? Value::integer(tok.i) : Value::number(tok.f);
    next();
    return c;
  }
  if (skip_op("(")) {
    ExprPtr e = parse_tuple(false, true, {}, true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) return parse_list();
  if (is_op("{")) return parse_dict();
  fail("unexpected " + describe());
}

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, std::string_view extra_end,
                            bool explicit_parens, bool with_namespace) {
  const size_t pos = cur().pos;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  for (;;) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail("Expected an expression, got " + describe());
  }
  auto t = node(Expr::Tuple, pos);
  t->args = std::move(items);
  return t;
}

ExprPtr Parser::parse_list() {
  auto l = node(Expr::List, cur().pos);
  expect_op("[");
  while (!is_op("]")) {
    if (!l->args.empty()) expect_op(",");
    if (is_op("]")) break;
    l->args.push_back(parse_expression());
  }
  expect_op("]");
  return l;
}

ExprPtr Parser::parse_dict() {
  auto d = node(Expr::Dict, cur().pos);
  expect_op("{");
  while (!is_op("}")) {
    if (!d->args.empty()) expect_op(",");
    if (is_op("}")) break;
    d->args.push_back(parse_expression());
    expect_op(":");
    d->args.push_back(parse_expression());
  }
  expect_op("}");
  return d;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  Chain chain(*this);
  for (;;) {
    chain.add();
    if (is_op(".") || is_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (is_op("(")) {
      auto c = node(Expr::Call, cur().pos);
      c->args.push_back(std::move(e));
      parse_call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  Chain chain(*this);
  for (;;) {
    chain.add();
    if (is_op("|")) {
      e = parse_filter(std::move(e));
    } else if (is_name("is")) {
      e = parse_test(std::move(e));
    } else if (is_op("(")) {
      auto c = node(Expr::Call, cur().pos);
      c->args.push_back(std::move(e));
      parse_call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr e) {
  const size_t pos = cur().pos;
  if (skip_op(".")) {
    if (cur().kind == Token::Name) {
      auto g = node(Expr::Getattr, pos);
      g->args.push_back(std::move(e));
      g->name = cur().text;
      next();
      return g;
    }
    if (cur().kind != Token::Int) fail("expected name or number");
    auto g = node(Expr::Getitem, pos);
    g->args.push_back(std::move(e));
    auto k = node(Expr::Const, cur().pos);
    k->value = Value::integer(cur().i);
    next();
    g->args.push_back(std::move(k));
    return g;
  }
  expect_op("[");
  std::vector<ExprPtr> keys;
  while (!is_op("]")) {
    if (!keys.empty()) expect_op(",");
    keys.push_back(parse_subscribed());
  }
  expect_op("]");
  auto g = node(Expr::Getitem, pos);
  g->args.push_back(std::move(e));
  if (keys.size() == 1) {
    g->args.push_back(std::move(keys[0]));
  } else {
    auto t = node(Expr::Tuple, pos);
    t->args = std::move(keys);
    g->args.push_back(std::move(t));
  }
  return g;
}

ExprPtr Parser::parse_subscribed() {
  const size_t pos = cur().pos;
  std::vector<ExprPtr> parts;
  if (skip_op(":")) {
    parts.push_back(nullptr);
  } else {
    ExprPtr e = parse_expression();
    if (!skip_op(":")) return e;
    parts.push_back(std::move(e));
  }
  if (is_op(":") || is_op("]") || is_op(",")) {
    parts.push_back(nullptr);
  } else {
    parts.push_back(parse_expression());
  }
  if (skip_op(":")) {
    parts.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression());
  } else {
    parts.push_back(nullptr);
  }
  auto s = node(Expr::Slice, pos);
  s->args = std::move(parts);
  return s;
}

void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool need_comma = false;
  while (!is_op(")")) {
    if (need_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (skip_op("*")) {
      if (call.star_args || call.star_kwargs) fail("invalid syntax for function call expression");
      call.star_args = parse_expression();
    } else if (skip_op("**")) {
      if (call.star_kwargs) fail("invalid syntax for function call expression");
      call.star_kwargs = parse_expression();
    } else if (cur().kind == Token::Name && look().kind == Token::Op && look().text == "=") {
      if (call.star_kwargs) fail("invalid syntax for function call expression");
      std::string key = cur().text;
      next();
      next();
      call.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (call.star_args || call.star_kwargs || !call.kwargs.empty())
        fail("invalid syntax for function call expression");
      call.args.push_back(parse_expression());
    }
    need_comma = true;
  }
  expect_op(")");
}

std::string Parser::dotted_name() {
  std::string n = expect_name();
  while (skip_op(".")) n += "." + expect_name();
  return n;
}

ExprPtr Parser::parse_filter(ExprPtr e, bool start_inline) {
  Chain chain(*this);
  while (is_op("|") || start_inline) {
    chain.add();
    if (!start_inline) next();
    start_inline = false;
    auto f = node(Expr::Filter, cur().pos);
    f->name = dotted_name();
    f->filter = find_filter(f->name);
    f->args.push_back(std::move(e));
    if (is_op("(")) parse_call_args(*f);
    e = std::move(f);
  }
  return e;
}

ExprPtr Parser::parse_test(ExprPtr e) {
  const size_t pos = cur().pos;
  next();  // is
  const bool negated = skip_name("not");
  auto t = node(Expr::Test, pos);
  t->name = dotted_name();
  t->test = find_test(t->name);
  t->args.push_back(std::move(e));
  const Token::Kind k = cur().kind;
  if (is_op("(")) {
    parse_call_args(*t);
  } else if ((k == Token::Name || k == Token::String || k == Token::Int || k == Token::Float ||
              is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail("You cannot chain multiple tests with is");
    t->args.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return t;
  auto n = node(Expr::Not, pos);
  n->args.push_back(std::move(t));
  return n;
}

}  // namespace kvant::jinja
