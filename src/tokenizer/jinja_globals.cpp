// What a template sees besides its context: the globals of transformers'
// chat template environment (range with the sandbox's size limit, dict,
// namespace, raise_exception, strftime_now, joiner), the conversion of the
// JSON context into values, and Python's json.dumps for the tojson filter.
#include <cmath>
#include <ctime>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace kvant::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value make_fn(std::string name, std::function<Value(Interp&, Args&)> fn) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::function(std::move(f));
}

Value range_fn(Interp& in, Args& a) {
  if (!a.kw.empty()) raise("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    raise("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  for (const Value& v : a.pos)
    if (!v.is_int() && !v.is_bool())
      raise("'" + std::string(v.type_name()) + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = a.pos[0].to_int();
  } else {
    start = a.pos[0].to_int();
    stop = a.pos[1].to_int();
    if (a.pos.size() == 3) step = a.pos[2].to_int();
  }
  if (step == 0) raise("range() arg 3 must not be zero");
  const double n = std::ceil((double(stop) - double(start)) / double(step));
  if (n > double(kMaxRange))
    raise("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    out.push_back(Value::integer(i));
  in.charge(out.size() / 16);
  return Value::seq(std::move(out));
}

// dict(mapping or pairs, **kwargs) and namespace(...) take the same arguments.
Dict dict_from_args(Interp& in, const Args& a, std::string_view fname) {
  Dict d;
  if (a.pos.size() > 1)
    raise(std::string(fname) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      const Value pairs = in.iterate(src);
      for (const Value& p : pairs.items()) {
        const Value kv = in.iterate(p);
        if (kv.items().size() != 2)
          raise("dictionary update sequence element has length " +
                std::to_string(kv.items().size()) + "; 2 is required");
        d.set(kv.items()[0], kv.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value::string(k), v);
  return d;
}

Value namespace_fn(Interp& in, Args& a) {
  auto ns = std::make_shared<Namespace>();
  in.keep_namespace(ns);
  ns->attrs = dict_from_args(in, a, "namespace");
  for (const auto& [k, v] : ns->attrs.entries) {
    if (k.is_string() && !k.str().empty() && k.str()[0] == '_')
      raise("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
            py_repr(k) + ". Please rename the attribute.");
  }
  return Value::object(std::move(ns));
}

Value strftime_now_fn(Interp&, Args& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) raise("strftime_now() takes one format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  const std::string& fmt = a.pos[0].str();
  std::string buf(fmt.size() * 4 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

// joiner(sep): "" the first time it is called, sep afterwards.
Value joiner_fn(Interp&, Args& a) {
  const Value sep = a.pos.empty() ? Value::string(", ") : a.pos[0];
  auto used = std::make_shared<bool>(false);
  return make_fn("joiner", [sep, used](Interp&, Args&) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return sep;
  });
}

struct Globals {
  std::unordered_map<std::string, Value> table;
  Globals() {
    table["range"] = make_fn("range", range_fn);
    table["dict"] = make_fn(
        "dict", [](Interp& in, Args& a) { return Value::dict(dict_from_args(in, a, "dict")); });
    table["namespace"] = make_fn("namespace", namespace_fn);
    table["raise_exception"] = make_fn("raise_exception", [](Interp&, Args& a) -> Value {
      raise(a.pos.empty() ? std::string() : py_str(a.pos[0]));
    });
    table["strftime_now"] = make_fn("strftime_now", strftime_now_fn);
    table["joiner"] = make_fn("joiner", joiner_fn);
  }
};

void dump_string(const std::string& s, bool ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = uint8_t(s[i]);
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ascii && c == 0x7F)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(c));
      out += buf;
      ++i;
    } else if (c < 0x80 || !ascii) {
      out += char(c);
      ++i;
    } else {
      size_t len;
      uint32_t cp = code_point_at(s, i, len);
      i += len;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", unsigned(0xD800 + (cp >> 10)),
                      unsigned(0xDC00 + (cp & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(cp));
      }
      out += buf;
    }
  }
  out += '"';
}

void dump_float(double d, std::string& out) {
  if (std::isnan(d))
    out += "NaN";
  else if (std::isinf(d))
    out += d > 0 ? "Infinity" : "-Infinity";
  else
    out += float_repr(d);
}

std::string json_key(const Value& k) {
  switch (k.type()) {
    case Value::Type::String:
      return k.str();
    case Value::Type::Bool:
      return k.as_bool() ? "true" : "false";
    case Value::Type::None:
      return "null";
    case Value::Type::Int:
      return std::to_string(k.as_int());
    case Value::Type::Float: {
      std::string s;
      dump_float(k.as_float(), s);
      return s;
    }
    default:
      raise("keys must be str, int, float, bool or None, not " + std::string(k.type_name()));
  }
}

}  // namespace

const Value* find_global(const std::string& name) {
  static const Globals globals;
  auto it = globals.table.find(name);
  return it == globals.table.end() ? nullptr : &it->second;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  using T = nlohmann::ordered_json::value_t;
  if (depth > kMaxValueDepth)
    raise("template variables nested too deeply (more than " + std::to_string(kMaxValueDepth) +
          " levels)");
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::boolean(j.get<bool>());
    case T::number_integer:
      return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case T::number_float:
      return Value::number(j.get<double>());
    case T::string:
      return Value::string(j.get<std::string>());
    case T::array: {
      List xs;
      xs.reserve(j.size());
      for (const auto& x : j) xs.push_back(from_json(x, depth + 1));
      return Value::seq(std::move(xs));
    }
    case T::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.set(Value::string(k), from_json(v, depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

void dump_json(const Value& v, const JsonStyle& st, std::string& out, int level) {
  if (level > kMaxValueDepth)
    raise("maximum recursion depth exceeded while encoding a JSON object");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += st.indent;
  };
  switch (v.type()) {
    case Value::Type::None:
      out += "null";
      return;
    case Value::Type::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Type::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Type::Float:
      dump_float(v.as_float(), out);
      return;
    case Value::Type::String:
      dump_string(v.str(), st.ensure_ascii, out);
      return;
    case Value::Type::Seq:
      if (v.kind() == SeqKind::List || v.kind() == SeqKind::Tuple) {
        const List& xs = v.items();
        if (xs.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < xs.size(); ++i) {
          if (i) out += st.item_sep;
          if (st.has_indent) newline(level + 1);
          dump_json(xs[i], st, out, level + 1);
        }
        if (st.has_indent) newline(level);
        out += ']';
        return;
      }
      break;
    case Value::Type::Dict: {
      const Dict& d = v.dict();
      if (d.size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : d.entries) entries.push_back(&e);
      if (st.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return py_less(a->first, b->first); });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += st.item_sep;
        if (st.has_indent) newline(level + 1);
        dump_string(json_key(entries[i]->first), st.ensure_ascii, out);
        out += st.key_sep;
        dump_json(entries[i]->second, st, out, level + 1);
      }
      if (st.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  raise("Object of type " + std::string(v.type_name()) + " is not JSON serializable");
}

}  // namespace kvant::jinja
