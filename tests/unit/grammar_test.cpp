// Grammars, regular expressions, integer ranges and JSON Schema compiled to
// grammars (src/grammar), checked by whole-string acceptance; the JSON
// Schema Test Suite (Debian's json-schema-test-suite) for the supported
// keywords is in grammar_schema_suite_test.cpp, token masks in
// grammar_mask_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace kvant::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// A byte-level acceptor for one grammar.
class Acceptor {
 public:
  explicit Acceptor(std::shared_ptr<Grammar> g) : m_(std::move(g)) {}
  bool operator()(std::string_view s) {
    int32_t st = m_.start();
    if (st < 0) return false;
    st = m_.step_bytes(st, s);
    return st >= 0 && m_.accepting(st);
  }
  Matcher& matcher() { return m_; }

 private:
  Matcher m_;
};

Acceptor from_expr(const Expr& e) {
  auto g = std::make_shared<Grammar>();
  const int32_t r = g->add_rule("root");
  EXPECT_TRUE(g->define(r, e).ok());
  auto f = g->finish(r);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return Acceptor(g);
}

Acceptor from_regex(const std::string& pattern, TextMode mode = TextMode::Raw, bool search = false) {
  auto g = std::make_shared<Grammar>();
  RegexOptions o;
  o.mode = mode;
  o.search = search;
  auto e = compile_regex(pattern, *g, o);
  EXPECT_TRUE(e.ok()) << pattern << ": " << (e.ok() ? "" : e.error().message);
  const int32_t r = g->add_rule("root");
  EXPECT_TRUE(g->define(r, e.ok() ? *e : Expr::lit("")).ok());
  EXPECT_TRUE(g->finish(r).ok());
  return Acceptor(g);
}

Result<Acceptor> from_schema(const std::string& schema_text, JsonSchemaOptions o = JsonSchemaOptions()) {
  auto g = std::make_shared<Grammar>();
  auto r = compile_json_schema(ojson::parse(schema_text), *g, o);
  if (!r) return r.error();
  KV_TRY(g->finish(*r));
  return Acceptor(g);
}

TEST(Grammar, LiteralsAlternativesAndRepetition) {
  auto a = from_expr(Expr::seq({Expr::lit("ab"), Expr::alt({Expr::lit("c"), Expr::lit("de")}),
                                Expr::repeat(Expr::lit("x"), 1, 3)}));
  EXPECT_TRUE(a("abcx"));
  EXPECT_TRUE(a("abdexxx"));
  EXPECT_FALSE(a("abdexxxx"));
  EXPECT_FALSE(a("abc"));
  EXPECT_FALSE(a("abx"));
  EXPECT_FALSE(a(""));
}

TEST(Grammar, UnboundedRepetitionKeepsOneState) {
  auto a = from_expr(Expr::seq({Expr::lit("\""), Expr::star(Expr::byte_range('a', 'z')), Expr::lit("\"")}));
  Matcher& m = a.matcher();
  int32_t s = m.step(m.start(), '"');
  const int32_t inside = m.step(s, 'a');
  for (int i = 0; i < 1000; ++i) s = m.step(s, uint8_t('a' + i % 26));
  EXPECT_EQ(s, inside) << "a tail call must not grow the stack";
  EXPECT_LT(m.state_count(), 8u);
  EXPECT_TRUE(a("\"hello\""));
  EXPECT_FALSE(a("\"Hello\""));
}

TEST(Grammar, RecursionAndLeftRecursionRefused) {
  auto g = std::make_shared<Grammar>();
  const int32_t p = g->add_rule("parens");
  ASSERT_TRUE(g->define(p, Expr::alt({Expr::seq({Expr::lit("("), Expr::rule(p), Expr::lit(")")}), Expr::lit("")})).ok());
  ASSERT_TRUE(g->finish(p).ok());
  Acceptor a(g);
  EXPECT_TRUE(a("((()))"));
  EXPECT_TRUE(a(""));
  EXPECT_FALSE(a("(()"));
  Grammar bad;
  const int32_t l = bad.add_rule("list");
  const int32_t n = bad.add_rule("nullable");
  ASSERT_TRUE(bad.define(n, Expr::alt({Expr::lit("x"), Expr::lit("")})).ok());
  ASSERT_TRUE(bad.define(l, Expr::alt({Expr::seq({Expr::rule(n), Expr::rule(l), Expr::lit("a")}), Expr::lit("a")})).ok());
  auto f = bad.finish(l);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("left-recursive"), std::string::npos) << f.error().message;
  Grammar undefined;
  const int32_t u = undefined.add_rule("u");
  EXPECT_FALSE(undefined.finish(u).ok());
}

TEST(Grammar, LimitsRefuseHugeRepetition) {
  Grammar g;
  const int32_t r = g.add_rule("r");
  auto d = g.define(r, Expr::repeat(Expr::lit("a"), 0, 1u << 20));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("repetition"), std::string::npos);
}

TEST(GrammarRegex, Basics) {
  struct Case {
    const char* pattern;
    std::vector<const char*> yes, no;
  };
  const Case cases[] = {
      {"abc", {"abc"}, {"ab", "abcd", ""}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"[a-c]+x?", {"a", "cbax", "bb"}, {"", "x", "ad"}},
      {"[^0-9]{2,3}", {"ab", "é!", "xyz"}, {"a", "a1", "abcd"}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"5551234", "55-1234"}},
      {"(?:ab)*c", {"c", "ababc"}, {"abc_", "aab"}},
      {"(?<year>\\d{4})-(\\d\\d)", {"2026-12"}, {"26-12"}},
      {"\\w+@\\w+\\.com", {"a_b@x.com"}, {"a@b.org"}},
      {".", {"a", "é", "\xF0\x9F\x98\x80"}, {"\n", "ab"}},
      {"\\u00e9|\\x41", {"é", "A"}, {"e"}},
      {"[\\s,]+", {" ,\t", "\xC2\xA0"}, {"a"}},
      {"a{2}b{1,}c{0,1}", {"aab", "aabbbc"}, {"ab", "aabcc"}},
  };
  for (const auto& c : cases) {
    auto a = from_regex(c.pattern);
    for (const char* s : c.yes) EXPECT_TRUE(a(s)) << c.pattern << " should match '" << s << "'";
    for (const char* s : c.no) EXPECT_FALSE(a(s)) << c.pattern << " should not match '" << s << "'";
  }
}

TEST(GrammarRegex, SearchAnchorsAndJsonSpelling) {
  auto a = from_regex("b+", TextMode::Raw, true);
  EXPECT_TRUE(a("abbc"));
  EXPECT_FALSE(a("ac"));
  auto anchored = from_regex("^a.*z$", TextMode::Raw, true);
  EXPECT_TRUE(anchored("abcz"));
  EXPECT_FALSE(anchored("xabcz"));
  // Inside a JSON string: the quote and the backslash and controls escaped.
  auto j = from_regex("[\"\\\\\\n]+", TextMode::JsonString);
  EXPECT_TRUE(j("\\\"\\\\\\n\\u000a"));
  EXPECT_FALSE(j("\""));
  EXPECT_FALSE(j("\n"));
}

TEST(GrammarRegex, UnsupportedConstructsNameThemselves) {
  Grammar g;
  for (const char* p : {"(?=a)b", "(a)\\1", "\\bword", "a)", "(a", "[a", "a{3,2}", "*a", "a$b"}) {
    auto e = compile_regex(p, g, RegexOptions());
    EXPECT_FALSE(e.ok()) << p;
    if (!e.ok()) {
      EXPECT_NE(e.error().message.find("regular expression"), std::string::npos);
    }
  }
}

TEST(GrammarCharset, Utf8SpellingIsExact) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    CharSet set;
    for (int k = 0; k < 3; ++k) {
      const uint32_t lo = rng() % 0x11000, hi = lo + rng() % 5000;
      set.add(lo, hi);
    }
    auto e = charset_expr(set, TextMode::Raw);
    ASSERT_TRUE(e.ok());
    auto a = from_expr(*e);
    for (int probe = 0; probe < 400; ++probe) {
      uint32_t c = rng() % 0x11000;
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      std::string s;
      if (c < 0x80) {
        s.push_back(char(c));
      } else if (c < 0x800) {
        s += char(0xC0 | (c >> 6));
        s += char(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        s += char(0xE0 | (c >> 12));
        s += char(0x80 | ((c >> 6) & 0x3F));
        s += char(0x80 | (c & 0x3F));
      } else {
        s += char(0xF0 | (c >> 18));
        s += char(0x80 | ((c >> 12) & 0x3F));
        s += char(0x80 | ((c >> 6) & 0x3F));
        s += char(0x80 | (c & 0x3F));
      }
      EXPECT_EQ(a(s), set.contains(c)) << "code point " << c;
    }
  }
  // Invalid UTF-8 is never accepted by "any character".
  auto any = from_expr(charset_expr(CharSet::any(), TextMode::Raw).value());
  for (const char* bad : {"\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF"}) EXPECT_FALSE(any(bad));
}

TEST(GrammarIntegers, RangesExhaustively) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges = {
      {0, 9},   {0, 10},    {1, 100},   {-5, 5},   {-120, -7}, {7, 2030}, {std::nullopt, -3},
      {13, std::nullopt},   {-250, std::nullopt}, {std::nullopt, 42}, {std::nullopt, std::nullopt},
      {99, 101}, {-1, -1}, {0, 0}};
  for (const auto& [lo, hi] : ranges) {
    auto a = from_expr(integer_range_expr(lo ? &*lo : nullptr, hi ? &*hi : nullptr));
    for (int64_t v = -400; v <= 2500; ++v) {
      const bool in = (!lo || v >= *lo) && (!hi || v <= *hi);
      ASSERT_EQ(a(std::to_string(v)), in) << v << " in [" << (lo ? std::to_string(*lo) : "-inf") << ", "
                                          << (hi ? std::to_string(*hi) : "inf") << "]";
    }
    EXPECT_FALSE(a("007"));
    EXPECT_FALSE(a("-0"));
    EXPECT_FALSE(a("1.0"));
  }
  const int64_t big_lo = -9000000000000000000LL, big_hi = 9000000000000000000LL;
  auto big = from_expr(integer_range_expr(&big_lo, &big_hi));
  EXPECT_TRUE(big("8999999999999999999"));
  EXPECT_FALSE(big("9000000000000000001"));
  EXPECT_TRUE(big("-9000000000000000000"));
  // Open ends stop at 18 digits.
  auto open = from_expr(integer_range_expr(nullptr, nullptr));
  EXPECT_TRUE(open("999999999999999999"));
  EXPECT_TRUE(open("-999999999999999999"));
  EXPECT_FALSE(open("1000000000000000000"));
}

TEST(GrammarJsonSchema, ObjectsInDeclaredOrder) {
  auto a = from_schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":2}},"required":["name","age"],"additionalProperties":false})");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_TRUE((*a)(R"({"name":"Ann","age":30})"));
  EXPECT_TRUE((*a)(R"({ "name": "Ann",  "age": 30, "tags": ["a", "b"] })"));
  EXPECT_TRUE((*a)("{\n  \"name\": \"A\\\"n\\u00e9\",\n  \"age\": 0\n}"));
  EXPECT_FALSE((*a)(R"({"name":"Ann"})"));
  EXPECT_FALSE((*a)(R"({"name":"Ann","age":-1})"));
  EXPECT_FALSE((*a)(R"({"name":"Ann","age":3,"tags":["a","b","c"]})"));
  EXPECT_FALSE((*a)(R"({"name":"Ann","age":3,"other":1})"));
  EXPECT_FALSE((*a)(R"({"age":3,"name":"Ann"})")) << "properties come in the declared order";
  EXPECT_FALSE((*a)(R"({"name":"Ann","age":3,})"));
}

TEST(GrammarJsonSchema, RefsEnumsAnyOfAndFormats) {
  auto a = from_schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"enum":["x",1,null]},
      "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_TRUE((*a)(R"({"v":"x","next":{"v":1,"next":{"v":null,"next":null}}})"));
  EXPECT_FALSE((*a)(R"({"v":"y","next":null})"));
  auto d = from_schema(R"({"type":"string","format":"date"})");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE((*d)("\"2026-12-05\""));
  EXPECT_FALSE((*d)("\"2026-13-05\""));
  auto any = from_schema("{}");
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE((*any)(R"([1,{"a":[true,false,null,-2.5e+3]},"s"])"));
  EXPECT_FALSE((*any)(R"([1,])"));
}

TEST(GrammarJsonSchema, UnsupportedKeywordsAreNamed) {
  auto a = from_schema(R"({"type":"object","properties":{"x":{"type":"number","multipleOf":3}},"minProperties":1})");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("'minProperties'"), std::string::npos) << a.error().message;
  auto b = from_schema(R"({"type":"object","properties":{"x":{"type":"number","multipleOf":3}}})");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("'multipleOf'"), std::string::npos) << b.error().message;
  EXPECT_NE(b.error().message.find("/properties/x"), std::string::npos) << b.error().message;
  JsonSchemaOptions lenient;
  lenient.lenient = true;
  EXPECT_TRUE(from_schema(R"({"type":"object","properties":{"x":{"type":"number","multipleOf":3}},"minProperties":1})", lenient).ok());
  EXPECT_FALSE(from_schema(R"({"$ref":"http://example.com/s.json"})").ok());
  EXPECT_FALSE(from_schema(R"({"$ref":"#/$defs/missing"})").ok());
  EXPECT_FALSE(from_schema(R"({"$ref":"#"})").ok()) << "a schema that is only itself is left-recursive";
  EXPECT_FALSE(from_schema(R"({"type":"strnig"})").ok());
  EXPECT_FALSE(from_schema(R"({"type":"integer","minimum":5,"maximum":4})").ok());
}

}  // namespace
}  // namespace kvant::grammar
