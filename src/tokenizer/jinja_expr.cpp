// Expressions of the Jinja interpreter: Python's operators on the values,
// and jinja2's sandboxed attribute and item access (obj.name tries Python
// attributes, then obj['name']; obj['name'] tries the item, then the
// attribute; methods that would change a list or dict are unsafe).
#include <cmath>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace kvant::jinja {
namespace {

Value method(std::string name, std::function<Value(Interp&, Args&)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::function(std::move(f));
}

Value unsafe_attr(std::string_view name, const Value& obj) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" +
                              std::string(obj.type_name()) + "' object is unsafe.",
                          true);
}

void want_args(const Args& a, size_t lo, size_t hi, std::string_view name) {
  if (!a.kw.empty()) raise(std::string(name) + "() takes no keyword arguments");
  if (a.pos.size() < lo || a.pos.size() > hi)
    raise(std::string(name) + "() takes " + std::to_string(lo) +
          (hi > lo ? " to " + std::to_string(hi) : "") + " arguments (" +
          std::to_string(a.pos.size()) + " given)");
}

// dict.items() / keys() / values() / get() / copy(); mutating methods are unsafe.
Value dict_attr(const Value& d, std::string_view name) {
  if (name == "items" || name == "keys" || name == "values") {
    const SeqKind k = name == "items"  ? SeqKind::DictItems
                      : name == "keys" ? SeqKind::DictKeys
                                       : SeqKind::DictValues;
    return method(std::string(name), [d, k](Interp& in, Args& a) {
      want_args(a, 0, 0,
                k == SeqKind::DictItems  ? "items"
                : k == SeqKind::DictKeys ? "keys"
                                         : "values");
      List out;
      in.charge(d.dict().size() / 16);
      for (const auto& [key, v] : d.dict().entries) {
        if (k == SeqKind::DictItems)
          out.push_back(Value::seq({key, v}, SeqKind::Tuple));
        else
          out.push_back(k == SeqKind::DictKeys ? key : v);
      }
      return Value::seq(std::move(out), k);
    });
  }
  if (name == "get") {
    return method("get", [d](Interp&, Args& a) {
      want_args(a, 1, 2, "get");
      const Value* v = d.dict().find(a.pos[0]);
      return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
    });
  }
  if (name == "copy") {
    return method("copy", [d](Interp&, Args& a) {
      want_args(a, 0, 0, "copy");
      return d;
    });
  }
  if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" ||
      name == "clear")
    return unsafe_attr(name, d);
  return Value();  // not an attribute of dict
}

// list.count() / index() / copy(); tuples have count and index only.
Value seq_attr(const Value& s, std::string_view name) {
  if (name == "count" || name == "index") {
    const bool count = name == "count";
    return method(std::string(name), [s, count](Interp&, Args& a) {
      want_args(a, 1, 1, count ? "count" : "index");
      int64_t n = 0;
      const List& xs = s.items();
      for (size_t i = 0; i < xs.size(); ++i) {
        if (!py_equal(xs[i], a.pos[0])) continue;
        if (!count) return Value::integer(int64_t(i));
        ++n;
      }
      if (!count) raise(py_repr(a.pos[0]) + " is not in " + std::string(s.type_name()));
      return Value::integer(n);
    });
  }
  if (s.kind() != SeqKind::List) return Value();
  if (name == "copy")
    return method("copy", [s](Interp&, Args& a) {
      want_args(a, 0, 0, "copy");
      return s;
    });
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
      name == "remove" || name == "reverse" || name == "sort" || name == "clear")
    return unsafe_attr(name, s);
  return Value();
}

std::string no_attr(const Value& obj, std::string_view name) {
  return "'" + obj.object_type_repr() + "' has no attribute '" + std::string(name) + "'";
}

// Python's slice.indices(): the positions a[start:stop:step] visits.
std::vector<size_t> slice_positions(int64_t len, const Value& start, const Value& stop,
                                    const Value& step) {
  auto as_index = [](const Value& v) {
    if (!v.is_int() && !v.is_bool())
      raise("slice indices must be integers or None or have an __index__ method");
    return v.to_int();
  };
  const int64_t st = step.is_none() || step.is_undefined() ? 1 : as_index(step);
  if (st == 0) raise("slice step cannot be zero");
  const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1;
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = as_index(v);
    if (i < 0) {
      i += len;
      if (i < lower) i = lower;
    } else if (i > upper) {
      i = upper;
    }
    return i;
  };
  const int64_t b = clamp(start, st > 0 ? lower : upper), e = clamp(stop, st > 0 ? upper : lower);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(size_t(i));
  return out;
}

Value slice_value(Interp& in, const Value& obj, const Value& a, const Value& b, const Value& c) {
  if (obj.is_undefined()) raise(obj.undefined_message());
  if (obj.is_string()) {
    const auto cps = code_points(obj.str());
    std::string out;
    for (size_t i : slice_positions(int64_t(cps.size()), a, b, c)) out += cps[i];
    in.charge(out.size() / 64);
    return Value::string(std::move(out));
  }
  if (obj.is_indexable()) {
    const List& xs = obj.items();
    List out;
    for (size_t i : slice_positions(int64_t(xs.size()), a, b, c)) out.push_back(xs[i]);
    in.charge(out.size() / 16);
    return Value::seq(std::move(out), obj.kind());
  }
  // Slices are plain Python subscripts in jinja2 (not sandboxed item access).
  if (obj.is_dict()) raise("unhashable type: 'slice'");
  raise("'" + std::string(obj.type_name()) + "' object is not subscriptable");
}

}  // namespace

Value Interp::lookup(const std::string& name, const ScopePtr& scope) {
  if (const Value* v = scope->find(name)) return *v;
  if (const Value* g = find_global(name)) return *g;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interp::getattr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) raise(obj.undefined_message());
  if (!name.empty() && name[0] == '_') return unsafe_attr(name, obj);
  switch (obj.type()) {
    case Value::Type::String: {
      Value m = string_method(obj, name);
      return m.is_undefined() ? Value::undefined(no_attr(obj, name)) : m;
    }
    case Value::Type::Dict: {
      Value m = dict_attr(obj, name);
      if (m.is_function() || m.unsafe()) return m;
      if (const Value* v = obj.dict().find(name)) return *v;
      return Value::undefined(no_attr(obj, name));
    }
    case Value::Type::Seq: {
      Value m = seq_attr(obj, name);
      if (m.is_function() || m.unsafe()) return m;
      return Value::undefined(no_attr(obj, name));
    }
    case Value::Type::Object:
      return obj.object().attr(name);
    default:
      return Value::undefined(no_attr(obj, name));
  }
}

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise(obj.undefined_message());
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if ((obj.is_indexable() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.to_int();
    if (obj.is_string()) {
      const auto cps = code_points(obj.str());
      const int64_t n = int64_t(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(std::string(cps[size_t(i)]));
    } else {
      const int64_t n = int64_t(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[size_t(i)];
    }
  } else if (obj.is_object() && key.is_string()) {
    return getattr(obj, key.str());
  }
  // A missing item falls back to the attribute of that name (sandboxed).
  if (key.is_string()) {
    if (!key.str().empty() && key.str()[0] == '_') return unsafe_attr(key.str(), obj);
    Value m = obj.is_string() ? string_method(obj, key.str())
              : obj.is_dict() ? dict_attr(obj, key.str())
              : obj.is_seq()  ? seq_attr(obj, key.str())
                              : Value();
    if (m.is_function() || m.unsafe()) return m;
    return Value::undefined(no_attr(obj, key.str()));
  }
  return Value::undefined(obj.object_type_repr() + " has no element " + py_repr(key));
}

Value Interp::call(const Value& callee, Args& args) {
  if (callee.is_undefined()) raise(callee.undefined_message());
  if (!callee.is_function())
    raise("'" + std::string(callee.type_name()) + "' object is not callable");
  Depth depth(*this);
  charge(1);
  return callee.function().call(*this, args);
}

Args Interp::eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
  Args a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v, scope));
  if (e.star_args) {
    const Value rest = iterate(eval(*e.star_args, scope));
    for (const Value& v : rest.items()) a.pos.push_back(v);
  }
  if (e.star_kwargs) {
    const Value d = eval(*e.star_kwargs, scope);
    if (!d.is_dict())
      raise("argument after ** must be a mapping, not " + std::string(d.type_name()));
    for (const auto& [k, v] : d.dict().entries) {
      if (!k.is_string()) raise("keywords must be strings");
      a.kw.emplace_back(k.str(), v);
    }
  }
  return a;
}

Value Interp::eval_slice(const Value& obj, const Expr& s, const ScopePtr& scope) {
  Value parts[3];
  for (int i = 0; i < 3; ++i)
    parts[i] = s.args[size_t(i)] ? eval(*s.args[size_t(i)], scope) : Value::none();
  return slice_value(*this, obj, parts[0], parts[1], parts[2]);
}

Value Interp::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.args[0], scope);
  for (size_t i = 0; i < e.cmps.size(); ++i) {
    Value right = eval(*e.args[i + 1], scope);
    if (!compare(e.cmps[i], left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  Depth depth(*this);
  pos_ = e.pos;
  switch (e.kind) {
    case Expr::Const:
      return e.value;
    case Expr::Name:
      return lookup(e.name, scope);
    case Expr::NsRef:
      return getattr(lookup(e.name, scope), e.attr);
    case Expr::List:
    case Expr::Tuple: {
      List xs;
      for (const ExprPtr& a : e.args) xs.push_back(eval(*a, scope));
      charge(xs.size() / 16);
      return Value::seq(std::move(xs), e.kind == Expr::Tuple ? SeqKind::Tuple : SeqKind::List);
    }
    case Expr::Dict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2)
        d.set(eval(*e.args[i], scope), eval(*e.args[i + 1], scope));
      return Value::dict(std::move(d));
    }
    case Expr::Getattr:
      return getattr(eval(*e.args[0], scope), e.name);
    case Expr::Getitem: {
      const Value obj = eval(*e.args[0], scope);
      if (e.args[1]->kind == Expr::Slice) return eval_slice(obj, *e.args[1], scope);
      return getitem(obj, eval(*e.args[1], scope));
    }
    case Expr::Slice:
      raise("slice outside of a subscript");
    case Expr::Call: {
      const Value callee = eval(*e.args[0], scope);
      Args a = eval_args(e, 1, scope);
      return call(callee, a);
    }
    case Expr::Filter: {
      const Value v = eval(*e.args[0], scope);
      Args a = eval_args(e, 1, scope);
      if (!e.filter) raise("No filter named '" + e.name + "' found.");
      if (e.filter == unsupported_filter)
        raise("the jinja2 filter '" + e.name + "' is not supported");
      return e.filter(*this, v, a);
    }
    case Expr::Test: {
      const Value v = eval(*e.args[0], scope);
      Args a = eval_args(e, 1, scope);
      if (!e.test) raise("No test named '" + e.name + "' found.");
      return Value::boolean(e.test(*this, v, a));
    }
    case Expr::Neg:
    case Expr::Pos: {
      const Value v = eval(*e.args[0], scope);
      if (v.is_undefined()) raise(v.undefined_message());
      if (!v.is_number())
        raise("bad operand type for unary " + std::string(e.kind == Expr::Neg ? "-" : "+") + ": '" +
              std::string(v.type_name()) + "'");
      if (e.kind == Expr::Pos) return v.is_float() ? v : Value::integer(v.to_int());
      if (v.is_float()) return Value::number(-v.as_float());
      if (v.to_int() == INT64_MIN) raise("integer overflow (beyond 64 bits)");
      return Value::integer(-v.to_int());
    }
    case Expr::Not:
      return Value::boolean(!eval(*e.args[0], scope).truthy());
    case Expr::Binary:
      return binop(e.op, eval(*e.args[0], scope), eval(*e.args[1], scope));
    case Expr::Compare:
      return eval_compare(e, scope);
    case Expr::And: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Or: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Cond:
      if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression on " +
                              location(e.pos).substr(0, location(e.pos).find(',')) +
                              " evaluated to false and no else section was defined.");
    case Expr::Concat: {
      std::string s;
      for (const ExprPtr& a : e.args) {
        const Value v = eval(*a, scope);
        s += v.is_string() ? v.str() : py_str(v);
        check_size(s.size());
      }
      charge(s.size() / 64);
      return Value::string(std::move(s));
    }
  }
  return Value();
}

}  // namespace kvant::jinja
