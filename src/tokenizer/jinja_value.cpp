// Python semantics of the interpreter's values: truthiness, ==, <, str() and
// repr() (CPython's float and string repr rules), Dict and Namespace.
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace kvant::jinja {

void raise(std::string message) { throw RenderError{std::move(message)}; }

Value Value::undefined(std::string hint, bool unsafe) {
  Value v(Type::Undefined);
  v.sub_ = unsafe ? 1 : 0;
  v.ptr_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::boolean(bool b) {
  Value v(Type::Bool);
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v(Type::Int);
  v.i_ = i;
  return v;
}

Value Value::number(double f) {
  Value v(Type::Float);
  v.f_ = f;
  return v;
}

Value Value::string(std::string s, bool markup) {
  Value v(Type::String);
  v.sub_ = markup ? 1 : 0;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

namespace {

uint16_t nested_depth(int child_max) {
  if (child_max + 1 > kMaxValueDepth)
    raise("data nested too deeply (more than " + std::to_string(kMaxValueDepth) + " levels)");
  return uint16_t(child_max + 1);
}

}  // namespace

Value Value::seq(List items, SeqKind kind) {
  Value v(Type::Seq);
  v.sub_ = uint8_t(kind);
  int deepest = 0;
  for (const Value& x : items) deepest = std::max(deepest, int(x.depth_));
  v.depth_ = nested_depth(deepest);
  v.ptr_ = std::make_shared<SeqData>(SeqData{std::move(items), 0});
  return v;
}

Value Value::dict(std::shared_ptr<const Dict> d) {
  Value v(Type::Dict);
  int deepest = 0;
  for (const auto& [k, x] : d->entries) deepest = std::max({deepest, int(k.depth_), int(x.depth_)});
  v.depth_ = nested_depth(deepest);
  v.ptr_ = std::const_pointer_cast<Dict>(std::move(d));
  return v;
}

Value Value::dict(Dict d) { return dict(std::make_shared<const Dict>(std::move(d))); }

Value Value::object(std::shared_ptr<Object> o) {
  Value v(Type::Object);
  v.ptr_ = std::move(o);
  return v;
}

Value Value::function(std::shared_ptr<const Function> f) {
  Value v(Type::Function);
  v.ptr_ = std::const_pointer_cast<Function>(std::move(f));
  return v;
}

std::string Value::undefined_message() const {
  const auto* hint = static_cast<const std::string*>(ptr_.get());
  if (hint && !hint->empty()) return *hint;
  return "undefined value";
}

bool Value::truthy() const {
  switch (type_) {
    case Type::Undefined:
    case Type::None:
      return false;
    case Type::Bool:
      return b_;
    case Type::Int:
      return i_ != 0;
    case Type::Float:
      return f_ != 0.0;
    case Type::String:
      return !str().empty();
    case Type::Seq:
      // A generator object is true even when it would yield nothing.
      return kind() == SeqKind::Generator || !items().empty();
    case Type::Dict:
      return dict().size() != 0;
    case Type::Object:
    case Type::Function:
      return true;
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (type_) {
    case Type::Undefined:
      return "Undefined";
    case Type::None:
      return "NoneType";
    case Type::Bool:
      return "bool";
    case Type::Int:
      return "int";
    case Type::Float:
      return "float";
    case Type::String:
      return markup() ? "Markup" : "str";
    case Type::Seq:
      switch (kind()) {
        case SeqKind::List:
          return "list";
        case SeqKind::Tuple:
          return "tuple";
        case SeqKind::Generator:
          return "generator";
        case SeqKind::DictItems:
          return "dict_items";
        case SeqKind::DictKeys:
          return "dict_keys";
        case SeqKind::DictValues:
          return "dict_values";
      }
      return "list";
    case Type::Dict:
      return "dict";
    case Type::Object:
      return object().type_name();
    case Type::Function:
      return "function";
  }
  return "object";
}

std::string Value::object_type_repr() const {
  if (type_ == Type::None) return "None";
  return std::string(type_name()) + " object";
}

// ---- Dict, Namespace, Args ----

const Value* Dict::find(std::string_view key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& [k, v] : entries)
    if (!k.is_string() && py_equal(k, key)) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value v) {
  if (key.is_seq() || key.is_dict() || key.is_object())
    raise("unhashable type: '" + std::string(key.type_name()) + "'");
  if (key.is_string()) {
    auto [it, inserted] = index.try_emplace(key.str(), entries.size());
    if (inserted)
      entries.emplace_back(key, std::move(v));
    else
      entries[it->second].second = std::move(v);
    return;
  }
  for (auto& [k, old] : entries) {
    if (!k.is_string() && py_equal(k, key)) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(key, std::move(v));
}

std::string Object::repr(int) const { return "<" + std::string(type_name()) + " object>"; }

Value Namespace::attr(std::string_view name) const {
  if (const Value* v = attrs.find(name)) return *v;
  return Value::undefined("'Namespace object' has no attribute '" + std::string(name) + "'");
}

// Namespaces can hold themselves ({% set ns.me = [ns] %}): the depth
// guard of append_repr stops the recursion.
std::string Namespace::repr(int depth) const {
  std::string out = "<Namespace {";
  bool first = true;
  for (const auto& [k, v] : attrs.entries) {
    if (!first) out += ", ";
    first = false;
    append_repr(k, out, depth + 1);
    out += ": ";
    append_repr(v, out, depth + 1);
  }
  return out + "}>";
}

const Value* Args::kwarg(std::string_view name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// ---- equality and ordering ----

bool py_equal(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_float() == b.to_float();
    return a.to_int() == b.to_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None:
      return true;
    case T::String:
      return a.str() == b.str();
    case T::Seq: {
      // [1] == (1,) is false in Python; generators compare by identity.
      if (a.kind() != b.kind()) return false;
      if (a.kind() == SeqKind::Generator) return a.same_object(b);
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i])) return false;
      return true;
    }
    case T::Dict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.find(k);
        if (!w || !py_equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_undefined()) raise(a.undefined_message());
  if (b.is_undefined()) raise(b.undefined_message());
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_float() < b.to_float();
    return a.to_int() < b.to_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code point order
  if (a.is_indexable() && b.is_indexable() && a.kind() == b.kind()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  raise("'<' not supported between instances of '" + std::string(a.type_name()) + "' and '" +
        std::string(b.type_name()) + "'");
}

// ---- str() and repr() ----

// CPython's float repr: the shortest digits that round-trip, positional when
// the decimal exponent is in [-4, 16), scientific (two-digit exponent) otherwise.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view s(buf, size_t(r.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  const int exp10 = std::atoi(std::string(s.substr(e + 1)).c_str());
  const int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  const int n = int(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(size_t(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(decpt));
      out += '.';
      out += digits.substr(size_t(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

namespace {

// Python's str.isprintable() for one code point, for the characters
// templates meet: controls, separators other than space, format
// characters, private use and noncharacters are not printable.
bool printable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E)
    return false;
  if (c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || (c & 0xFFFE) == 0xFFFE) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000) return false;  // surrogates, private use
  if (c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F)) return false;
  return true;
}

void append_string_repr(const std::string& s, std::string& out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  out += q;
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = utf8::valid_sequence_length(s, i);
    if (len == 0) {  // not valid UTF-8: show the byte
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(uint8_t(s[i])));
      out += buf;
      ++i;
      continue;
    }
    size_t j = i;
    const uint32_t c = utf8::next_code_point(s, j);
    if (c == uint32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!printable(c)) {
      char buf[16];
      if (c < 0x100)
        std::snprintf(buf, sizeof(buf), "\\x%02x", unsigned(c));
      else if (c < 0x10000)
        std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(c));
      else
        std::snprintf(buf, sizeof(buf), "\\U%08x", unsigned(c));
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  out += q;
}

constexpr int kMaxReprDepth = kMaxValueDepth + 100;

}  // namespace

void append_repr(const Value& v, std::string& out, int depth) {
  using T = Value::Type;
  if (depth > kMaxReprDepth) raise("maximum recursion depth exceeded while getting the repr");
  switch (v.type()) {
    case T::Undefined:
      out += "Undefined";
      return;
    case T::String:
      if (v.markup()) {
        out += "Markup(";
        append_string_repr(v.str(), out);
        out += ')';
      } else {
        append_string_repr(v.str(), out);
      }
      return;
    case T::Seq: {
      const SeqKind k = v.kind();
      if (k == SeqKind::Generator) {
        out += "<generator object>";
        return;
      }
      const bool tuple = k == SeqKind::Tuple;
      if (k == SeqKind::DictItems || k == SeqKind::DictKeys || k == SeqKind::DictValues) {
        out += v.type_name();
        out += '(';
      }
      out += tuple ? '(' : '[';
      const List& xs = v.items();
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i) out += ", ";
        append_repr(xs[i], out, depth + 1);
      }
      if (tuple && xs.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      if (k != SeqKind::List && k != SeqKind::Tuple) out += ')';
      return;
    }
    case T::Dict: {
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict().entries) {
        if (!first) out += ", ";
        first = false;
        append_repr(k, out, depth + 1);
        out += ": ";
        append_repr(x, out, depth + 1);
      }
      out += '}';
      return;
    }
    case T::Object:
      out += v.object().repr(depth);
      return;
    default:
      out += py_str(v);
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  append_repr(v, out);
  return out;
}

std::string py_str(const Value& v) {
  using T = Value::Type;
  switch (v.type()) {
    case T::Undefined:
      return "";
    case T::None:
      return "None";
    case T::Bool:
      return v.as_bool() ? "True" : "False";
    case T::Int:
      return std::to_string(v.as_int());
    case T::Float:
      return float_repr(v.as_float());
    case T::String:
      return v.str();
    case T::Seq:
    case T::Dict:
      return py_repr(v);
    case T::Object:
      return v.object().repr(0);
    case T::Function:
      return "<function " + v.function().name + ">";
  }
  return "";
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) raise("integer overflow (beyond 64 bits)");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) raise("integer overflow (beyond 64 bits)");
  return r;
}

}  // namespace kvant::jinja
