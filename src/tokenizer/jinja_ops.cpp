// Python's arithmetic, comparison, membership, iteration and len() on the
// interpreter's values, with Python's error messages for the cases that fail.
#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace kvant::jinja {
namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  raise("unsupported operand type(s) for " + std::string(op) + ": '" + std::string(a.type_name()) +
        "' and '" + std::string(b.type_name()) + "'");
}

// Python's floor division and modulo on floats (floatobject.c's divmod).
void float_divmod(double a, double b, double& div, double& mod) {
  mod = std::fmod(a, b);
  div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  if (div != 0.0) {
    const double f = std::floor(div);
    div = div - f > 0.5 ? f + 1.0 : f;
  } else {
    div = std::copysign(0.0, a / b);
  }
}

Value repeat(Interp& in, const Value& seq, int64_t n) {
  if (seq.is_string()) {
    if (n <= 0) return Value::string("");
    in.check_size(size_t(n) * seq.str().size() + 1);
    in.charge(uint64_t(n) * seq.str().size() / 64);
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  List out;
  if (n > 0) {
    const uint64_t total = uint64_t(n) * seq.items().size();
    in.charge(total / 16 + 1);
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  }
  return Value::seq(std::move(out), seq.kind());
}

Value add(Interp& in, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value::number(a.to_float() + b.to_float());
    return Value::integer(checked_add(a.to_int(), b.to_int()));
  }
  if (a.is_string() && b.is_string()) {
    in.check_size(a.str().size() + b.str().size());
    in.charge((a.str().size() + b.str().size()) / 64);
    // Markup + str escapes the str (markupsafe); plain strings just join.
    if (a.markup() && !b.markup()) return Value::string(a.str() + html_escape(b.str()), true);
    if (b.markup() && !a.markup()) return Value::string(html_escape(a.str()) + b.str(), true);
    return Value::string(a.str() + b.str(), a.markup());
  }
  if (a.is_indexable() && b.is_indexable() && a.kind() == b.kind()) {
    List out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    in.charge(out.size() / 16);
    return Value::seq(std::move(out), a.kind());
  }
  if (a.is_string())
    raise("can only concatenate str (not \"" + std::string(b.type_name()) + "\") to str");
  if (a.is_indexable())
    raise("can only concatenate " + std::string(a.type_name()) + " (not \"" +
          std::string(b.type_name()) + "\") to " + std::string(a.type_name()));
  unsupported("+", a, b);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (a.is_float() || b.is_float() || b.to_int() < 0) {
    const double x = a.to_float(), y = b.to_float();
    if (x == 0.0 && y < 0) raise("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(x, y));
  }
  int64_t base = a.to_int(), e = b.to_int(), r = 1;
  while (e > 0) {
    if (e & 1) r = checked_mul(r, base);
    e >>= 1;
    if (e) base = checked_mul(base, base);
  }
  return Value::integer(r);
}

}  // namespace

Value Interp::binop(BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise(a.undefined_message());
  if (b.is_undefined()) raise(b.undefined_message());
  switch (op) {
    case BinOp::Add:
      return add(*this, a, b);
    case BinOp::Sub:
      if (!a.is_number() || !b.is_number()) unsupported("-", a, b);
      if (a.is_float() || b.is_float()) return Value::number(a.to_float() - b.to_float());
      if (b.to_int() == INT64_MIN) raise("integer overflow (beyond 64 bits)");
      return Value::integer(checked_add(a.to_int(), -b.to_int()));
    case BinOp::Mul:
      if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return Value::number(a.to_float() * b.to_float());
        return Value::integer(checked_mul(a.to_int(), b.to_int()));
      }
      if ((a.is_string() || a.is_indexable()) && (b.is_int() || b.is_bool()))
        return repeat(*this, a, b.to_int());
      if ((b.is_string() || b.is_indexable()) && (a.is_int() || a.is_bool()))
        return repeat(*this, b, a.to_int());
      unsupported("*", a, b);
    case BinOp::Div:
      if (!a.is_number() || !b.is_number()) unsupported("/", a, b);
      if (b.to_float() == 0.0) raise("division by zero");
      return Value::number(a.to_float() / b.to_float());
    case BinOp::FloorDiv:
    case BinOp::Mod: {
      if (op == BinOp::Mod && a.is_string()) return Value::string(percent_format(a.str(), b));
      if (!a.is_number() || !b.is_number()) unsupported(op == BinOp::Mod ? "%" : "//", a, b);
      if (a.is_float() || b.is_float()) {
        if (b.to_float() == 0.0)
          raise(op == BinOp::Mod ? "float modulo" : "float floor division by zero");
        double div, mod;
        float_divmod(a.to_float(), b.to_float(), div, mod);
        return Value::number(op == BinOp::Mod ? mod : div);
      }
      const int64_t x = a.to_int(), y = b.to_int();
      if (y == 0)
        raise(op == BinOp::Mod ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) raise("integer overflow (beyond 64 bits)");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == BinOp::Mod ? r : q);
    }
    case BinOp::Pow:
      return power(a, b);
  }
  return Value();
}

bool Interp::compare(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::Eq:
      return py_equal(a, b);
    case CmpOp::Ne:
      return !py_equal(a, b);
    case CmpOp::In:
      return contains(b, a);
    case CmpOp::NotIn:
      return !contains(b, a);
    default:
      break;
  }
  if (a.is_undefined()) raise(a.undefined_message());
  if (b.is_undefined()) raise(b.undefined_message());
  const char* sym = op == CmpOp::Lt ? "<" : op == CmpOp::Le ? "<=" : op == CmpOp::Gt ? ">" : ">=";
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.to_float(), y = b.to_float();
      return op == CmpOp::Lt ? x < y : op == CmpOp::Le ? x <= y : op == CmpOp::Gt ? x > y : x >= y;
    }
    const int64_t x = a.to_int(), y = b.to_int();
    return op == CmpOp::Lt ? x < y : op == CmpOp::Le ? x <= y : op == CmpOp::Gt ? x > y : x >= y;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return op == CmpOp::Lt ? c < 0 : op == CmpOp::Le ? c <= 0 : op == CmpOp::Gt ? c > 0 : c >= 0;
  }
  if (a.is_indexable() && b.is_indexable() && a.kind() == b.kind()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!py_equal(x[i], y[i])) return compare(op, x[i], y[i]);
    const size_t n = x.size(), m = y.size();
    return op == CmpOp::Lt ? n < m : op == CmpOp::Le ? n <= m : op == CmpOp::Gt ? n > m : n >= m;
  }
  raise(std::string("'") + sym + "' not supported between instances of '" +
        std::string(a.type_name()) + "' and '" + std::string(b.type_name()) + "'");
}

bool Interp::contains(const Value& c, const Value& item) {
  switch (c.type()) {
    case Value::Type::String:
      if (!item.is_string())
        raise("'in <string>' requires string as left operand, not " +
              std::string(item.type_name()));
      return c.str().find(item.str()) != std::string::npos;
    case Value::Type::Seq: {
      // A generator is consumed up to the match, as Python's `in` does.
      const List& xs = c.items();
      const bool gen = c.kind() == SeqKind::Generator;
      size_t i = gen ? c.consumed() : 0;
      charge((xs.size() - i) / 16);
      for (; i < xs.size(); ++i) {
        if (!py_equal(xs[i], item)) continue;
        if (gen) c.consumed() = i + 1;
        return true;
      }
      if (gen) c.consumed() = xs.size();
      return false;
    }
    case Value::Type::Dict:
      if (item.is_seq() || item.is_dict())
        raise("unhashable type: '" + std::string(item.type_name()) + "'");
      return c.dict().find(item) != nullptr;
    case Value::Type::Undefined:
      return false;  // iterating an Undefined yields nothing
    default:
      raise("argument of type '" + std::string(c.type_name()) + "' is not iterable");
  }
}

Value Interp::iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Seq: {
      if (v.kind() != SeqKind::Generator) return v;
      // Iterating a generator takes what it has left, once.
      size_t& taken = v.consumed();
      const List& xs = v.items();
      List rest(xs.begin() + long(std::min(taken, xs.size())), xs.end());
      taken = xs.size();
      charge(rest.size() / 16);
      return Value::seq(std::move(rest));
    }
    case Value::Type::Dict: {
      List keys;
      keys.reserve(v.dict().size());
      for (const auto& kv : v.dict().entries) keys.push_back(kv.first);
      charge(keys.size() / 16);
      return Value::seq(std::move(keys));
    }
    case Value::Type::String: {
      List chars;
      for (std::string_view c : code_points(v.str()))
        chars.push_back(Value::string(std::string(c)));
      charge(chars.size() / 16);
      return Value::seq(std::move(chars));
    }
    case Value::Type::Undefined:
      return Value::seq({});
    default:
      raise("'" + std::string(v.type_name()) + "' object is not iterable");
  }
}

int64_t Interp::length(const Value& v) {
  switch (v.type()) {
    case Value::Type::String:
      return int64_t(cp_length(v.str()));
    case Value::Type::Seq:
      if (v.kind() == SeqKind::Generator) raise("object of type 'generator' has no len()");
      return int64_t(v.items().size());
    case Value::Type::Dict:
      return int64_t(v.dict().size());
    case Value::Type::Undefined:
      return 0;
    default:
      raise("object of type '" + std::string(v.type_name()) + "' has no len()");
  }
}

}  // namespace kvant::jinja
