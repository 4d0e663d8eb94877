// The Jinja interpreter (tokenizer/jinja.h) and JinjaChatTemplate
// (tokenizer/chat_template.h): byte-equal output against transformers'
// renderings of real chat templates (tests/fixtures/jinja/cases.json, from
// tools/fixtures/gen_jinja.py), the same errors where a template raises,
// and the language features one by one (expected values from jinja2).
#include "tokenizer/jinja.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "tokenizer/chat_template.h"
#include "tokenizer_test_util.h"

namespace kvant {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Renders `tmpl` with `ctx`; an error comes back as "ERR: message".
std::string R(const std::string& tmpl, const ojson& ctx = ojson::object(),
              const jinja::Limits& limits = jinja::Limits()) {
  auto t = jinja::Template::parse(tmpl);
  if (!t.ok()) return "ERR: " + t.error().message;
  auto out = t->render(ctx, limits);
  return out.ok() ? *out : "ERR: " + out.error().message;
}

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(JinjaFixtures, MatchesTransformersRenderings) {
  const ojson fx = ojson::parse(read_text(testing::fixture_path("jinja/cases.json")));
  size_t checked = 0, texts = 0, errors = 0;
  std::map<std::string, std::pair<int, int>> table;  // template -> (passed, cases)
  for (const auto& [name, t] : fx["templates"].items()) {
    const std::string text =
        read_text(testing::fixture_path("jinja/templates/" + t["file"].get<std::string>()));
    auto tmpl = JinjaChatTemplate::parse(text);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.error().message;
    for (const auto& c : t["cases"]) {
      const ojson& conv = fx["conversations"][c["conversation"].get<std::string>()];
      JinjaChatInput in;
      in.messages = conv["messages"];
      if (conv.contains("tools")) in.tools = conv["tools"];
      in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      in.variables = t["special_tokens"];
      for (const auto& [k, v] : c["kwargs"].items()) in.variables[k] = v;
      const std::string what = name + " / " + c["conversation"].get<std::string>() +
                               " gen=" + (in.add_generation_prompt ? "1" : "0") + " " +
                               c["kwargs"].dump();
      auto got = tmpl->render(in);
      ++checked;
      ++table[name].second;
      if (c.contains("error")) {
        ++errors;
        const std::string want = c["error"].get<std::string>();
        if (got.ok()) {
          ADD_FAILURE() << what << " should fail with: " << want;
          continue;
        }
        EXPECT_TRUE(has(got.error().message, want))
            << what << "\n  expected: " << want << "\n  got: " << got.error().message;
        if (has(got.error().message, want)) ++table[name].first;
        continue;
      }
      ++texts;
      if (!got.ok()) {
        ADD_FAILURE() << what << ": " << got.error().message;
        continue;
      }
      EXPECT_EQ(*got, c["text"].get<std::string>()) << what;
      if (*got == c["text"].get<std::string>()) ++table[name].first;
    }
  }
  for (const auto& [name, pc] : table)
    std::printf("  %-20s %d/%d byte-equal\n", name.c_str(), pc.first, pc.second);
  EXPECT_EQ(fx["templates"].size(), 13u);
  EXPECT_GE(checked, 200u);
  EXPECT_GE(errors, 20u);
  EXPECT_GE(texts, 180u);
}

TEST(JinjaChat, OneTemplateRendersOnManyThreads) {
  auto t =
      JinjaChatTemplate::parse(read_text(testing::fixture_path("jinja/templates/glm5.3.jinja")));
  ASSERT_TRUE(t.ok());
  const ojson fx = ojson::parse(read_text(testing::fixture_path("jinja/cases.json")));
  JinjaChatInput in;
  in.messages = fx["conversations"]["parallel_tools"]["messages"];
  in.tools = fx["conversations"]["parallel_tools"]["tools"];
  auto want = t->render(in);
  ASSERT_TRUE(want.ok()) << want.error().message;
  std::vector<std::thread> threads;
  std::atomic<int> equal{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        auto got = t->render(in);
        if (got.ok() && *got == *want) ++equal;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(equal.load(), 200);
}

TEST(JinjaChat, PlainMessagesMatchTheNamedFormats) {
  // SmolLM2's template through the interpreter agrees with the built-in format.
  auto t =
      JinjaChatTemplate::parse(read_text(testing::fixture_path("jinja/templates/smollm2.jinja")));
  ASSERT_TRUE(t.ok());
  std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  auto a = t->render(msgs, true, "<|im_start|>", "<|im_end|>");
  auto b = render_chat(ChatFormat::Smollm2, msgs, true, "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_FALSE(t->render(std::span<const ChatMessage>(), true, "", "").ok());
}

TEST(JinjaChat, PreparesMessagesAsApplyChatTemplate) {
  auto t = JinjaChatTemplate::parse("{% for m in messages %}{{ m|tojson }};{% endfor %}");
  ASSERT_TRUE(t.ok());
  JinjaChatInput in;
  in.messages = ojson::parse(
      R"([{"role": "assistant", "content": "x", "tool_calls": null, "reasoning": "r"}])");
  auto out = t->render(in);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, R"({"thinking": "r", "role": "assistant", "content": "x", "reasoning": "r", )"
                  R"("reasoning_content": "r"};)");
  in.variables["messages"] = 1;
  EXPECT_FALSE(t->render(in).ok());
}

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it goes; neither touches {{ }}.
  EXPECT_EQ(R("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(R("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(R("a {%- if true -%} b {%- endif -%} c"), "abc");
  EXPECT_EQ(R("  {{ 1 }}  \n  {# c #}\n  z"), "  1  \n  z");
  EXPECT_EQ(R("{%+ if true %}x{% endif +%}\ny"), "x\ny");
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(R("{{- ' a ' -}}\n  {{ 'b' }}"), " a b");
  EXPECT_EQ(R("x\n{#- comment -#}\n  y"), "xy");
  EXPECT_EQ(R("{% raw %}{{ x }}{% endraw %}\nq"), "{{ x }}q");
  EXPECT_EQ(R("line\r\nnext\r\n"), "line\nnext");  // newlines normalized, one trailing dropped
  EXPECT_EQ(R("{% for m in [1,2] %}\n  {{- m }}\n{%- endfor %}"), "12");
}

TEST(Jinja, LiteralsAndPrinting) {
  EXPECT_EQ(R("{{ 1.0 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1/3 }}"),
            "1.0|1e+20|1e+16|1000000000000000.0|0.0001|1e-05|0.3333333333333333");
  EXPECT_EQ(R(R"({{ [1.5, none, true, "a\u00a0", "it's", 'q"', "\n\t\x01"] }})"),
            R"([1.5, None, True, 'a\xa0', "it's", 'q"', '\n\t\x01'])");
  EXPECT_EQ(R("{{ {'a': (1,)} }}{{ (1, 2) }}{{ () }}"), "{'a': (1,)}(1, 2)()");
  EXPECT_EQ(R("{{ 'a' 'b' }}{{ \"\\101\\x41\\u0041\" }}"), "abAAA");
  EXPECT_EQ(R("{{ 1_000 }}{{ 0x10 }}{{ 0b11 }}{{ 0o17 }}{{ 1.5e3 }}{{ 1E5 }}"),
            "1000163151500.0100000.0");
  EXPECT_EQ(R("{{ x }}|{{ none }}|{{ True }}|{{ false }}"), "|None|True|False");
  EXPECT_EQ(R("{{ {'a': 1}.items() }}"), "dict_items([('a', 1)])");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7 / 2 }}"),
            "3 -4 -2 1024 0.5 3.5");
  EXPECT_EQ(R("{{ -3 % 5 }}{{ 3.5 // 1 }}{{ -0.0 }}{{ 1e300 * 1e10 }}"), "23.0-0.0inf");
  EXPECT_EQ(R("{{ 'a' * 3 }}{{ [1] * 2 }}{{ (1, 2) + (3,) }}{{ 'x' ~ none ~ 1.5 ~ [1] }}"),
            "aaa[1, 1](1, 2, 3)xNone1.5[1]");
  EXPECT_EQ(R("{{ -2 ** 2 }}{{ 2 ** 3 ** 2 }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}"), "464TrueFalse");
  EXPECT_EQ(
      R("{{ [1] == (1,) }}{{ 1 == 1.0 }}{{ true == 1 }}{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}"),
      "FalseTrueTrueTrue");
  EXPECT_EQ(R("{{ 1 if 0 else 2 if 1 else 3 }}{{ not 1 == 2 }}{{ 0 or 'x' }}{{ 1 and [] }}"),
            "2Truex[]");
  EXPECT_EQ(
      R("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}{{ 1 in x }}"),
      "TrueTrueTrueTrueFalse");
  EXPECT_EQ(R("{{ '%s=%r' % ('a', 'b') }}|{{ '%5.2f|%-4d|%03d' % (3.14159, 7, 5) }}"),
            "a='b'| 3.14|7   |005");
  EXPECT_EQ(R("{{ 1 + 'a' }}"),
            "ERR: unsupported operand type(s) for +: 'int' and 'str' (template line 1)");
  EXPECT_TRUE(has(R("{{ 'a' < 1 }}"), "'<' not supported between instances of 'str' and 'int'"));
  EXPECT_TRUE(has(R("{{ 5 / 0 }}"), "division by zero"));
  EXPECT_TRUE(has(R("{{ 'a' in none }}"), "argument of type 'NoneType' is not iterable"));
  EXPECT_TRUE(
      has(R("{{ 10 ** 20 }}"), "integer overflow"));  // Python ints are unbounded; ours are 64-bit
}

TEST(Jinja, AttributesItemsAndSlices) {
  const ojson ctx =
      ojson::parse(R"({"m": [{"role": "user", "content": "héllo"}], "d": {"items": 1}})");
  EXPECT_EQ(
      R("{{ m[0].role }}{{ m.0['role'] }}{{ m[-1].content[1:3] }}{{ m[0].content[-1] }}", ctx),
      "useruserélo");
  EXPECT_EQ(R("{{ [1, 2, 3][::-1] }}{{ 'abcdef'[::2] }}{{ [1, 2, 3][5:1:-1] }}{{ 'abc'[5] }}"),
            "[3, 2, 1]ace[3]");
  EXPECT_EQ(R("{{ d['items'] }}{{ d.items is defined }}{{ m[0].nope is defined }}", ctx),
            "1TrueFalse");
  EXPECT_EQ(R("{{ x.y }}"), "ERR: 'x' is undefined (template line 1)");
  EXPECT_EQ(R("{{ {}.x.y }}"), "ERR: 'dict object' has no attribute 'x' (template line 1)");
  EXPECT_EQ(R("{{ none.x }}|{{ [1][5] }}"), "|");
  // The sandbox: list and dict methods that would change them are unsafe.
  EXPECT_TRUE(has(R("{% set x = [1] %}{% set _ = x.append(2) %}"),
                  "access to attribute 'append' of 'list' object is unsafe."));
  EXPECT_TRUE(
      has(R("{{ {}.update({}) }}"), "access to attribute 'update' of 'dict' object is unsafe."));
  EXPECT_EQ(R("{{ [].append }}"), "");  // unsafe, but only fails when used
}

TEST(Jinja, ForLoops) {
  EXPECT_EQ(
      R("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}{{ loop.last }}{{ loop.length }}"
        "{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}"),
      "1False224;2True212;");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(R("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% "
              "endfor %}"),
            "ba[h][é]");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "1");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(R("{% for x in 'ab' %}{{ loop.cycle('o', 'e') }}{{ loop.changed(x) }}{% endfor %}"),
            "oTrueeTrue");
  // Each iteration starts from the outer scope; nothing set inside leaks out.
  EXPECT_EQ(R("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor "
              "%}{{ x }}"),
            "01,01,01,0");
  EXPECT_TRUE(has(R("{% for a, b in [(1, 2, 3)] %}{% endfor %}"),
                  "too many values to unpack (expected 2)"));
  EXPECT_TRUE(has(R("{% for x in 3 %}{% endfor %}"), "'int' object is not iterable"));
  EXPECT_TRUE(has(R("{% break %}"), "outside of a loop"));
}

TEST(Jinja, SetNamespaceAndScopes) {
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(R("{% if true %}{% set z = 5 %}{% endif %}{{ z }}"), "5");
  EXPECT_EQ(R("{% set ns = namespace(a=1, l=[]) %}{% for i in [1, 2] %}{% set ns.a = ns.a + i %}"
              "{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.a }}{{ ns.l }}"),
            "4[1, 2]");
  EXPECT_EQ(R("{% set x %}hi {{ 1 }}{% endset %}[{{ x }}]{% set y | upper %}yo{% endset %}{{ y }}"),
            "[hi 1]YO");
  EXPECT_EQ(R("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_TRUE(has(R("{% set ns = namespace(_a=1) %}"), "underscore-prefixed"));
  EXPECT_TRUE(has(R("{% set x = 1 %}{% set x.y = 2 %}"), "non-namespace"));
}

TEST(Jinja, Macros) {
  EXPECT_EQ(R("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}"
              "{{ m(1) }}|{{ m(1, 3, 4, c=5) }}"),
            "12(){}|13(4,){'c': 5}");
  // Late binding: a macro sees the variables of its scope when it is called.
  EXPECT_EQ(
      R("{% macro m() %}{{ y }}{% endmacro %}{% set y = 1 %}{{ m() }}{% set y = 2 %}{{ m() }}"),
      "12");
  EXPECT_EQ(
      R("{% macro m(x) %}<{{ caller() }}{{ x }}>{% endmacro %}{% call m(1) %}body{% endcall %}"),
      "<body1>");
  EXPECT_EQ(
      R("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"),
      "321");
  EXPECT_EQ(R("{% macro m() %}x{% endmacro %}{{ m() + '!' }}{{ m() is string }}"), "x!True");
  EXPECT_TRUE(has(R("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
                  "macro 'm' takes not more than 1 argument(s)"));
  EXPECT_TRUE(has(R("{% for i in [1] %}{% macro m() %}{% endmacro %}{% endfor %}{{ m() }}"),
                  "'m' is undefined"));
}

TEST(Jinja, Filters) {
  EXPECT_EQ(R("{{ '  x  '|trim }}|{{ 'xyx'|trim('x') }}|{{ 'hello world'|title }}|{{ "
              "'hELLO'|capitalize }}"),
            "x|y|Hello World|Hello");
  EXPECT_EQ(R("{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ {'b':1,'a':2}|dictsort }}"),
            "[1, 2, 3]['A', 'a', 'b'][('a', 2), ('b', 1)]");
  EXPECT_EQ(R("{{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}{{ [3, 1]|sort(reverse=true) }}"),
            "[{'a': 1}, {'a': 2}][3, 1]");
  EXPECT_EQ(
      R("{{ [1,2,3]|map('string')|join(',') }}{{ [{'a':1},{'b':2}]|map(attribute='a')|list }}"),
      "1,2,3[1, Undefined]");
  EXPECT_EQ(R("{{ [1,2,3]|select('odd')|list }}{{ [1,2,3]|reject('odd')|list }}"
              "{{ [{'a':1},{'a':0}]|selectattr('a')|list }}{{ [1,2,3]|select('>', 1)|list }}"),
            "[1, 3][2][{'a': 1}][2, 3]");
  EXPECT_EQ(R("{{ ['a','A','b']|unique|list }}{{ [1, 2]|first }}{{ 'ab'|last }}{{ [5,3]|max }}"
              "{{ [5,3]|min }}{{ [1,2]|sum }}"),
            "['a', 'b']1b533");
  EXPECT_EQ(R("{{ 'a\\nb\\n'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent }}"),
            "a\n  b\n|  a\n  b|a\n\n    b");
  EXPECT_EQ(R("{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 2.4|round(0, 'ceil') }}{{ "
              "5|round }}"),
            "2.04.02.673.05");
  EXPECT_EQ(R("{{ '42'|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ 3.9|int }}{{ '0x1A'|int(base=16) }}{{ "
              "'3'|float }}"),
            "42403263.0");
  EXPECT_EQ(R("{{ x|default('d') }}{{ ''|default('e', true) }}{{ none|d('n') }}{{ [1,2]|length }}"
              "{{ 'héllo'|length }}"),
            "deNone25");
  EXPECT_EQ(R("{{ 'Hello'|replace('l', 'L') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ 'abc'|reverse }}"
              "{{ [1, 2]|reverse|list }}{{ 'a b c'|wordcount }}{{ 'a'|center(5) }}|"),
            "HeLLobbacba[2, 1]3  a  |");
  EXPECT_EQ(R("{{ [1,2,3,4,5]|batch(2)|list }}{{ 'ab'|list }}{{ {'a': 1}|items|list }}"),
            "[[1, 2], [3, 4], [5]]['a', 'b'][('a', 1)]");
  EXPECT_EQ(R("{{ '<a>'|e }}{{ '<a>'|safe }}{{ ('<a>'|safe) + '<b>' }}{{ 3|string + 'x' }}"),
            "&lt;a&gt;<a><a>&lt;b&gt;3x");
  // Generators, as in jinja2: no len() until |list.
  EXPECT_TRUE(has(R("{{ [1,2]|unique|length }}"), "object of type 'generator' has no len()"));
  EXPECT_EQ(R("{{ 1 | nosuch }}").rfind("ERR: jinja template syntax error at line 1", 0), 0u);
  EXPECT_EQ(R("{% if false %}{{ 1 | nosuch }}{% endif %}ok"),
            "ok");  // checked when run, as jinja2 does
}

TEST(Jinja, ToJsonIsTransformersJsonDumps) {
  EXPECT_EQ(R("{{ {'a': [1, 2.5, 'é\\n', none, true]}|tojson }}"),
            R"({"a": [1, 2.5, "é\n", null, true]})");
  EXPECT_EQ(R("{{ {'a': {'b': []}, 'c': {}}|tojson(indent=2) }}"),
            "{\n  \"a\": {\n    \"b\": []\n  },\n  \"c\": {}\n}");
  EXPECT_EQ(R("{{ 'é😀'|tojson(ensure_ascii=true) }}{{ [1,2]|tojson(separators=(',', ':')) }}"),
            R"("\u00e9\ud83d\ude00"[1,2])");
  EXPECT_EQ(R("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ {1: 'a', none: 'c'}|tojson }}"),
            R"({"a": 2, "b": 1}{"1": "a", "null": "c"})");
  EXPECT_EQ(R("{{ 1.0|tojson }}{{ 1e100|tojson }}{{ [1]|tojson(indent='\\t') }}"),
            "1.01e+100[\n\t1\n]");
  // Objects keep the order they were given in.
  EXPECT_EQ(R("{{ t|tojson }}", ojson::parse(R"({"t": {"z": 1, "a": {"y": 2, "b": 3}}})")),
            R"({"z": 1, "a": {"y": 2, "b": 3}})");
  EXPECT_TRUE(has(R("{{ x|tojson }}"), "Object of type Undefined is not JSON serializable"));
}

TEST(Jinja, TestsAndStringMethods) {
  EXPECT_EQ(R("{{ x is undefined }}{{ none is none }}{{ 1 is number }}{{ true is number }}"
              "{{ 'a' is sequence }}{{ {} is sequence }}{{ x is iterable }}{{ 1 is iterable }}"),
            "TrueTrueTrueTrueTrueTrueTrueFalse");
  EXPECT_EQ(
      R("{{ 1 is divisibleby 3 }}{{ 9 is divisibleby(3) }}{{ 3 is odd }}{{ 'abc' is lower }}"
        "{{ 'a' is in 'abc' }}{{ 'x' is equalto 'x' }}{{ 1 is sameas 1 }}{{ 'x' is string }}"),
      "FalseTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(R("{{ 'a b  c'.split() }}{{ 'a,b'.split(',') }}{{ 'a-b-c'.rsplit('-', 1) }}"
              "{{ ' x '.strip() }}{{ 'xxaxx'.strip('x') }}"),
            "['a', 'b', 'c']['a', 'b']['a-b', 'c']xa");
  EXPECT_EQ(R("{{ 'héllo wörld'.title() }}{{ 'ÉCOLE straße'.lower() }}{{ 'straße'.upper() }}"),
            "Héllo Wörldécole straßeSTRASSE");
  EXPECT_EQ(R("{{ 'x'.startswith(('a', 'x')) }}{{ 'abc'.endswith('bc') }}{{ 'héllo'.find('l') }}"
              "{{ 'abc'.count('b') }}{{ 'a\\nb\\r\\nc'.splitlines() }}"),
            "TrueTrue21['a', 'b', 'c']");
  EXPECT_EQ(
      R("{{ '{0}-{1}-{x}'.format(1, 2, x=3) }}{{ '{:>5}|{:.2f}|{:05d}'.format('a', 2.5, 42) }}"),
      "1-2-3    a|2.50|00042");
  EXPECT_EQ(R("{{ '-'.join(['a', 'b']) }}{{ {'a': 1}.get('b', 2) }}{{ [1,2,1].count(1) }}"),
            "a-b22");
}

TEST(Jinja, GlobalsAndRaiseException) {
  EXPECT_EQ(R("{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}"),
            "[0, 1, 2][1, 4, 7][5, 3, 1]");
  EXPECT_EQ(R("{{ dict(a=1, b=2) }}{{ dict([('x', 1)]) }}"), "{'a': 1, 'b': 2}{'x': 1}");
  EXPECT_EQ(R("{% set j = joiner('|') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %}"),
            "a|b|c");
  EXPECT_EQ(R("x\n{{ raise_exception('Roles must alternate') }}"),
            "ERR: Roles must alternate (template line 2)");
  EXPECT_TRUE(has(R("{{ range(1000000) }}"), "Range too big"));
  const std::string year = R("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(
      R("ok\n{{ }}"),
      "ERR: jinja template syntax error at line 2, column 4: Expected an expression, got end of "
      "print statement");
  EXPECT_EQ(
      R("a\nb\n  {% if x %}\n{% endfor %}"),
      "ERR: jinja template syntax error at line 4, column 4: Encountered unknown tag 'endfor'.");
  EXPECT_TRUE(has(R("{% if x %}"),
                  "line 1, column 11: unexpected end of template, expected 'elif' or "
                  "'else' or 'endif' to close 'if'"));
  EXPECT_TRUE(has(R("{{ (1 }}"), "line 1, column 7: unexpected '}', expected ')'"));
  EXPECT_TRUE(has(R("{{ 'abc }}"), "unexpected char '''"));
  EXPECT_TRUE(has(R("{% do x %}"), "Encountered unknown tag 'do'."));
  EXPECT_TRUE(has(R("{% include 'x' %}"), "not supported"));
  EXPECT_TRUE(has(R("{# open"), "Missing end of comment tag"));
  EXPECT_TRUE(has(R("{{ 1 is nosuch }}"), "No test named 'nosuch'."));
}

TEST(Jinja, LimitsStopHostileTemplates) {
  jinja::Limits small;
  small.max_output_bytes = 1000;
  EXPECT_TRUE(has(R("{% for i in range(100) %}{{ 'x' * 20 }}{% endfor %}", {}, small),
                  "template output larger than 1000 bytes"));
  EXPECT_TRUE(has(R("{{ 'x' * 100000 }}", {}, small), "larger than 1000 bytes"));
  EXPECT_TRUE(
      has(R("{% set ns = namespace(s='x') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
            "{% endfor %}",
            {}, small),
          "larger than 1000 bytes"));
  jinja::Limits work;
  work.max_work = 10000;
  EXPECT_TRUE(has(R("{% for i in range(100) %}{% for j in range(100) %}{% for k in range(100) %}"
                    "{% endfor %}{% endfor %}{% endfor %}",
                    {}, work),
                  "work budget exhausted"));
  // Unbounded recursion and deep nesting stop with an error, not a crash.
  EXPECT_TRUE(has(R("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), "nesting too deep"));
  EXPECT_TRUE(has(R("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                  "nested too deeply"));
  EXPECT_TRUE(
      has(R("{{ " + std::string(300, '[') + std::string(300, ']') + " }}"), "nested too deeply"));
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "{% if true %}";
  for (int i = 0; i < 300; ++i) deep += "{% endif %}";
  EXPECT_TRUE(has(R(deep), "nested too deeply"));
}

TEST(Jinja, CallBlocksGenerationAndUnsupportedFilters) {
  EXPECT_EQ(R("{% macro list(xs) %}{% for x in xs %}[{{ caller(x) }}]{% endfor %}{% endmacro %}"
              "{% call(item) list([1, 2]) %}<{{ item }}>{% endcall %}"),
            "[<1>][<2>]");
  EXPECT_EQ(R("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
  EXPECT_EQ(R("{% if false %}{{ x|groupby('a') }}{% endif %}ok"), "ok");
  EXPECT_TRUE(has(R("{{ [1]|groupby('a') }}"), "the jinja2 filter 'groupby' is not supported"));
}

TEST(Jinja, CyclesAndDeepDataAreSafe) {
  // A namespace holding itself prints without recursing forever.
  EXPECT_TRUE(has(R("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}"), "recursion"));
  // A bound loop.changed outlives its loop.
  EXPECT_EQ(R("{% set ns = namespace(f=none) %}{% for i in [1] %}{% set ns.f = loop.changed %}"
              "{% endfor %}{{ ns.f(1) }}{{ ns.f(1) }}"),
            "TrueFalse");
  EXPECT_TRUE(
      has(R("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}"
            "{% endfor %}"),
          "data nested too deeply"));
  ojson deep = ojson::array();
  for (int i = 0; i < 1000; ++i) deep = ojson::array({deep});
  EXPECT_TRUE(has(R("{{ x }}", ojson{{"x", deep}}), "nested too deeply"));
  // A long chain of namespaces is released without deep recursion.
  EXPECT_EQ(
      R("{% set ns = namespace(p=none) %}{% for i in range(50000) %}{% set n = namespace() %}"
        "{% set n.next = ns.p %}{% set ns.p = n %}{% endfor %}{{ ns.p.next.next is defined }}"),
      "True");
}

// Runs fn on a thread with a 1 MiB stack (a render at the depth limit
// needs about 256 KiB in a release build): hostile templates must fail with
// an error well within it. Sanitizers make frames several times larger.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kSmallStack = size_t(16) << 20;
#else
constexpr size_t kSmallStack = size_t(1) << 20;
#endif
void on_small_stack(std::function<void()> fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kSmallStack);
  pthread_t th;
  auto run = [](void* p) -> void* {
    (*static_cast<std::function<void()>*>(p))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, run, &fn), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(Jinja, HostileTemplatesFitInASmallStack) {
  std::vector<std::string> results;
  on_small_stack([&] {
    results.push_back(R("{{ " + std::string(100000, '-') + "1 }}"));
    std::string sum = "{{ 1";
    for (int i = 0; i < 50000; ++i) sum += "+1";
    results.push_back(R(sum + " }}"));
    std::string cond = "{{ 1";
    for (int i = 0; i < 20000; ++i) cond += " if 1 else 1";
    results.push_back(R(cond + " }}"));
    results.push_back(R("{{ x" + std::string(50000, '.') + " }}"));
    std::string attrs = "{{ x";
    for (int i = 0; i < 50000; ++i) attrs += ".a";
    results.push_back(R(attrs + " }}"));
    results.push_back(
        R("{% macro f(n) %}{% for i in [1] %}{% if true %}{{ f(n + 1)|trim }}{% endif %}"
          "{% endfor %}{% endmacro %}{{ f(0) }}"));
  });
  ASSERT_EQ(results.size(), 6u);
  for (const std::string& r : results) EXPECT_EQ(r.rfind("ERR: ", 0), 0u) << r.substr(0, 200);
}

}  // namespace
}  // namespace kvant
