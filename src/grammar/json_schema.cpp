// The JSON Schema compiler of json_schema.h.
#include "grammar/json_schema.h"

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "grammar/regex.h"

namespace kvant::grammar {

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {
      "title",    "description", "default",   "examples",         "$comment",
      "$schema",  "$id",         "$anchor",   "deprecated",       "readOnly",
      "writeOnly", "$defs",      "definitions", "contentMediaType", "contentEncoding",
      "$vocabulary", "strict"};
  return k;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> k = {
      "type",      "enum",        "const",    "properties", "required",  "additionalProperties",
      "items",     "prefixItems", "minItems", "maxItems",   "uniqueItems", "minLength",
      "maxLength", "pattern",     "format",   "minimum",    "maximum",   "exclusiveMinimum",
      "exclusiveMaximum", "anyOf", "allOf",   "$ref",       "additionalItems"};
  return k;
}

const char* kTypes[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

// Regular expressions (regex.h dialect) for the supported formats.
const char* format_pattern(const std::string& f) {
  if (f == "date") return "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  if (f == "time") return "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  if (f == "date-time")
    return "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  if (f == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  if (f == "email") return "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){0,8}";
  if (f == "ipv4") return "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  return nullptr;
}

class Compiler {
 public:
  Compiler(const ojson& root, Grammar& g, const JsonSchemaOptions& o) : root_(root), g_(g), o_(o) {}

  Result<int32_t> value_rule(const ojson& schema) {
    auto e = compile(schema, "", 0);
    if (!e) return e.error();
    const int32_t r = g_.add_rule("root");
    KV_TRY(g_.define(r, *e));
    return r;
  }

  Result<int32_t> any_object_rule() {
    const int32_t r = g_.add_rule("object");
    KV_TRY(g_.define(r, any_object()));
    return r;
  }

 private:
  Result<Expr> fail(const std::string& path, const std::string& why) {
    return make_error("json_schema" + std::string(path.empty() ? "" : " at " + path) + ": " + why);
  }

  // Shared pieces, made on first use.
  Expr ws() {
    if (ws_ < 0) {
      ws_ = g_.add_rule("ws");
      ByteSet s = ByteSet::of(' ');
      s.add('\n');
      s.add('\t');
      s.add('\r');
      (void)g_.define(ws_, Expr::repeat(Expr::bytes(s), 0, o_.max_whitespace));
    }
    return Expr::rule(ws_);
  }
  Expr json_char() {
    if (char_ < 0) {
      char_ = g_.add_rule("char");
      std::vector<Expr> alts;
      alts.push_back(charset_expr(CharSet::any(), TextMode::JsonString).value());
      // Any character may also be written \uXXXX.
      ByteSet hex = ByteSet::range('0', '9');
      hex.add_range('a', 'f');
      hex.add_range('A', 'F');
      alts.push_back(Expr::seq({Expr::lit("\\u"), Expr::repeat(Expr::bytes(hex), 4, 4)}));
      (void)g_.define(char_, Expr::alt(std::move(alts)));
    }
    return Expr::rule(char_);
  }
  Expr any_string() {
    if (string_ < 0) {
      string_ = g_.add_rule("string");
      (void)g_.define(string_, Expr::seq({Expr::lit("\""), Expr::star(json_char()), Expr::lit("\"")}));
    }
    return Expr::rule(string_);
  }
  Expr integer() { return integer_range_expr(nullptr, nullptr); }
  Expr number() {
    if (number_ < 0) {
      number_ = g_.add_rule("number");
      ByteSet e = ByteSet::of('e');
      e.add('E');
      ByteSet sign = ByteSet::of('+');
      sign.add('-');
      const Expr fraction = Expr::repeat(Expr::byte_range('0', '9'), 1, 16);
      const Expr exponent = Expr::repeat(Expr::byte_range('0', '9'), 1, 3);
      (void)g_.define(number_, Expr::seq({integer(), Expr::opt(Expr::seq({Expr::lit("."), fraction})),
                                          Expr::opt(Expr::seq({Expr::bytes(e), Expr::opt(Expr::bytes(sign)),
                                                               exponent}))}));
    }
    return Expr::rule(number_);
  }
  Expr any_value() {
    if (value_ < 0) {
      value_ = g_.add_rule("value");
      const int32_t obj = g_.add_rule("object"), arr = g_.add_rule("array");
      (void)g_.define(value_, Expr::alt({Expr::rule(obj), Expr::rule(arr), any_string(), number(),
                                         Expr::lit("true"), Expr::lit("false"), Expr::lit("null")}));
      Expr member = Expr::seq({any_string(), ws(), Expr::lit(":"), ws(), Expr::rule(value_), ws()});
      (void)g_.define(obj, Expr::seq({Expr::lit("{"), ws(),
                                      Expr::opt(Expr::seq({member, Expr::star(Expr::seq({Expr::lit(","), ws(), member}))})),
                                      Expr::lit("}")}));
      Expr item = Expr::seq({Expr::rule(value_), ws()});
      (void)g_.define(arr, Expr::seq({Expr::lit("["), ws(),
                                      Expr::opt(Expr::seq({item, Expr::star(Expr::seq({Expr::lit(","), ws(), item}))})),
                                      Expr::lit("]")}));
      any_object_ = obj;
    }
    return Expr::rule(value_);
  }
  Expr any_object() {
    any_value();
    return Expr::rule(any_object_);
  }

  // Keyword check: names of unsupported keywords, comma-separated.
  std::string unsupported(const ojson& s) {
    std::string bad;
    for (const auto& [k, v] : s.items()) {
      if (annotations().count(k) || supported().count(k)) continue;
      if (k == "uniqueItems" && v == false) continue;
      bad += (bad.empty() ? "" : ", ") + ("'" + k + "'");
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) bad += (bad.empty() ? "" : ", ") + std::string("'uniqueItems'");
    return bad;
  }

  bool has_constraints_besides(const ojson& s, const std::set<std::string>& except) {
    for (const auto& [k, v] : s.items())
      if (!annotations().count(k) && !except.count(k)) return true;
    return false;
  }

  Result<Expr> resolve_ref(const std::string& ref, const std::string& path, uint32_t depth) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return Expr::rule(it->second);
    if (ref.empty() || ref[0] != '#') return fail(path, "only references within the schema ('#...') are supported, not '" + ref + "'");
    std::string pointer;
    for (size_t i = 1; i < ref.size(); ++i) {  // percent-decoding
      if (ref[i] == '%' && i + 2 < ref.size()) {
        pointer.push_back(char(std::stoi(ref.substr(i + 1, 2), nullptr, 16)));
        i += 2;
      } else {
        pointer.push_back(ref[i]);
      }
    }
    const ojson* target = &root_;
    if (!pointer.empty()) {
      if (pointer[0] != '/') return fail(path, "unsupported reference '" + ref + "'");
      try {
        target = &root_.at(ojson::json_pointer(pointer));
      } catch (const std::exception&) {
        return fail(path, "the reference '" + ref + "' names nothing in the schema");
      }
    }
    const int32_t r = g_.add_rule("ref");
    refs_.emplace(ref, r);
    auto e = compile(*target, ref, depth + 1);
    if (!e) return e.error();
    KV_TRY(g_.define(r, *e));
    return Expr::rule(r);
  }

  Result<Expr> compile(const ojson& s, const std::string& path, uint32_t depth) {
    if (depth > o_.max_depth) return fail(path, "schemas nested deeper than " + std::to_string(o_.max_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      return fail(path, "the schema false admits no value");
    }
    if (!s.is_object()) return fail(path, "a schema must be an object or a boolean");
    if (!o_.lenient) {
      const std::string bad = unsupported(s);
      if (!bad.empty()) return fail(path, "unsupported keyword" + std::string(bad.find(',') != std::string::npos ? "s " : " ") + bad);
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return fail(path, "$ref must be a string");
      if (!o_.lenient && has_constraints_besides(s, {"$ref"}))
        return fail(path, "keywords beside $ref are not supported");
      return resolve_ref(s["$ref"].get<std::string>(), path + "/$ref", depth);
    }
    if (s.contains("allOf")) {
      const ojson& a = s["allOf"];
      if (!a.is_array() || a.size() != 1 || (!o_.lenient && has_constraints_besides(s, {"allOf"})))
        return fail(path, "allOf is supported with one schema and nothing beside it");
      return compile(a[0], path + "/allOf/0", depth + 1);
    }
    if (s.contains("anyOf")) {
      const ojson& a = s["anyOf"];
      if (!a.is_array() || a.empty()) return fail(path, "anyOf must be a non-empty list");
      if (!o_.lenient && has_constraints_besides(s, {"anyOf"}))
        return fail(path, "keywords beside anyOf are not supported");
      std::vector<Expr> alts;
      for (size_t i = 0; i < a.size(); ++i) {
        auto e = compile(a[i], path + "/anyOf/" + std::to_string(i), depth + 1);
        if (!e) return e.error();
        alts.push_back(std::move(*e));
      }
      return Expr::alt(std::move(alts));
    }
    auto types = type_list(s, path);
    if (!types) return types.error();
    if (s.contains("enum") || s.contains("const")) return literals(s, *types, path);
    std::vector<Expr> alts;
    for (const std::string& t : *types) {
      auto e = typed(s, t, path, depth);
      if (!e) return e.error();
      alts.push_back(std::move(*e));
    }
    if (alts.empty()) return fail(path, "no type is possible");
    return Expr::alt(std::move(alts));
  }

  Result<std::vector<std::string>> type_list(const ojson& s, const std::string& path) {
    std::vector<std::string> types;
    auto known = [](const std::string& t) {
      for (const char* k : kTypes)
        if (t == k) return true;
      return false;
    };
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& x : t) {
          if (!x.is_string()) return make_error("json_schema at " + path + ": type names must be strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return make_error("json_schema at " + path + ": type must be a string or a list");
      }
      for (const auto& x : types)
        if (!known(x)) return make_error("json_schema at " + path + ": unknown type '" + x + "'");
      // "number" already spells every integer.
      bool num = false;
      for (const auto& x : types) num |= x == "number";
      if (num) std::erase(types, std::string("integer"));
      return types;
    }
    if (!o_.spec_defaults) {
      // Without a type, the one the keywords imply.
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return std::vector<std::string>{"object"};
      if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) return std::vector<std::string>{"array"};
      if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) return std::vector<std::string>{"string"};
      if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) return std::vector<std::string>{"number"};
    }
    return std::vector<std::string>{"null", "boolean", "object", "array", "number", "string"};
  }

  static bool value_has_type(const ojson& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    return false;
  }

  Result<Expr> literals(const ojson& s, const std::vector<std::string>& types, const std::string& path) {
    if (!o_.lenient && has_constraints_besides(s, {"enum", "const", "type"}))
      return fail(path, "keywords beside enum / const are not supported");
    std::vector<ojson> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return fail(path, "enum must be a list");
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    std::vector<Expr> alts;
    for (const auto& v : values) {
      bool ok = false;
      for (const auto& t : types) ok |= value_has_type(v, t);
      if (s.contains("const") && s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end()) ok = false;
      if (ok) alts.push_back(Expr::lit(v.dump(-1, ' ', false, ojson::error_handler_t::replace)));
    }
    if (alts.empty()) return fail(path, "no value of enum / const is possible");
    return Expr::alt(std::move(alts));
  }

  Result<Expr> typed(const ojson& s, const std::string& t, const std::string& path, uint32_t depth) {
    if (t == "null") return Expr::lit("null");
    if (t == "boolean") return Expr::alt({Expr::lit("true"), Expr::lit("false")});
    if (t == "number") return number_expr(s, path);
    if (t == "integer") return integer_expr(s, path);
    if (t == "string") return string_expr(s, path);
    if (t == "array") return array_expr(s, path, depth);
    return object_expr(s, path, depth);
  }

  // A bounded number: the integers in range, and decimals whose integer
  // part keeps every fraction in range (no exponent). Sound; values such as
  // 0.7 in [0.5, 1.5] are left out.
  Result<Expr> number_expr(const ojson& s, const std::string& path) {
    bool bounded = false;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) bounded |= s.contains(k);
    if (!bounded || o_.lenient) return number();
    std::optional<double> lo, hi;
    bool lo_x = false, hi_x = false;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number()) return fail(path, std::string(k) + " must be a number");
      const double v = s[k].get<double>();
      if (!std::isfinite(v) || std::fabs(v) > 9.0e18) return fail(path, std::string(k) + " is out of range");
      const bool is_min = std::string_view(k).find("inimum") != std::string_view::npos;
      const bool excl = k[0] == 'e';
      if (is_min && (!lo || v > *lo || (v == *lo && excl))) lo = v, lo_x = excl;
      if (!is_min && (!hi || v < *hi || (v == *hi && excl))) hi = v, hi_x = excl;
    }
    std::vector<Expr> alts;
    if (auto ints = integer_expr(s, path)) alts.push_back(std::move(*ints));  // none: no integer in range
    const Expr frac = Expr::seq({Expr::lit("."), Expr::repeat(Expr::byte_range('0', '9'), 1, 16)});
    // Non-negative integer part a: the value lies in [a, a + 1).
    int64_t a = 0;
    if (lo) a = std::max<int64_t>(0, lo_x ? int64_t(std::floor(*lo)) + 1 : int64_t(std::ceil(*lo)));
    std::optional<int64_t> b;
    if (hi) b = int64_t(std::floor(*hi)) - 1;
    if (!b || a <= *b) alts.push_back(Expr::seq({integer_range_expr(&a, b ? &*b : nullptr), frac}));
    // Negative, magnitude m: the value lies in (-(m + 1), -m].
    int64_t c = 0;
    if (hi) c = std::max<int64_t>(0, hi_x ? int64_t(std::floor(-*hi)) + 1 : int64_t(std::ceil(-*hi)));
    std::optional<int64_t> d;
    if (lo) d = int64_t(std::floor(-*lo)) - 1;
    if (!d || c <= *d)
      alts.push_back(Expr::seq({Expr::lit("-"), integer_range_expr(&c, d ? &*d : nullptr), frac}));
    if (alts.empty()) return fail(path, "no number this server can write lies between the bounds");
    return Expr::alt(std::move(alts));
  }

  Result<Expr> integer_expr(const ojson& s, const std::string& path) {
    std::optional<int64_t> lo, hi;
    auto bound = [&](const char* k, bool is_min, bool exclusive) -> Result<void> {
      if (!s.contains(k)) return {};
      const ojson& v = s[k];
      if (!v.is_number()) return make_error("json_schema at " + path + ": " + k + " must be a number");
      const double x = v.get<double>();
      if (std::fabs(x) > 9.0e18) return make_error("json_schema at " + path + ": " + k + " is out of range");
      double b = is_min ? std::ceil(x) : std::floor(x);
      if (exclusive && b == x) b += is_min ? 1 : -1;
      const int64_t iv = int64_t(b);
      if (is_min) lo = lo ? std::max(*lo, iv) : iv;
      else hi = hi ? std::min(*hi, iv) : iv;
      return {};
    };
    KV_TRY(bound("minimum", true, false));
    KV_TRY(bound("exclusiveMinimum", true, true));
    KV_TRY(bound("maximum", false, false));
    KV_TRY(bound("exclusiveMaximum", false, true));
    if (lo && hi && *lo > *hi) return fail(path, "no integer lies between the bounds");
    return integer_range_expr(lo ? &*lo : nullptr, hi ? &*hi : nullptr);
  }

  Result<uint32_t> count(const ojson& s, const char* k, uint32_t dflt, const std::string& path) {
    if (!s.contains(k)) return dflt;
    const ojson& v = s[k];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      return make_error("json_schema at " + path + ": " + k + " must be a non-negative integer");
    const uint64_t n = v.get<uint64_t>();
    if (n > 4096) return make_error("json_schema at " + path + ": " + k + " above 4096 is not supported");
    return uint32_t(n);
  }

  Result<Expr> string_expr(const ojson& s, const std::string& path) {
    auto mn = count(s, "minLength", 0, path);
    if (!mn) return mn.error();
    auto mx = count(s, "maxLength", kUnbounded, path);
    if (!mx && !(s.contains("maxLength") && o_.lenient)) return mx.error();
    const uint32_t hi = mx ? *mx : kUnbounded;
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    if (s.contains("format")) {
      const ojson& f = s["format"];
      const char* p = f.is_string() ? format_pattern(f.get<std::string>()) : nullptr;
      if (p) pattern = std::string("^") + p + "$";
      else if (!o_.lenient) return fail(path, "unsupported format " + f.dump());
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return fail(path, "pattern must be a string");
      if (!pattern.empty() && !o_.lenient) return fail(path, "pattern beside format is not supported");
      pattern = s["pattern"].get<std::string>();
    }
    if (!pattern.empty()) {
      if (lengths && !o_.lenient) return fail(path, "minLength / maxLength beside pattern or format are not supported");
      RegexOptions ro;
      ro.mode = TextMode::JsonString;
      ro.search = true;
      auto e = compile_regex(pattern, g_, ro);
      if (!e) return fail(path, e.error().message);
      return Expr::seq({Expr::lit("\""), std::move(*e), Expr::lit("\"")});
    }
    if (!lengths) return any_string();
    if (hi != kUnbounded && hi < *mn) return fail(path, "maxLength is below minLength");
    return Expr::seq({Expr::lit("\""), Expr::repeat(json_char(), *mn, hi), Expr::lit("\"")});
  }

  Result<Expr> array_expr(const ojson& s, const std::string& path, uint32_t depth);
  Result<Expr> object_expr(const ojson& s, const std::string& path, uint32_t depth);
  Expr other_key(const std::set<std::string>& named);

  const ojson& root_;
  Grammar& g_;
  const JsonSchemaOptions& o_;
  int32_t ws_ = -1, char_ = -1, string_ = -1, number_ = -1, value_ = -1, any_object_ = -1;
  std::map<std::string, int32_t> refs_;
};

Result<Expr> Compiler::array_expr(const ojson& s, const std::string& path, uint32_t depth) {
  auto mn = count(s, "minItems", 0, path);
  if (!mn) return mn.error();
  auto mx = count(s, "maxItems", kUnbounded, path);
  if (!mx) return mx.error();
  std::vector<Expr> prefix;
  // Draft 7's tuples: items as a list, additionalItems for the rest.
  const bool tuple = s.contains("items") && s["items"].is_array();
  const char* prefix_key = tuple ? "items" : "prefixItems";
  const char* rest_key = tuple ? "additionalItems" : "items";
  if (s.contains(prefix_key)) {
    const ojson& p = s[prefix_key];
    if (!p.is_array()) return fail(path, "prefixItems must be a list");
    for (size_t i = 0; i < p.size(); ++i) {
      auto e = compile(p[i], path + "/" + prefix_key + "/" + std::to_string(i), depth + 1);
      if (!e) return e.error();
      prefix.push_back(std::move(*e));
    }
  }
  std::optional<Expr> rest = any_value();
  if (s.contains(rest_key)) {
    if (s[rest_key] == false) {
      rest.reset();
    } else {
      auto e = compile(s[rest_key], path + "/" + rest_key, depth + 1);
      if (!e) return e.error();
      rest = std::move(*e);
    }
  }
  const uint32_t lo = *mn;
  uint32_t hi = *mx;
  if (!rest) hi = std::min<uint32_t>(hi, uint32_t(prefix.size()));
  if (hi != kUnbounded && hi < lo) return fail(path, "no array length is possible");
  auto item_at = [&](uint32_t i) { return i < prefix.size() ? prefix[i] : *rest; };
  const Expr comma = Expr::seq({Expr::lit(","), ws()});
  // after[i]: the rest of an array that has i items, for i in [1, last];
  // without a maximum, after[last] loops on the `items` schema.
  const uint32_t last =
      hi != kUnbounded ? hi : std::max<uint32_t>({lo, uint32_t(prefix.size()), 1u});
  std::vector<int32_t> after(size_t(last) + 1, -1);
  for (uint32_t i = 1; i <= last; ++i) after[i] = g_.add_rule("items");
  for (uint32_t i = 1; i <= last; ++i) {
    std::vector<Expr> alts;
    if (i >= lo) alts.push_back(Expr::lit("]"));
    if (i < last) alts.push_back(Expr::seq({comma, item_at(i), ws(), Expr::rule(after[i + 1])}));
    else if (hi == kUnbounded) alts.push_back(Expr::seq({comma, item_at(i), ws(), Expr::rule(after[i])}));
    KV_TRY(g_.define(after[i], Expr::alt(std::move(alts))));
  }
  std::vector<Expr> first;
  if (lo == 0) first.push_back(Expr::lit("]"));
  if (last >= 1 && (hi == kUnbounded || hi >= 1)) first.push_back(Expr::seq({item_at(0), ws(), Expr::rule(after[1])}));
  return Expr::seq({Expr::lit("["), ws(), Expr::alt(std::move(first))});
}

// A member name that is none of `named` (spelled as written, without
// escapes the names do not use): a trie of the names by character, where a
// string may end only at a node that is not a name, or leave the trie with
// a character no name continues with.
Expr Compiler::other_key(const std::set<std::string>& named) {
  if (named.empty()) return any_string();
  struct Node {
    std::map<uint32_t, size_t> kids;
    bool name = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& k : named) {
    size_t n = 0;
    for (size_t i = 0; i < k.size();) {
      // Decode one UTF-8 character (the names came from valid JSON).
      const unsigned char c0 = uint8_t(k[i]);
      const int len = c0 < 0x80 ? 1 : c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : 2;
      uint32_t cp = len == 1 ? c0 : c0 & (0x3F >> (len - 1));
      for (int j = 1; j < len && i + size_t(j) < k.size(); ++j) cp = (cp << 6) | (uint8_t(k[i + size_t(j)]) & 0x3F);
      i += size_t(len);
      auto it = trie[n].kids.find(cp);
      if (it == trie[n].kids.end()) {
        trie.push_back(Node());
        it = trie[n].kids.emplace(cp, trie.size() - 1).first;
      }
      n = it->second;
    }
    trie[n].name = true;
  }
  std::vector<int32_t> rule(trie.size());
  for (auto& r : rule) r = g_.add_rule("key");
  const Expr rest = Expr::seq({Expr::star(json_char()), Expr::lit("\"")});
  for (size_t n = 0; n < trie.size(); ++n) {
    std::vector<Expr> alts;
    if (!trie[n].name) alts.push_back(Expr::lit("\""));
    CharSet others = CharSet::any();
    CharSet used;
    for (const auto& [cp, child] : trie[n].kids) {
      std::string utf8;
      uint8_t b[4];
      int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      if (len == 1) b[0] = uint8_t(cp);
      else if (len == 2) b[0] = uint8_t(0xC0 | (cp >> 6)), b[1] = uint8_t(0x80 | (cp & 0x3F));
      else if (len == 3) b[0] = uint8_t(0xE0 | (cp >> 12)), b[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F)), b[2] = uint8_t(0x80 | (cp & 0x3F));
      else b[0] = uint8_t(0xF0 | (cp >> 18)), b[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F)), b[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F)), b[3] = uint8_t(0x80 | (cp & 0x3F));
      utf8.assign(reinterpret_cast<const char*>(b), size_t(len));
      alts.push_back(Expr::seq({Expr::lit(spell(utf8, TextMode::JsonString)), Expr::rule(rule[child])}));
      used.add(cp, cp);
    }
    others = used.complement();
    if (!others.empty()) alts.push_back(Expr::seq({charset_expr(others, TextMode::JsonString).value(), rest}));
    (void)g_.define(rule[n], Expr::alt(std::move(alts)));
  }
  return Expr::seq({Expr::lit("\""), Expr::rule(rule[0])});
}

Result<Expr> Compiler::object_expr(const ojson& s, const std::string& path, uint32_t depth) {
  struct Prop {
    std::string key;
    Expr value;
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return fail(path, "required must be a list");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) return fail(path, "required must list strings");
      required.insert(r.get<std::string>());
    }
  }
  std::set<std::string> named;
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) return fail(path, "properties must be an object");
    for (const auto& [k, v] : s["properties"].items()) {
      named.insert(k);
      if (v == false) {
        if (required.count(k)) return fail(path, "property '" + k + "' is required but false");
        continue;
      }
      auto e = compile(v, path + "/properties/" + k, depth + 1);
      if (!e) return e.error();
      props.push_back(Prop{k, std::move(*e), required.count(k) > 0});
    }
  }
  for (const auto& r : required)
    if (named.insert(r).second) props.push_back(Prop{r, any_value(), true});
  // Other members: by additionalProperties, else (not the specification's
  // default) none once properties are named.
  std::optional<Expr> extra;
  if (s.contains("additionalProperties")) {
    const ojson& a = s["additionalProperties"];
    if (a != false) {
      auto e = compile(a, path + "/additionalProperties", depth + 1);
      if (!e) return e.error();
      extra = std::move(*e);
    }
  } else if (o_.spec_defaults || !s.contains("properties") || s["properties"].empty()) {
    extra = any_value();
  }
  const Expr comma = Expr::seq({Expr::lit(","), ws()});
  auto member = [&](Expr key, Expr value) {
    return Expr::seq({std::move(key), ws(), Expr::lit(":"), ws(), std::move(value), ws()});
  };
  // tail(c): extra members after the named ones; c: a comma comes first.
  std::vector<Expr> tails;
  for (int c = 0; c < 2; ++c) {
    if (!extra) {
      tails.push_back(Expr::empty());
      continue;
    }
    const Expr m = member(other_key(named), *extra);
    Expr run = Expr::seq({m, Expr::star(Expr::seq({comma, m}))});
    tails.push_back(Expr::opt(c ? Expr::seq({comma, std::move(run)}) : std::move(run)));
  }
  // rest[i][c]: members from property i on.
  const size_t n = props.size();
  std::vector<std::array<int32_t, 2>> rest(n + 1);
  for (auto& r : rest) r = {g_.add_rule("members"), g_.add_rule("members")};
  for (int c = 0; c < 2; ++c) KV_TRY(g_.define(rest[n][size_t(c)], tails[size_t(c)]));
  for (size_t i = n; i-- > 0;) {
    const Expr key = Expr::lit("\"" + spell(props[i].key, TextMode::JsonString) + "\"");
    for (int c = 0; c < 2; ++c) {
      std::vector<Expr> present;
      if (c) present.push_back(comma);
      present.push_back(member(key, props[i].value));
      present.push_back(Expr::rule(rest[i + 1][1]));
      Expr e = Expr::seq(std::move(present));
      if (!props[i].required) e = Expr::alt({std::move(e), Expr::rule(rest[i + 1][size_t(c)])});
      KV_TRY(g_.define(rest[i][size_t(c)], e));
    }
  }
  return Expr::seq({Expr::lit("{"), ws(), Expr::rule(rest[0][0]), Expr::lit("}")});
}

}  // namespace

Result<int32_t> compile_json_schema(const ojson& schema, Grammar& g, const JsonSchemaOptions& o) {
  Compiler c(schema, g, o);
  return c.value_rule(schema);
}

Result<int32_t> json_object_rule(Grammar& g, const JsonSchemaOptions& o) {
  ojson empty = ojson::object();
  Compiler c(empty, g, o);
  return c.any_object_rule();
}

}  // namespace kvant::grammar
