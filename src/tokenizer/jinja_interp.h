// The tree-walking interpreter behind tokenizer/jinja.h: scopes with
// jinja2's rules (a for loop's body and a macro's body are scopes of their
// own, if is not), statements (jinja_interp.cpp), expressions with the
// sandbox's attribute and item rules (jinja_expr.cpp), filters and tests
// (jinja_filters.cpp), globals (jinja_globals.cpp). Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace kvant::jinja {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  ScopePtr parent;
  std::unordered_map<std::string, Value> vars;
  explicit Scope(ScopePtr p = nullptr) : parent(std::move(p)) {}
  const Value* find(const std::string& name) const;
};

// The loop variable: one per for statement, advanced in place each
// iteration (as jinja2's LoopContext is).
struct LoopObj final : Object, std::enable_shared_from_this<LoopObj> {
  Value seq;  // the (filtered) items
  size_t index0 = 0;
  Value last_changed;  // loop.changed()
  bool changed_called = false;
  std::string_view type_name() const override { return "LoopContext"; }
  Value attr(std::string_view name) const override;
  std::string repr(int depth) const override;
};

enum class Flow : uint8_t { Normal, Break, Continue };

class Interp {
 public:
  Interp(const Limits& limits, const std::string& source);
  ~Interp();

  // Statements append to `out`.
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Value eval(const Expr& e, const ScopePtr& scope);

  // Python/jinja2 semantics shared with filters and methods.
  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, Args& args);
  Value lookup(const std::string& name, const ScopePtr& scope);
  Value binop(BinOp op, const Value& a, const Value& b);
  bool compare(CmpOp op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);
  // The items a for loop over `v` visits (list elements, dict keys, characters).
  Value iterate(const Value& v);
  int64_t length(const Value& v);
  Value apply_filter(std::string_view name, const Value& v, Args& args);
  bool apply_test(std::string_view name, const Value& v, Args& args);

  // Budgets: one unit per loop iteration and call, and per 64 bytes or 16
  // values built; a string may not grow past the output limit.
  void charge(uint64_t units);
  void check_size(size_t bytes) const;
  const Limits& limits() const { return limits_; }
  // "line L, column C" of a byte offset of the source.
  std::string location(size_t pos) const;
  size_t pos() const { return pos_; }

  // Remembers a scope that a macro closes over, so that the cycle it forms
  // (scope -> macro -> scope) is broken when rendering ends.
  void keep_scope(const ScopePtr& s) { closures_.push_back(s); }
  // Namespaces can form cycles too ({% set ns.me = [ns] %}): their
  // attributes are dropped when rendering ends.
  void keep_namespace(std::shared_ptr<Namespace> ns) { namespaces_.push_back(std::move(ns)); }

 private:
  // Counts nesting; past limits().max_depth rendering stops.
  struct Depth {
    explicit Depth(Interp& in);
    ~Depth() { --in_.depth_; }
    Interp& in_;
  };
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_macro(const Stmt& s, const ScopePtr& scope, std::string& out);
  Value call_macro(const Stmt& s, const ScopePtr& closure, Args& args, const Value& caller);
  void assign(const Expr& target, const Value& v, const ScopePtr& scope);
  Args eval_args(const Expr& e, size_t first, const ScopePtr& scope);
  Value eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);

  const Limits& limits_;
  const std::string& source_;
  uint64_t work_ = 0;
  int depth_ = 0;
  size_t pos_ = 0;
  std::vector<ScopePtr> closures_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
};

// Globals every template sees (range, dict, namespace, raise_exception,
// strftime_now, joiner), or null.
const Value* find_global(const std::string& name);
// The value a JSON document stands for (objects keep their key order).
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys), as
// transformers' tojson filter calls it.
struct JsonStyle {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
void dump_json(const Value& v, const JsonStyle& style, std::string& out, int level = 0);

}  // namespace kvant::jinja
