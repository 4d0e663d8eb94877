// The Jinja parser: tokens to the syntax tree of jinja_ast.h, with jinja2's
// grammar and operator precedence (parser.py): conditional expressions,
// or, and, not, comparisons (chained), + -, ~, * / // %, ** (left to
// right, as jinja2 has it), unary - +, then postfix subscripts, calls,
// filters and tests. Statements: if/elif/else, for (with else, a filter
// condition, break and continue), set (with tuples, namespace attributes
// and block form), macro, call, filter, with, block, print and the
// generation tag transformers adds.
#include "tokenizer/jinja_parser.h"

namespace kvant::jinja {

Body Parser::subparse(std::initializer_list<std::string_view> end_tags) {
  Body body;
  while (cur().kind != Token::Eof) {
    const Token& tok = cur();
    if (tok.kind == Token::Data) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Data;
      s->pos = tok.pos;
      s->text = tok.text;
      body.push_back(std::move(s));
      next();
    } else if (tok.kind == Token::VarBegin) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Print;
      s->pos = tok.pos;
      next();
      s->exprs.push_back(parse_tuple());
      expect_kind(Token::VarEnd);
      body.push_back(std::move(s));
    } else if (tok.kind == Token::BlockBegin) {
      next();
      for (std::string_view e : end_tags)
        if (is_name(e)) return body;
      body.push_back(parse_statement());
      expect_kind(Token::BlockEnd);
    } else {
      fail("unexpected " + describe());
    }
  }
  return body;
}

Body Parser::parse_statements(std::initializer_list<std::string_view> end_tags, bool drop_needle) {
  skip_op(":");
  expect_kind(Token::BlockEnd);
  Body body = subparse(end_tags);
  if (cur().kind == Token::Eof) {
    std::string want;
    for (std::string_view e : end_tags)
      want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
    fail("unexpected end of template, expected " + want +
         (tags_.empty() ? "" : " to close '" + tags_.back() + "'"));
  }
  if (drop_needle) next();
  return body;
}

StmtPtr Parser::parse_statement() {
  Nest nest(*this);
  if (cur().kind != Token::Name) fail("tag name expected");
  const std::string tag = cur().text;
  const size_t pos = cur().pos;
  tags_.push_back(tag);
  StmtPtr s;
  if (tag == "if") {
    s = parse_if();
  } else if (tag == "for") {
    s = parse_for();
  } else if (tag == "set") {
    s = parse_set();
  } else if (tag == "macro" || tag == "call") {
    s = parse_macro(tag == "call");
  } else if (tag == "with") {
    s = parse_with();
  } else if (tag == "filter") {
    next();
    s = std::make_unique<Stmt>();
    s->kind = Stmt::FilterBlock;
    s->exprs.push_back(parse_filter(nullptr, true));
    s->bodies.push_back(parse_statements({"endfilter"}, true));
  } else if (tag == "block" || tag == "generation") {
    next();
    if (tag == "block") {
      expect_name();
      skip_name("scoped");
      skip_name("required");
    }
    s = std::make_unique<Stmt>();
    s->kind = Stmt::Scope;
    s->bodies.push_back(parse_statements({tag == "block" ? "endblock" : "endgeneration"}, true));
    if (tag == "block" && cur().kind == Token::Name) next();  // {% endblock name %}
  } else if (tag == "print") {
    next();
    s = std::make_unique<Stmt>();
    s->kind = Stmt::Print;
    s->exprs.push_back(parse_tuple());
  } else if (tag == "break" || tag == "continue") {
    if (loops_ == 0) fail("'" + tag + "' outside of a loop");
    next();
    s = std::make_unique<Stmt>();
    s->kind = tag == "break" ? Stmt::Break : Stmt::Continue;
  } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from") {
    fail("'" + tag + "' is not supported: chat templates are rendered on their own");
  } else {
    tags_.pop_back();
    fail("Encountered unknown tag '" + tag + "'.");
  }
  tags_.pop_back();
  s->pos = pos;
  return s;
}

StmtPtr Parser::parse_if() {
  next();
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::If;
  for (;;) {
    s->exprs.push_back(parse_tuple(false, false));
    s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
    const std::string end = cur().text;
    next();
    if (end == "elif") continue;
    if (end == "else") s->bodies.push_back(parse_statements({"endif"}, true));
    break;
  }
  return s;
}

StmtPtr Parser::parse_for() {
  next();
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::For;
  s->target = parse_assign_target(true, false, "in");
  expect_name("in");
  s->exprs.push_back(parse_tuple(false, false, "recursive"));
  if (skip_name("if")) s->exprs.push_back(parse_expression());
  if (is_name("recursive")) fail("recursive for loops are not supported");
  ++loops_;
  s->bodies.push_back(parse_statements({"endfor", "else"}, false));
  --loops_;
  const std::string end = cur().text;
  next();
  if (end == "else") s->bodies.push_back(parse_statements({"endfor"}, true));
  return s;
}

StmtPtr Parser::parse_set() {
  next();
  auto s = std::make_unique<Stmt>();
  s->target = parse_assign_target(true, true);
  if (skip_op("=")) {
    s->kind = Stmt::Set;
    s->exprs.push_back(parse_tuple());
    return s;
  }
  s->kind = Stmt::SetBlock;
  if (is_op("|")) s->exprs.push_back(parse_filter(nullptr));
  const int loops = loops_;
  loops_ = 0;
  s->bodies.push_back(parse_statements({"endset"}, true));
  loops_ = loops;
  return s;
}

namespace {

// Whether a body reads `name` anywhere (macros: varargs, kwargs, caller).
bool mentions(const Expr* e, std::string_view name);
bool mentions(const Body& body, std::string_view name) {
  for (const StmtPtr& s : body) {
    for (const ExprPtr& e : s->exprs)
      if (mentions(e.get(), name)) return true;
    for (const ExprPtr& e : s->defaults)
      if (mentions(e.get(), name)) return true;
    for (const Body& b : s->bodies)
      if (mentions(b, name)) return true;
  }
  return false;
}
bool mentions(const Expr* e, std::string_view name) {
  if (!e) return false;
  if (e->kind == Expr::Name && e->name == name) return true;
  for (const ExprPtr& a : e->args)
    if (mentions(a.get(), name)) return true;
  for (const auto& kv : e->kwargs)
    if (mentions(kv.second.get(), name)) return true;
  return mentions(e->star_args.get(), name) || mentions(e->star_kwargs.get(), name);
}

}  // namespace

StmtPtr Parser::parse_macro(bool call_block) {
  next();
  auto s = std::make_unique<Stmt>();
  if (call_block) {
    s->kind = Stmt::CallBlock;
    s->name = "caller";
    if (is_op("(")) parse_signature(*s);
    ExprPtr call = parse_expression();
    if (call->kind != Expr::Call) fail("expected call");
    s->exprs.push_back(std::move(call));
  } else {
    s->kind = Stmt::Macro;
    s->name = expect_name();
    parse_signature(*s);
  }
  const int loops = loops_;
  loops_ = 0;
  s->bodies.push_back(parse_statements({call_block ? "endcall" : "endmacro"}, true));
  loops_ = loops;
  s->uses_varargs = mentions(s->bodies[0], "varargs");
  s->uses_kwargs = mentions(s->bodies[0], "kwargs");
  s->uses_caller = mentions(s->bodies[0], "caller");
  return s;
}

void Parser::parse_signature(Stmt& s) {
  expect_op("(");
  while (!is_op(")")) {
    if (!s.params.empty()) expect_op(",");
    s.params.push_back(expect_name());
    if (skip_op("=")) {
      s.defaults.push_back(parse_expression());
    } else if (!s.defaults.empty()) {
      fail("non-default argument follows default argument");
    }
  }
  expect_op(")");
}

StmtPtr Parser::parse_with() {
  next();
  auto s = std::make_unique<Stmt>();
  s->kind = Stmt::With;
  while (cur().kind != Token::BlockEnd) {
    if (!s->params.empty()) expect_op(",");
    s->params.push_back(expect_name());
    expect_op("=");
    s->exprs.push_back(parse_expression());
  }
  s->bodies.push_back(parse_statements({"endwith"}, true));
  return s;
}

ExprPtr Parser::parse_assign_target(bool with_tuple, bool with_namespace,
                                    std::string_view extra_end) {
  const size_t pos = cur().pos;
  ExprPtr t = with_tuple ? parse_tuple(true, true, extra_end, false, with_namespace)
                         : parse_primary(with_namespace);
  auto assignable = [](const Expr& e) { return e.kind == Expr::Name || e.kind == Expr::NsRef; };
  bool ok = assignable(*t);
  if (t->kind == Expr::Tuple) {
    ok = true;
    for (const ExprPtr& a : t->args) ok = ok && assignable(*a);
  }
  if (!ok || (t->kind == Expr::Name && (t->name == "true" || t->name == "none")))
    throw SyntaxError{"can't assign to this expression", pos};
  return t;
}

// Filters and tests that do not exist are errors when the template is
// parsed, unless they sit in an if statement or a conditional expression
// (jinja2 defers those to the moment they run).
namespace {
void check_expr(const Expr* e, bool soft);
void check_body(const Body& body, bool soft) {
  for (const StmtPtr& s : body) {
    const bool if_like = s->kind == Stmt::If;
    for (const ExprPtr& e : s->exprs) check_expr(e.get(), soft || if_like);
    for (const ExprPtr& e : s->defaults) check_expr(e.get(), false);
    for (const Body& b : s->bodies)
      check_body(b, if_like ? true : (s->kind == Stmt::Scope ? soft : false));
  }
}
void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (!soft && e->kind == Expr::Filter && !e->filter)
    throw SyntaxError{"No filter named '" + e->name + "'.", e->pos};
  if (!soft && e->kind == Expr::Test && !e->test)
    throw SyntaxError{"No test named '" + e->name + "'.", e->pos};
  const bool inner_soft = soft || e->kind == Expr::Cond;
  for (const ExprPtr& a : e->args) check_expr(a.get(), inner_soft);
  for (const auto& kv : e->kwargs) check_expr(kv.second.get(), inner_soft);
  check_expr(e->star_args.get(), inner_soft);
  check_expr(e->star_kwargs.get(), inner_soft);
}
}  // namespace

Body parse_template(const std::string& source) {
  Body body = Parser(tokenize(source)).parse();
  check_body(body, false);
  return body;
}

}  // namespace kvant::jinja
