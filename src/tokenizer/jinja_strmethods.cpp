// Python's str methods as templates call them (s.strip(), s.split(',')...),
// printf-style "%" formatting and str.format().
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace kvant::jinja {
namespace {

const Value& arg(const Args& a, size_t i, std::string_view method) {
  if (i >= a.pos.size()) raise(std::string(method) + "() missing required argument");
  return a.pos[i];
}

const std::string& str_arg(const Args& a, size_t i, std::string_view method) {
  const Value& v = arg(a, i, method);
  if (!v.is_string())
    raise(std::string(method) + "() argument must be str, not " + std::string(v.type_name()));
  return v.str();
}

int64_t int_arg(const Args& a, size_t i, int64_t dflt) {
  if (i >= a.pos.size() || a.pos[i].is_none()) return dflt;
  if (!a.pos[i].is_int() && !a.pos[i].is_bool())
    raise("'" + std::string(a.pos[i].type_name()) + "' object cannot be interpreted as an integer");
  return a.pos[i].to_int();
}

Value str_list(std::vector<std::string> parts) {
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::seq(std::move(out));
}

// startswith/endswith take a string or a tuple of strings.
bool affix_match(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& w) {
    if (!w.is_string()) raise("startswith first arg must be str or a tuple of str");
    const std::string& x = w.str();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_seq() && what.kind() == SeqKind::Tuple) {
    for (const Value& w : what.items())
      if (one(w)) return true;
    return false;
  }
  return one(what);
}

std::string pad(std::string_view s, int64_t width, char align, std::string_view fill) {
  const int64_t n = int64_t(cp_length(s));
  if (width <= n) return std::string(s);
  const int64_t total = width - n;
  int64_t left = align == '>' ? total : align == '^' ? total / 2 : 0;
  if (align == 'c') left = total / 2 + (total & width & 1);  // str.center
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

Value bool_method(const std::string& s, std::string_view name) {
  bool any = false, ok = true;
  for (std::string_view c : code_points(s)) {
    size_t len;
    const uint32_t cp = code_point_at(c, 0, len);
    any = true;
    const bool digit = cp >= '0' && cp <= '9';
    const bool alpha = (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
      ok = ok && digit;
    else if (name == "isalpha")
      ok = ok && (alpha || (cp >= 0x80 && !py_space(cp)));
    else if (name == "isalnum")
      ok = ok && (alpha || digit || (cp >= 0x80 && !py_space(cp)));
    else if (name == "isspace")
      ok = ok && py_space(cp);
  }
  return Value::boolean(any && ok);
}

// The method `name` of s applied to a; an Undefined when str has none.
Value call_string_method(Interp& in, const Value& self, std::string_view name, Args& a) {
  const std::string& s = self.str();
  auto out = [&](std::string r) {
    in.charge(r.size() / 64);
    return Value::string(std::move(r));
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    if (a.pos.empty() || a.pos[0].is_none()) return out(std::string(py_strip(s, l, r)));
    return out(std::string(py_strip_chars(s, str_arg(a, 0, name), l, r)));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.kwarg("sep");
    const Value* maxk = a.kwarg("maxsplit");
    const Value sepv = sep ? *sep : a.pos.empty() ? Value::none() : a.pos[0];
    const int64_t maxsplit = maxk ? maxk->to_int() : int_arg(a, 1, -1);
    auto parts = name == "split" ? py_split(s, sepv, maxsplit) : py_rsplit(s, sepv, maxsplit);
    in.charge(parts.size() / 16 + s.size() / 64);
    return str_list(std::move(parts));
  }
  if (name == "splitlines") {
    const Value* k = a.kwarg("keepends");
    return str_list(py_splitlines(s, k ? k->truthy() : !a.pos.empty() && a.pos[0].truthy()));
  }
  if (name == "startswith" || name == "endswith")
    return Value::boolean(affix_match(s, arg(a, 0, name), name == "startswith"));
  if (name == "upper") return out(py_upper(s));
  if (name == "lower" || name == "casefold") return out(py_lower(s));
  if (name == "title") return out(py_title(s));
  if (name == "capitalize") return out(py_capitalize(s));
  if (name == "replace")
    return out(py_replace(s, str_arg(a, 0, name), str_arg(a, 1, name), int_arg(a, 2, -1)));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string& sub = str_arg(a, 0, name);
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") raise("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(cp_length(std::string_view(s).substr(0, at))));
  }
  if (name == "count") {
    const std::string& sub = str_arg(a, 0, name);
    if (sub.empty()) return Value::integer(int64_t(cp_length(s)) + 1);
    int64_t n = 0;
    for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value items = in.iterate(arg(a, 0, name));
    std::string r;
    for (size_t i = 0; i < items.items().size(); ++i) {
      const Value& x = items.items()[i];
      if (!x.is_string())
        raise("sequence item " + std::to_string(i) + ": expected str instance, " +
              std::string(x.type_name()) + " found");
      if (i) r += s;
      r += x.str();
      in.check_size(r.size());
    }
    return out(std::move(r));
  }
  if (name == "format") return out(brace_format(s, a));
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& x = str_arg(a, 0, name);
    const bool pre = name == "removeprefix";
    if (!affix_match(s, Value::string(x), pre)) return self;
    return out(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
  }
  if (name == "partition" || name == "rpartition") {
    const std::string& sep = str_arg(a, 0, name);
    if (sep.empty()) raise("empty separator");
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    List parts;
    if (at == std::string::npos) {
      parts = name == "partition" ? List{self, Value::string(""), Value::string("")}
                                  : List{Value::string(""), Value::string(""), self};
    } else {
      parts = {Value::string(s.substr(0, at)), Value::string(sep),
               Value::string(s.substr(at + sep.size()))};
    }
    return Value::seq(std::move(parts), SeqKind::Tuple);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const std::string fill = a.pos.size() > 1 ? str_arg(a, 1, name) : " ";
    const char align = name == "center" ? 'c' : name == "ljust" ? '<' : '>';
    return out(pad(s, int_arg(a, 0, 0), align, fill));
  }
  if (name == "zfill") {
    const int64_t width = int_arg(a, 0, 0), n = int64_t(cp_length(s));
    if (width <= n) return self;
    const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    return out(s.substr(0, sign) + std::string(size_t(width - n), '0') + s.substr(sign));
  }
  if (name == "islower" || name == "isupper") {
    bool any = false, ok = true;
    for (std::string_view c : code_points(s)) {
      const std::string lo = py_lower(c), up = py_upper(c);
      if (lo == up) continue;  // uncased
      any = true;
      ok = ok && (name == "islower" ? c == lo : c == up);
    }
    return Value::boolean(any && ok);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" || name == "isalpha" ||
      name == "isalnum" || name == "isspace")
    return bool_method(s, name);
  if (name == "swapcase") {
    std::string r;
    for (std::string_view c : code_points(s)) {
      const std::string lo = py_lower(c);
      r += lo == c ? py_upper(c) : lo;
    }
    return out(std::move(r));
  }
  return Value();
}

constexpr std::string_view kStringMethods[] = {
    "strip",      "lstrip",   "rstrip",    "split",        "rsplit",       "splitlines",
    "startswith", "endswith", "upper",     "lower",        "casefold",     "title",
    "capitalize", "replace",  "find",      "rfind",        "index",        "rindex",
    "count",      "join",     "format",    "removeprefix", "removesuffix", "partition",
    "rpartition", "center",   "ljust",     "rjust",        "zfill",        "islower",
    "isupper",    "isdigit",  "isdecimal", "isnumeric",    "isalpha",      "isalnum",
    "isspace",    "swapcase"};

constexpr std::string_view kUnsupportedStringMethods[] = {"encode",  "expandtabs",   "format_map",
                                                          "isascii", "isidentifier", "isprintable",
                                                          "istitle", "maketrans",    "translate"};

}  // namespace

Value string_method(const Value& s, std::string_view name) {
  for (std::string_view m : kStringMethods) {
    if (m != name) continue;
    auto f = std::make_shared<Function>();
    f->name = std::string(name);
    f->call = [s, m](Interp& in, Args& a) { return call_string_method(in, s, m, a); };
    return Value::function(std::move(f));
  }
  for (std::string_view m : kUnsupportedStringMethods) {
    if (m != name) continue;
    auto f = std::make_shared<Function>();
    f->name = std::string(name);
    f->call = [m](Interp&, Args&) -> Value {
      raise("str." + std::string(m) + "() is not supported in chat templates here");
    };
    return Value::function(std::move(f));
  }
  return Value();
}

// ---- formatting ----

namespace {

struct Spec {
  std::string fill = " ";
  char align = 0, sign = 0, type = 0;
  bool alt = false, zero = false, comma = false;
  int64_t width = -1, precision = -1;
};

std::string format_number(const Value& v, const Spec& sp) {
  char fmt[32], buf[512];
  const char type = sp.type ? sp.type : (v.is_float() ? 0 : 'd');
  if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'c') {
    if (v.is_float())
      raise("Unknown format code '" + std::string(1, type) + "' for object of type 'float'");
    if (type == 'c') {
      std::string s;
      utf8::append_code_point(uint32_t(v.to_int()), s);
      return s;
    }
    std::snprintf(fmt, sizeof(fmt), "%%%s%s%s",
                  sp.sign == '+'   ? "+"
                  : sp.sign == ' ' ? " "
                                   : "",
                  sp.alt ? "#" : "",
                  type == 'd'   ? "lld"
                  : type == 'x' ? "llx"
                  : type == 'X' ? "llX"
                                : "llo");
    std::snprintf(buf, sizeof(buf), fmt, static_cast<long long>(v.to_int()));
  } else if (type == 0 && sp.precision < 0) {
    std::string s = float_repr(v.to_float());
    if (sp.sign == '+' && v.to_float() >= 0) s = "+" + s;
    return s;
  } else {
    const char t = type == 0 ? 'g' : type == '%' ? 'f' : type;
    const double x = type == '%' ? v.to_float() * 100 : v.to_float();
    std::snprintf(fmt, sizeof(fmt), "%%%s%s.%lld%c",
                  sp.sign == '+'   ? "+"
                  : sp.sign == ' ' ? " "
                                   : "",
                  sp.alt ? "#" : "", static_cast<long long>(sp.precision < 0 ? 6 : sp.precision),
                  t);
    std::snprintf(buf, sizeof(buf), fmt, x);
    if (type == '%') return std::string(buf) + "%";
  }
  return buf;
}

// Python's format(value, spec) for str, int, float.
std::string format_value(const Value& v, std::string_view spec) {
  Spec sp;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    sp.fill = std::string(1, spec[0]);
    sp.align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    sp.align = spec[0];
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sp.sign = spec[i++];
  if (i < spec.size() && spec[i] == '#') sp.alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') sp.zero = true, ++i;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
    sp.width = (sp.width < 0 ? 0 : sp.width * 10) + (spec[i++] - '0');
  if (i < spec.size() && spec[i] == ',') sp.comma = true, ++i;
  if (i < spec.size() && spec[i] == '.') {
    sp.precision = 0;
    for (++i; i < spec.size() && spec[i] >= '0' && spec[i] <= '9'; ++i)
      sp.precision = sp.precision * 10 + (spec[i] - '0');
  }
  if (i < spec.size()) sp.type = spec[i++];
  if (i != spec.size() || sp.comma)
    raise("unsupported format specifier '" + std::string(spec) + "'");
  std::string body;
  if (v.is_string() || (!v.is_number() && !sp.type)) {
    body = v.is_string() ? v.str() : py_str(v);
    if (sp.precision >= 0) {
      const auto cps = code_points(body);
      if (int64_t(cps.size()) > sp.precision) {
        std::string cut;
        for (int64_t k = 0; k < sp.precision; ++k) cut += cps[size_t(k)];
        body = cut;
      }
    }
    return pad(body, sp.width, sp.align ? sp.align : '<', sp.fill);
  }
  if (!v.is_number())
    raise("unsupported format string passed to " + std::string(v.type_name()) + ".__format__");
  body = v.is_bool() && !sp.type ? py_str(v) : format_number(v, sp);
  if (sp.zero && !sp.align) {
    const size_t sign =
        !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
    if (int64_t(body.size()) < sp.width)
      body.insert(sign, std::string(size_t(sp.width) - body.size(), '0'));
    return body;
  }
  return pad(body, sp.width, sp.align ? sp.align : '>', sp.fill);
}

}  // namespace

std::string brace_format(std::string_view fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        raise("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string_view::npos) raise("Single '{' encountered in format string");
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec;
    char conv = 0;
    if (const size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field = field.substr(0, bang);
    }
    const Value* v = nullptr;
    if (field.empty()) {
      if (auto_index >= a.pos.size())
        raise("Replacement index " + std::to_string(auto_index) +
              " out of range for positional args tuple");
      v = &a.pos[auto_index++];
    } else if (field[0] >= '0' && field[0] <= '9') {
      size_t k = 0;
      const auto r = std::from_chars(field.data(), field.data() + field.size(), k);
      if (r.ec != std::errc() || r.ptr != field.data() + field.size())
        raise("unsupported format field '" + std::string(field) + "'");
      if (k >= a.pos.size())
        raise("Replacement index " + std::to_string(k) + " out of range for positional args tuple");
      v = &a.pos[k];
    } else {
      v = a.kwarg(field);
      if (!v) raise("'" + std::string(field) + "'");
    }
    const Value shown = conv == 'r'   ? Value::string(py_repr(*v))
                        : conv == 's' ? Value::string(py_str(*v))
                                      : *v;
    out += spec.empty() ? py_str(shown) : format_value(shown, spec);
  }
  return out;
}

namespace {

// ascii(): repr() with every non-ASCII character escaped.
std::string ascii_escape(std::string_view s) {
  std::string out;
  for (std::string_view c : code_points(s)) {
    size_t len;
    const uint32_t cp = code_point_at(c, 0, len);
    if (cp < 0x80) {
      out += c;
      continue;
    }
    char buf[16];
    std::snprintf(buf, sizeof(buf),
                  cp < 0x100     ? "\\x%02x"
                  : cp < 0x10000 ? "\\u%04x"
                                 : "\\U%08x",
                  unsigned(cp));
    out += buf;
  }
  return out;
}

}  // namespace

std::string percent_format(std::string_view fmt, const Value& args) {
  // As CPython: a tuple gives the arguments; anything else is the one
  // argument, and a dict or list (which have __getitem__) also lifts the
  // "not all arguments converted" check.
  List pos;
  const bool mapping = args.is_dict() || (args.is_seq() && args.kind() != SeqKind::Tuple);
  if (args.is_seq() && args.kind() == SeqKind::Tuple)
    pos = args.items();
  else
    pos.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) raise("incomplete format");
    const Value* v = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos || !args.is_dict()) raise("format requires a mapping");
      v = args.dict().find(std::string_view(fmt.substr(i + 1, close - i - 1)));
      if (!v) raise("'" + std::string(fmt.substr(i + 1, close - i - 1)) + "'");
      i = close + 1;
    }
    Spec sp;
    for (; i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos;
         ++i) {
      if (fmt[i] == '-')
        sp.align = '<';
      else if (fmt[i] == '0')
        sp.zero = true;
      else if (fmt[i] == '#')
        sp.alt = true;
      else
        sp.sign = fmt[i];
    }
    for (; i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9'; ++i)
      sp.width = (sp.width < 0 ? 0 : sp.width * 10) + (fmt[i] - '0');
    if (i < fmt.size() && fmt[i] == '.') {
      sp.precision = 0;
      for (++i; i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9'; ++i)
        sp.precision = sp.precision * 10 + (fmt[i] - '0');
    }
    if (i >= fmt.size()) raise("incomplete format");
    const char t = fmt[i];
    if (t == '%') {
      out += '%';
      continue;
    }
    if (!v) {
      if (next >= pos.size()) raise("not enough arguments for format string");
      v = &pos[next++];
    }
    std::string body;
    if (t == 's' || t == 'r' || t == 'a') {
      body = t == 's' ? py_str(*v) : py_repr(*v);
      if (t == 'a') body = ascii_escape(body);
      if (sp.precision >= 0 && int64_t(cp_length(body)) > sp.precision)
        body = format_value(Value::string(body), "." + std::to_string(sp.precision));
    } else {
      if (!v->is_number())
        raise("%" + std::string(1, t) + " format: a real number is required, not " +
              std::string(v->type_name()));
      Spec num = sp;
      num.type = (t == 'i' || t == 'u') ? 'd' : t;
      num.zero = false;
      const Value x = (num.type == 'd' || num.type == 'x' || num.type == 'X' || num.type == 'o') &&
                              v->is_float()
                          ? Value::integer(int64_t(v->as_float()))
                          : *v;
      body = format_number(x, num);
    }
    if (sp.zero && sp.align != '<' && t != 's' && t != 'r' && int64_t(body.size()) < sp.width) {
      const size_t sign =
          !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
      body.insert(sign, std::string(size_t(sp.width) - body.size(), '0'));
    }
    out += pad(body, sp.width, sp.align == '<' ? '<' : '>', " ");
  }
  if (next < pos.size() && !mapping) raise("not all arguments converted during string formatting");
  return out;
}

}  // namespace kvant::jinja
