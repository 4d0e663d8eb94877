// Tokens and syntax tree of the Jinja interpreter (tokenizer/jinja.h).
// Internal: the lexer (jinja_lexer.cpp) and parser (jinja_parser.cpp) build
// them, the interpreter (jinja_interp.cpp, jinja_expr.cpp) walks them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace kvant::jinja {

// A syntax error at a byte offset of the (newline-normalized) source.
struct SyntaxError {
  std::string message;
  size_t pos;
};

struct Token {
  enum Kind : uint8_t {
    Data,
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name,
    String,
    Int,
    Float,
    Op,
    Eof
  };
  Kind kind;
  size_t pos;        // byte offset in the normalized source
  std::string text;  // data, name, unescaped string, or the operator
  int64_t i = 0;
  double f = 0;
};

// jinja2's source preparation: \r\n and \r become \n, and one trailing
// newline is dropped (keep_trailing_newline=False).
std::string normalize_source(std::string_view source);
// Splits normalized source into tokens the way jinja2's lexer does with
// trim_blocks and lstrip_blocks on (transformers' settings). Throws SyntaxError.
std::vector<Token> tokenize(const std::string& source);

class Interp;
using FilterFn = Value (*)(Interp&, const Value&, Args&);
using TestFn = bool (*)(Interp&, const Value&, Args&);
// Built-in filters and tests by name (jinja_filters.cpp), or null.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// The entry of jinja2 filters that are not implemented (groupby, wordwrap,
// ...): templates that name them parse, and fail if they run them.
Value unsupported_filter(Interp&, const Value&, Args&);

enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind : uint8_t {
    Const,    // value
    Name,     // name
    NsRef,    // name.attr as an assignment target (name, attr)
    List,     // args
    Tuple,    // args
    Dict,     // args: key, value, key, value, ...
    Getattr,  // args[0].name
    Getitem,  // args[0][args[1]]
    Slice,    // args: start, stop, step (null when absent)
    Call,     // args[0](args[1:], kwargs)
    Filter,   // args[0] | name(args[1:], kwargs); args[0] null in a filter block
    Test,     // args[0] is name(args[1:], kwargs)
    Neg,      // -args[0]
    Pos,      // +args[0]
    Not,      // not args[0]
    Binary,   // args[0] op args[1]
    Compare,  // args[0] cmps[0] args[1] cmps[1] args[2] ...
    And,      // args[0] and args[1]
    Or,       // args[0] or args[1]
    Cond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
    Concat,   // args joined with ~
  };
  Kind kind;
  size_t pos = 0;
  Value value;
  std::string name;
  std::string attr;
  BinOp op = BinOp::Add;
  std::vector<CmpOp> cmps;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star_args, star_kwargs;  // f(*a, **k)
  FilterFn filter = nullptr;       // resolved filter (Filter)
  TestFn test = nullptr;           // resolved test (Test)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum Kind : uint8_t {
    Data,         // text
    Print,        // exprs[0]
    If,           // exprs: conditions; bodies: one per condition, plus else when present
    For,          // target in exprs[0] [if exprs[1]]: bodies[0] [else bodies[1]]
    Set,          // target = exprs[0]
    SetBlock,     // target = rendered bodies[0], through exprs[0] (a Filter) when present
    Macro,        // name(params = defaults): bodies[0]
    CallBlock,    // exprs[0] (a Call) with caller(params) = bodies[0]
    FilterBlock,  // bodies[0] rendered through exprs[0]
    With,         // params = exprs: bodies[0]
    Scope,        // bodies[0] in its own scope (block, generation)
    Break,
    Continue,
  };
  Kind kind;
  size_t pos = 0;
  std::string text;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  ExprPtr target;  // Name, Tuple of names or NsRef
  // Macro and call block signatures.
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};

// Parses normalized source; throws SyntaxError.
Body parse_template(const std::string& source);

}  // namespace kvant::jinja
