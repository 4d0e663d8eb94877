// Statements of the Jinja interpreter, its budgets, and the public
// Template API (parse once, render many times).
#include "tokenizer/jinja_interp.h"

#include <algorithm>

#include "tokenizer/jinja_text.h"

namespace kvant::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

// ---- the loop variable ----

Value LoopObj::attr(std::string_view name) const {
  const List& xs = seq.items();
  const int64_t n = int64_t(xs.size()), i = int64_t(index0);
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i + 1 == n);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem")
    return i > 0 ? xs[size_t(i - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i + 1 < n ? xs[size_t(i + 1)] : Value::undefined("there is no next item");
  // Bound methods hold the loop, and read its position when called.
  auto self = std::const_pointer_cast<LoopObj>(shared_from_this());
  if (name == "cycle") {
    auto f = std::make_shared<Function>();
    f->name = "cycle";
    f->call = [self](Interp&, Args& a) -> Value {
      if (a.pos.empty()) raise("no items for cycling given");
      return a.pos[self->index0 % a.pos.size()];
    };
    return Value::function(std::move(f));
  }
  if (name == "changed") {
    auto f = std::make_shared<Function>();
    f->name = "changed";
    f->call = [self](Interp&, Args& a) -> Value {
      Value v = Value::seq(a.pos, SeqKind::List);
      if (self->changed_called && py_equal(v, self->last_changed)) return Value::boolean(false);
      self->changed_called = true;
      self->last_changed = v;
      return Value::boolean(true);
    };
    return Value::function(std::move(f));
  }
  return Value::undefined("'LoopContext object' has no attribute '" + std::string(name) + "'");
}

std::string LoopObj::repr(int) const {
  return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(seq.items().size()) +
         ">";
}

// ---- budgets ----

Interp::Depth::Depth(Interp& in) : in_(in) {
  if (++in_.depth_ > in_.limits_.max_depth)
    raise("template nesting too deep (more than " + std::to_string(in_.limits_.max_depth) +
          " levels of statements, expressions and macro calls)");
}

Interp::Interp(const Limits& limits, const std::string& source)
    : limits_(limits), source_(source) {}

Interp::~Interp() {
  // Macros close over their scope and live in it, and namespaces may hold
  // themselves: break those cycles. Every namespace stays alive until all
  // are emptied, so that none is destroyed from inside another (a long
  // chain of them would otherwise be destroyed recursively).
  for (const auto& ns : namespaces_) {
    ns->attrs.entries.clear();
    ns->attrs.index.clear();
  }
  for (const ScopePtr& s : closures_) s->vars.clear();
}

void Interp::charge(uint64_t units) {
  work_ += units;
  if (work_ > limits_.max_work)
    raise("template work budget exhausted (" + std::to_string(limits_.max_work) +
          " units of loop iterations, calls and data built)");
}

void Interp::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    raise("template output larger than " + std::to_string(limits_.max_output_bytes) + " bytes");
}

std::string Interp::location(size_t pos) const {
  pos = std::min(pos, source_.size());
  const size_t line = size_t(std::count(source_.begin(), source_.begin() + long(pos), '\n')) + 1;
  const size_t nl = pos == 0 ? std::string::npos : source_.rfind('\n', pos - 1);
  const size_t col = nl == std::string::npos ? pos + 1 : pos - nl;
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

namespace {

void append_out(Interp& in, std::string& out, std::string_view text) {
  in.check_size(out.size() + text.size());
  in.charge(text.size() / 64);
  out += text;
}

}  // namespace

// ---- statements ----

Flow Interp::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Flow Interp::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Depth depth(*this);
  pos_ = s.pos;
  switch (s.kind) {
    case Stmt::Data:
      append_out(*this, out, s.text);
      return Flow::Normal;
    case Stmt::Print: {
      const Value v = eval(*s.exprs[0], scope);
      if (v.is_string())
        append_out(*this, out, v.str());
      else
        append_out(*this, out, py_str(v));
      return Flow::Normal;
    }
    case Stmt::If:
      for (size_t i = 0; i < s.exprs.size(); ++i) {
        if (eval(*s.exprs[i], scope).truthy()) return exec(s.bodies[i], scope, out);
      }
      if (s.bodies.size() > s.exprs.size()) return exec(s.bodies.back(), scope, out);
      return Flow::Normal;
    case Stmt::For:
      return exec_for(s, scope, out);
    case Stmt::Set:
    case Stmt::SetBlock:
      exec_set(s, scope, out);
      return Flow::Normal;
    case Stmt::Macro:
    case Stmt::CallBlock:
      exec_macro(s, scope, out);
      return Flow::Normal;
    case Stmt::FilterBlock: {
      std::string text;
      exec(s.bodies[0], std::make_shared<Scope>(scope), text);
      // The filter chain's innermost value is the block's text.
      const Expr* f = s.exprs[0].get();
      std::vector<const Expr*> chain;
      for (; f; f = f->args[0].get()) chain.push_back(f);
      Value v = Value::string(std::move(text));
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        Args a = eval_args(**it, 1, scope);
        v = apply_filter((*it)->name, v, a);
      }
      append_out(*this, out, py_str(v));
      return Flow::Normal;
    }
    case Stmt::With: {
      auto inner = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < s.params.size(); ++i)
        inner->vars[s.params[i]] = eval(*s.exprs[i], scope);
      return exec(s.bodies[0], inner, out);
    }
    case Stmt::Scope:
      return exec(s.bodies[0], std::make_shared<Scope>(scope), out);
    case Stmt::Break:
      return Flow::Break;
    case Stmt::Continue:
      return Flow::Continue;
  }
  return Flow::Normal;
}

Flow Interp::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Value seq = iterate(eval(*s.exprs[0], scope));
  if (s.exprs.size() > 1) {  // for x in xs if cond: the condition sees the target only
    List kept;
    for (const Value& item : seq.items()) {
      charge(1);
      auto probe = std::make_shared<Scope>(scope);
      assign(*s.target, item, probe);
      if (eval(*s.exprs[1], probe).truthy()) kept.push_back(item);
    }
    seq = Value::seq(std::move(kept));
  }
  if (seq.items().empty()) {
    if (s.bodies.size() > 1) return exec(s.bodies[1], scope, out);
    return Flow::Normal;
  }
  auto loop = std::make_shared<LoopObj>();
  loop->seq = seq;
  const Value loop_value = Value::object(loop);
  const List& items = seq.items();
  for (size_t i = 0; i < items.size(); ++i) {
    charge(1);
    loop->index0 = i;
    auto body_scope = std::make_shared<Scope>(scope);
    body_scope->vars["loop"] = loop_value;
    assign(*s.target, items[i], body_scope);
    if (exec(s.bodies[0], body_scope, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interp::assign(const Expr& target, const Value& v, const ScopePtr& scope) {
  if (target.kind == Expr::Name) {
    scope->vars[target.name] = v;
    return;
  }
  if (target.kind == Expr::NsRef) {
    const Value ns = lookup(target.name, scope);
    auto* obj = ns.is_object() ? dynamic_cast<Namespace*>(&ns.object()) : nullptr;
    if (!obj) raise("cannot assign attribute on non-namespace object");
    if (!target.attr.empty() && target.attr[0] == '_')
      raise("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
            target.attr + "'. Please rename the attribute.");
    obj->attrs.set(Value::string(target.attr), v);
    return;
  }
  // Tuple unpacking: exactly as many items as names.
  const Value items = iterate(v);
  const size_t want = target.args.size(), got = items.items().size();
  if (got < want)
    raise("not enough values to unpack (expected " + std::to_string(want) + ", got " +
          std::to_string(got) + ")");
  if (got > want) raise("too many values to unpack (expected " + std::to_string(want) + ")");
  for (size_t i = 0; i < want; ++i) assign(*target.args[i], items.items()[i], scope);
}

void Interp::exec_set(const Stmt& s, const ScopePtr& scope, std::string&) {
  if (s.kind == Stmt::Set) {
    assign(*s.target, eval(*s.exprs[0], scope), scope);
    return;
  }
  std::string text;
  exec(s.bodies[0], std::make_shared<Scope>(scope), text);
  Value v = Value::string(std::move(text));
  if (!s.exprs.empty()) {
    std::vector<const Expr*> chain;
    for (const Expr* f = s.exprs[0].get(); f; f = f->args[0].get()) chain.push_back(f);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      Args a = eval_args(**it, 1, scope);
      v = apply_filter((*it)->name, v, a);
    }
  }
  assign(*s.target, v, scope);
}

// A macro (or a call block's caller) is a function closing over the scope
// it is defined in; calling it renders its body in a fresh child scope.
void Interp::exec_macro(const Stmt& s, const ScopePtr& scope, std::string& out) {
  auto f = std::make_shared<Function>();
  f->name = s.name;
  const Stmt* stmt = &s;
  ScopePtr closure = scope;
  f->call = [stmt, closure](Interp& in, Args& a) { return in.call_macro(*stmt, closure, a, {}); };
  const Value fn = Value::function(std::move(f));
  if (s.kind == Stmt::Macro) {
    scope->vars[s.name] = fn;
    keep_scope(scope);
    return;
  }
  // {% call(args) m(...) %}body{% endcall %}: m is called with caller=body.
  const Expr& call_expr = *s.exprs[0];
  const Value callee = eval(*call_expr.args[0], scope);
  Args a = eval_args(call_expr, 1, scope);
  a.kw.emplace_back("caller", fn);
  const Value v = call(callee, a);
  append_out(*this, out, py_str(v));
}

Value Interp::call_macro(const Stmt& s, const ScopePtr& closure, Args& a, const Value&) {
  auto sc = std::make_shared<Scope>(closure);
  const size_t n = s.params.size(), first_default = n - s.defaults.size();
  if (a.pos.size() > n && !s.uses_varargs)
    raise("macro '" + s.name + "' takes not more than " + std::to_string(n) + " argument(s)");
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < n && i < a.pos.size(); ++i) {
    sc->vars[s.params[i]] = a.pos[i];
    bound[i] = true;
  }
  Dict extra_kw;
  for (auto& [k, v] : a.kw) {
    auto it = std::find(s.params.begin(), s.params.end(), k);
    if (it != s.params.end()) {
      const size_t i = size_t(it - s.params.begin());
      if (bound[i]) raise("macro '" + s.name + "' got multiple values for argument '" + k + "'");
      sc->vars[k] = v;
      bound[i] = true;
    } else if (k == "caller" && (s.uses_caller || s.kind == Stmt::Macro)) {
      sc->vars["caller"] = v;
    } else if (s.uses_kwargs) {
      extra_kw.set(Value::string(k), v);
    } else {
      raise("macro '" + s.name + "' takes no keyword argument '" + k + "'");
    }
  }
  // Defaults are evaluated at call time, in the macro's scope (they may read
  // earlier parameters).
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    sc->vars[s.params[i]] =
        i >= first_default ? eval(*s.defaults[i - first_default], sc)
                           : Value::undefined("parameter '" + s.params[i] + "' was not provided");
  }
  if (s.uses_varargs) {
    List rest;
    for (size_t i = n; i < a.pos.size(); ++i) rest.push_back(a.pos[i]);
    sc->vars["varargs"] = Value::seq(std::move(rest), SeqKind::Tuple);
  }
  if (s.uses_kwargs) sc->vars["kwargs"] = Value::dict(std::move(extra_kw));
  if (s.uses_caller && !sc->vars.count("caller"))
    sc->vars["caller"] = Value::undefined("No caller defined");
  std::string out;
  exec(s.bodies[0], sc, out);
  return Value::string(std::move(out));
}

// ---- the public API ----

struct Template::Impl {
  std::string source;  // newline-normalized
  Body body;
};

Result<Template> Template::parse(std::string_view text) {
  auto impl = std::make_shared<Impl>();
  impl->source = normalize_source(text);
  try {
    impl->body = parse_template(impl->source);
  } catch (const SyntaxError& e) {
    Limits none;
    Interp where(none, impl->source);
    return make_error("jinja template syntax error at " + where.location(e.pos) + ": " + e.message);
  } catch (const std::exception& e) {
    return make_error(std::string("jinja template parsing failed: ") + e.what());
  }
  Template t;
  t.impl_ = std::move(impl);
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& context,
                                     const Limits& limits) const {
  if (!impl_) return make_error("jinja template: rendered before it was parsed");
  if (!context.is_object() && !context.is_null())
    return make_error("jinja template context must be a JSON object");
  Interp in(limits, impl_->source);
  try {
    auto root = std::make_shared<Scope>();
    if (context.is_object()) {
      for (const auto& [k, v] : context.items()) root->vars[k] = from_json(v);
    }
    std::string out;
    in.exec(impl_->body, root, out);
    in.keep_scope(root);
    return out;
  } catch (const RenderError& e) {
    const std::string where = in.location(in.pos());
    return make_error(e.message + " (template " + where.substr(0, where.find(',')) + ")");
  } catch (const std::exception& e) {  // e.g. out of memory
    return make_error(std::string("jinja template rendering failed: ") + e.what());
  }
}

}  // namespace kvant::jinja
