// jinja2's filters on numbers and text (int, float, round, indent, ...),
// its tests (defined, none, string, mapping, ...), and the tables that name
// them all.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_filters.h"

namespace kvant::jinja {
namespace {

// Python's float(str): surrounding whitespace, underscores between digits,
// inf/nan spellings. False when it is not a number.
bool parse_py_float(std::string_view s, double& out) {
  s = py_strip(s, true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(uint8_t(s[i - 1])) &&
        std::isdigit(uint8_t(s[i + 1])))
      continue;
    t += s[i];
  }
  std::string low = py_lower(t);
  const size_t sign = !low.empty() && (low[0] == '+' || low[0] == '-') ? 1 : 0;
  const std::string body = low.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (sign && low[0] == '-') out = -out;
    return true;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  const char* b = t.data() + (t[0] == '+' ? 1 : 0);
  auto r = std::from_chars(b, t.data() + t.size(), out);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

// Python's int(str, base).
bool parse_py_int(std::string_view s, int64_t base, int64_t& out) {
  s = py_strip(s, true, true);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.size() > 2 && s[0] == '0') {
    const char p = char(s[1] | 0x20);
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2))
      s.remove_prefix(2);
  }
  std::string t;
  for (char c : s)
    if (c != '_') t += c;
  if (t.empty()) return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out, int(base));
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return false;
  if (neg) out = -out;
  return true;
}

Value f_int(Interp&, const Value& v, Args& a) {
  Params p(a, {"default", "base"}, "int");
  const Value dflt = p.get(0, Value::integer(0));
  if (v.is_undefined()) raise(v.undefined_message());
  if (v.is_int() || v.is_bool()) return Value::integer(v.to_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value::integer(int64_t(d));
  }
  if (!v.is_string()) return dflt;
  int64_t i;
  if (parse_py_int(v.str(), p.integer(1, 10), i)) return Value::integer(i);
  double d;
  if (parse_py_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
    return Value::integer(int64_t(d));
  return dflt;
}

Value f_float(Interp&, const Value& v, Args& a) {
  Params p(a, {"default"}, "float");
  if (v.is_undefined()) raise(v.undefined_message());
  if (v.is_number()) return Value::number(v.to_float());
  double d;
  if (v.is_string() && parse_py_float(v.str(), d)) return Value::number(d);
  return p.get(0, Value::number(0.0));
}

Value f_abs(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "abs");
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.to_int() == INT64_MIN) raise("integer overflow (beyond 64 bits)");
    return Value::integer(std::llabs(v.to_int()));
  }
  raise("bad operand type for abs(): '" + std::string(v.type_name()) + "'");
}

// round(): Python rounds the exact binary value half to even, which is what
// printf's correctly rounded %.*f does too.
Value f_round(Interp&, const Value& v, Args& a) {
  Params p(a, {"precision", "method"}, "round");
  const int64_t prec = p.integer(0, 0);
  const std::string method = soft_str(p.get(1, Value::string("common")));
  if (method != "common" && method != "ceil" && method != "floor")
    raise("method must be common, ceil or floor");
  if (!v.is_number())
    raise("type " + std::string(v.type_name()) + " doesn't define __round__ method");
  if (method == "common" && !v.is_float()) return Value::integer(v.to_int());
  const double x = v.to_float();
  if (method != "common") {
    const double scale = std::pow(10.0, double(prec));
    return Value::number((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
  }
  if (!std::isfinite(x)) return v;
  if (prec < 0) {
    const double scale = std::pow(10.0, double(-prec));
    return Value::number(std::nearbyint(x / scale) * scale);
  }
  char buf[400];
  std::snprintf(buf, sizeof(buf), "%.*f", int(std::min<int64_t>(prec, 300)), x);
  return Value::number(std::strtod(buf, nullptr));
}

Value f_indent(Interp& in, const Value& v, Args& a) {
  Params p(a, {"width", "first", "blank"}, "indent");
  // jinja2 appends "\n" to the value itself before splitting its lines.
  if (v.is_undefined()) raise(v.undefined_message());
  if (v.is_seq() && v.kind() == SeqKind::List) raise("'list' object has no attribute 'splitlines'");
  if (!v.is_string())
    raise("unsupported operand type(s) for +=: '" + std::string(v.type_name()) + "' and 'str'");
  const Value width = p.get(0, Value::integer(4));
  const std::string ind = width.is_string()
                              ? width.str()
                              : std::string(size_t(std::max<int64_t>(0, width.to_int())), ' ');
  const std::vector<std::string> lines = py_splitlines(soft_str(v) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    if ((i > 0 || p.flag(1)) && (p.flag(2) || !lines[i].empty())) out += ind;
    out += lines[i];
    in.check_size(out.size());
  }
  if (lines.empty() && p.flag(1)) out = ind;
  return str_value(in, std::move(out));
}

Value f_center(Interp& in, const Value& v, Args& a) {
  Params p(a, {"width"}, "center");
  Args inner;
  inner.pos.push_back(Value::integer(p.integer(0, 80)));
  Value m = string_method(Value::string(soft_str(v)), "center");
  return m.function().call(in, inner);
}

Value f_truncate(Interp& in, const Value& v, Args& a) {
  Params p(a, {"length", "killwords", "end", "leeway"}, "truncate");
  if (!v.is_string()) {  // jinja2 measures and slices the value itself
    if (in.length(v) <= p.integer(0, 255) + p.integer(3, 5)) return v;
    raise("can only concatenate " + std::string(v.type_name()) + " (not \"str\") to " +
          std::string(v.type_name()));
  }
  const std::string s = soft_str(v), end = soft_str(p.get(2, Value::string("...")));
  const int64_t length = p.integer(0, 255), leeway = p.integer(3, 5);
  const auto cps = code_points(s);
  const int64_t end_len = int64_t(cp_length(end));
  if (length < end_len)
    raise("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (int64_t(cps.size()) <= length + leeway) return Value::string(s);
  std::string head;
  for (int64_t i = 0; i < length - end_len; ++i) head += cps[size_t(i)];
  if (!p.flag(1)) {
    const size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head.resize(sp);
  }
  return str_value(in, head + end);
}

Value f_wordcount(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "wordcount");
  int64_t n = 0;
  bool in_word = false;
  const std::string text = soft_str(v);
  for (std::string_view c : code_points(text)) {
    size_t len;
    const uint32_t cp = code_point_at(c, 0, len);
    const bool word =
        (cp < 0x80 && (std::isalnum(int(cp)) || cp == '_')) || (cp >= 0x80 && !py_space(cp));
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::integer(n);
}

Value f_batch(Interp& in, const Value& v, Args& a) {
  Params p(a, {"linecount", "fill_with"}, "batch");
  const int64_t n = p.integer(0, 0);
  if (n <= 0) raise("batch size must be positive");
  const Value fill = p.get(1, Value::none());
  List out, cur;
  const Value seq_v = in.iterate(v);
  for (const Value& x : seq_v.items()) {
    if (int64_t(cur.size()) == n) out.push_back(Value::seq(std::move(cur))), cur.clear();
    cur.push_back(x);
  }
  if (!cur.empty()) {
    while (!fill.is_none() && int64_t(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value::seq(std::move(cur)));
  }
  return generator(std::move(out));
}

Value f_slice(Interp& in, const Value& v, Args& a) {
  Params p(a, {"slices", "fill_with"}, "slice");
  const int64_t slices = p.integer(0, 0);
  if (slices <= 0) raise("slice count must be positive");
  const Value fill = p.get(1, Value::none());
  const Value seq_v = in.iterate(v);
  const List& seq = seq_v.items();
  const int64_t len = int64_t(seq.size()), per = len / slices, extra = len % slices;
  List out;
  int64_t offset = 0;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    List part(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && k >= extra) part.push_back(fill);
    out.push_back(Value::seq(std::move(part)));
  }
  return generator(std::move(out));
}

Value f_safe(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "safe");
  return Value::string(soft_str(v), true);
}

Value f_escape(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "escape");
  if (v.markup()) return v;
  return Value::string(html_escape(soft_str(v)), true);
}

Value f_forceescape(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "forceescape");
  return Value::string(html_escape(soft_str(v)), true);
}

Value f_format(Interp& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty())
    raise("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    Dict d;
    for (const auto& [k, x] : a.kw) d.set(Value::string(k), x);
    args = Value::dict(std::move(d));
  } else {
    args = Value::seq(a.pos, SeqKind::Tuple);
  }
  return str_value(in, percent_format(soft_str(v), args));
}

// |attr(name): the attribute only, never the item of that name.
Value f_attr(Interp& in, const Value& v, Args& a) {
  Params p(a, {"name"}, "attr");
  const std::string name = soft_str(p.get(0, Value::string("")));
  if (v.is_dict()) {
    Value m = in.getattr(Value::dict(Dict{}), name);
    return m.is_function() || m.unsafe()
               ? in.getattr(v, name)
               : Value::undefined(v.object_type_repr() + " has no attribute '" + name + "'");
  }
  return in.getattr(v, name);
}

// ---- tests ----

bool t_defined(Interp&, const Value& v, Args&) { return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, Args&) { return v.is_undefined(); }
bool t_none(Interp&, const Value& v, Args&) { return v.is_none(); }
bool t_boolean(Interp&, const Value& v, Args&) { return v.is_bool(); }
bool t_false(Interp&, const Value& v, Args&) { return v.is_bool() && !v.as_bool(); }
bool t_true(Interp&, const Value& v, Args&) { return v.is_bool() && v.as_bool(); }
bool t_integer(Interp&, const Value& v, Args&) { return v.is_int(); }
bool t_float(Interp&, const Value& v, Args&) { return v.is_float(); }
bool t_number(Interp&, const Value& v, Args&) { return v.is_number(); }
bool t_string(Interp&, const Value& v, Args&) { return v.is_string(); }
bool t_mapping(Interp&, const Value& v, Args&) { return v.is_dict(); }
bool t_callable(Interp&, const Value& v, Args&) { return v.is_function() || v.is_undefined(); }
bool t_escaped(Interp&, const Value& v, Args&) { return v.markup(); }
bool t_iterable(Interp&, const Value& v, Args&) {
  return v.is_string() || v.is_seq() || v.is_dict() || v.is_undefined();
}
// len() and [] both work: str, list, tuple, dict, and Undefined.
bool t_sequence(Interp&, const Value& v, Args&) {
  return v.is_string() || v.is_indexable() || v.is_dict() || v.is_undefined();
}
const Value& test_arg(const Args& a, const char* name) {
  if (a.pos.empty() && a.kw.empty()) raise(std::string("test '") + name + "' needs an argument");
  return a.pos.empty() ? a.kw[0].second : a.pos[0];
}
bool t_eq(Interp&, const Value& v, Args& a) { return py_equal(v, test_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, Args& a) { return !py_equal(v, test_arg(a, "ne")); }
bool t_lt(Interp& in, const Value& v, Args& a) {
  return in.compare(CmpOp::Lt, v, test_arg(a, "lt"));
}
bool t_le(Interp& in, const Value& v, Args& a) {
  return in.compare(CmpOp::Le, v, test_arg(a, "le"));
}
bool t_gt(Interp& in, const Value& v, Args& a) {
  return in.compare(CmpOp::Gt, v, test_arg(a, "gt"));
}
bool t_ge(Interp& in, const Value& v, Args& a) {
  return in.compare(CmpOp::Ge, v, test_arg(a, "ge"));
}
bool t_in(Interp& in, const Value& v, Args& a) { return in.contains(test_arg(a, "in"), v); }
bool t_sameas(Interp&, const Value& v, Args& a) {
  const Value& o = test_arg(a, "sameas");
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
  if (v.is_int() && o.is_int())
    return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
  return v.same_object(o);
}
bool t_odd(Interp& in, const Value& v, Args&) {
  return py_equal(in.binop(BinOp::Mod, v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interp& in, const Value& v, Args&) {
  return py_equal(in.binop(BinOp::Mod, v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interp& in, const Value& v, Args& a) {
  return py_equal(in.binop(BinOp::Mod, v, test_arg(a, "divisibleby")), Value::integer(0));
}
bool t_lower(Interp& in, const Value& v, Args&) {
  Args none;
  return string_method(Value::string(soft_str(v)), "islower").function().call(in, none).truthy();
}
bool t_upper(Interp& in, const Value& v, Args&) {
  Args none;
  return string_method(Value::string(soft_str(v)), "isupper").function().call(in, none).truthy();
}
bool t_filter(Interp&, const Value& v, Args&) { return v.is_string() && find_filter(v.str()); }
bool t_test(Interp&, const Value& v, Args&) { return v.is_string() && find_test(v.str()); }

struct Tables {
  FilterTable filters;
  std::unordered_map<std::string_view, TestFn> tests;
  Tables() {
    add_sequence_filters(filters);
    auto& f = filters;
    f["int"] = f_int;
    f["float"] = f_float;
    f["abs"] = f_abs;
    f["round"] = f_round;
    f["indent"] = f_indent;
    f["center"] = f_center;
    f["truncate"] = f_truncate;
    f["wordcount"] = f_wordcount;
    f["batch"] = f_batch;
    f["slice"] = f_slice;
    f["safe"] = f_safe;
    f["e"] = f["escape"] = f_escape;
    f["forceescape"] = f_forceescape;
    f["format"] = f_format;
    f["attr"] = f_attr;
    for (const char* n : {"groupby", "wordwrap", "urlize", "urlencode", "xmlattr", "filesizeformat",
                          "pprint", "random", "striptags"})
      f[n] = unsupported_filter;
    auto& t = tests;
    t["defined"] = t_defined;
    t["undefined"] = t_undefined;
    t["none"] = t_none;
    t["boolean"] = t_boolean;
    t["false"] = t_false;
    t["true"] = t_true;
    t["integer"] = t_integer;
    t["float"] = t_float;
    t["number"] = t_number;
    t["string"] = t_string;
    t["mapping"] = t_mapping;
    t["iterable"] = t_iterable;
    t["sequence"] = t_sequence;
    t["callable"] = t_callable;
    t["escaped"] = t_escaped;
    t["sameas"] = t_sameas;
    t["in"] = t_in;
    t["=="] = t["eq"] = t["equalto"] = t_eq;
    t["!="] = t["ne"] = t_ne;
    t["<"] = t["lt"] = t["lessthan"] = t_lt;
    t["<="] = t["le"] = t_le;
    t[">"] = t["gt"] = t["greaterthan"] = t_gt;
    t[">="] = t["ge"] = t_ge;
    t["odd"] = t_odd;
    t["even"] = t_even;
    t["divisibleby"] = t_divisibleby;
    t["lower"] = t_lower;
    t["upper"] = t_upper;
    t["filter"] = t_filter;
    t["test"] = t_test;
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

Value unsupported_filter(Interp&, const Value&, Args&) {
  raise("this jinja2 filter is not supported");  // callers name the filter
}

FilterFn find_filter(std::string_view name) {
  auto it = tables().filters.find(name);
  return it == tables().filters.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto it = tables().tests.find(name);
  return it == tables().tests.end() ? nullptr : it->second;
}

Value Interp::apply_filter(std::string_view name, const Value& v, Args& args) {
  FilterFn f = find_filter(name);
  if (!f) raise("No filter named '" + std::string(name) + "' found.");
  if (f == unsupported_filter)
    raise("the jinja2 filter '" + std::string(name) + "' is not supported");
  charge(1);
  return f(*this, v, args);
}

bool Interp::apply_test(std::string_view name, const Value& v, Args& args) {
  TestFn t = find_test(name);
  if (!t) raise("No test named '" + std::string(name) + "' found.");
  charge(1);
  return t(*this, v, args);
}

}  // namespace kvant::jinja
