// Stop handling tests, no model: stop strings across piece boundaries
// (split inside UTF-8 characters too), overlapping and nested stop strings,
// hold-back and its release, and a randomised check that the output never
// depends on how the text is cut and never shows any part of a stop string;
// then the per-token StopMatcher with the tiny tokenizer.json fixture: stop
// ids and end-of-generation ids, max_tokens, outside finishes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "alloc_counter.h"
#include "engine/stop_matcher.h"
#include "tokenizer_test_util.h"

namespace kvant {
namespace {

using Stops = std::vector<std::string>;

struct Fed {
  std::string text;  // everything released
  int32_t matched = -1;
  std::vector<size_t> held;  // bytes held back after each piece
};

Fed feed(const Stops& stops, const std::vector<std::string>& pieces, bool finish = false) {
  StopStringMatcher m(stops);
  Fed f;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto r = m.push(pieces[i], finish && i + 1 == pieces.size());
    f.text += r.text;
    f.held.push_back(m.held_bytes());
    if (r.matched >= 0) {
      f.matched = r.matched;
      EXPECT_TRUE(m.done());
      EXPECT_TRUE(m.push("more text").text.empty());
      break;
    }
  }
  return f;
}

TEST(StopStrings, SplitAcrossTwoPieces) {
  const auto f = feed({"END"}, {"abcE", "ND tail"});
  EXPECT_EQ(f.text, "abc");
  EXPECT_EQ(f.matched, 0);
  EXPECT_EQ(f.held[0], 1u);  // "E" could begin "END"
}

TEST(StopStrings, SplitIntoSinglePieces) {
  const auto f = feed({"END"}, {"x", "E", "N", "D"});
  EXPECT_EQ(f.text, "x");
  EXPECT_EQ(f.matched, 0);
  EXPECT_EQ(f.held, (std::vector<size_t>{0, 1, 2, 0}));
}

TEST(StopStrings, DoubleNewline) {
  const auto f = feed({"\n\n"}, {"Hello\n", "\nWorld"});
  EXPECT_EQ(f.text, "Hello");
  EXPECT_EQ(f.matched, 0);
  const auto g = feed({"\n\n"}, {"a\nb\n", "c\n"});
  EXPECT_EQ(g.text, "a\nb\nc");  // the last newline is held: it may start "\n\n"
  EXPECT_EQ(g.matched, -1);
  EXPECT_EQ(g.held.back(), 1u);
}

TEST(StopStrings, HeldTextIsReleasedWhenItCannotStartAStop) {
  const auto f = feed({"END"}, {"E", "N", "x"});
  EXPECT_EQ(f.text, "ENx");
  EXPECT_EQ(f.matched, -1);
  EXPECT_EQ(f.held, (std::vector<size_t>{1, 2, 0}));
  // "EEND": the first E is released once the second shows it cannot start it.
  const auto g = feed({"END"}, {"E", "E", "N", "D"});
  EXPECT_EQ(g.text, "E");
  EXPECT_EQ(g.matched, 0);
  // A held tail goes out with the last piece.
  const auto h = feed({"END"}, {"abc", "EN"}, /*finish=*/true);
  EXPECT_EQ(h.text, "abcEN");
  EXPECT_EQ(h.held.back(), 0u);
}

TEST(StopStrings, PrefixesOfEachOther) {
  // "ab" always completes before "abc" can: it wins in either order.
  auto f = feed({"ab", "abc"}, {"xa", "bc"});
  EXPECT_EQ(f.text, "x");
  EXPECT_EQ(f.matched, 0);
  f = feed({"abc", "ab"}, {"xabcd"});
  EXPECT_EQ(f.text, "x");
  EXPECT_EQ(f.matched, 1);
  // Two ending at the same byte: the longer one is reported, so less is shown.
  f = feed({"bc", "abc"}, {"zab", "c"});
  EXPECT_EQ(f.text, "z");
  EXPECT_EQ(f.matched, 1);
  // The one that ends first wins, even if another began earlier.
  f = feed({"abcd", "bc"}, {"a", "bce"});
  EXPECT_EQ(f.text, "a");
  EXPECT_EQ(f.matched, 1);
  // Fallback through a failure link: "aab" in "aaab".
  f = feed({"aab"}, {"a", "a", "a", "b"});
  EXPECT_EQ(f.text, "a");
  EXPECT_EQ(f.matched, 0);
  // Duplicates report the first index; empty stop strings are ignored.
  f = feed({"", "zz", "zz"}, {"azzb"});
  EXPECT_EQ(f.text, "a");
  EXPECT_EQ(f.matched, 1);
}

TEST(StopStrings, NoStopStringsPassEverythingThrough) {
  const auto f = feed({}, {"a", "b\n\n", "c"});
  EXPECT_EQ(f.text, "ab\n\nc");
  EXPECT_EQ(f.held, (std::vector<size_t>{0, 0, 0}));
}

TEST(StopStrings, Utf8StopSplitInsideACodePoint) {
  // "é" is C3 A9; pieces cut between its two bytes.
  auto f = feed({"é!"}, {"caf\xC3", "\xA9", "! more"});
  EXPECT_EQ(f.text, "caf");
  EXPECT_EQ(f.matched, 0);
  EXPECT_EQ(f.held, (std::vector<size_t>{1, 2, 0}));
  // "è" (C3 A8) shares the lead byte: held, then released whole.
  f = feed({"é"}, {"caf\xC3", "\xA8 ok"});
  EXPECT_EQ(f.text, "caf\xC3\xA8 ok");
  EXPECT_EQ(f.matched, -1);
  // A three-character CJK stop string, 9 bytes, fed a byte at a time.
  const std::string stop = "終わり", text = "では終わります";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  f = feed({stop}, bytes);
  EXPECT_EQ(f.text, "では");
  EXPECT_EQ(f.matched, 0);
  // Emoji stop, 4 bytes, cut 1 + 3, after text whose last character shares
  // its first three bytes (U+1F600 vs U+1F601).
  f = feed({"\xF0\x9F\x98\x81"}, {"a\xF0\x9F\x98\x80", "b\xF0", "\x9F\x98\x81z"});
  EXPECT_EQ(f.text,
            "a\xF0\x9F\x98\x80"
            "b");
  EXPECT_EQ(f.matched, 0);
}

// What the stream should produce, found directly: the stop string that ends
// first (the longer of two ending together) and the text before it.
Fed reference(const Stops& stops, const std::string& text) {
  Fed r;
  r.text = text;
  for (size_t end = 1; end <= text.size(); ++end) {
    int32_t best = -1;
    for (size_t s = 0; s < stops.size(); ++s) {
      const auto& st = stops[s];
      if (st.empty() || st.size() > end || text.compare(end - st.size(), st.size(), st) != 0)
        continue;
      if (best < 0 || st.size() > stops[size_t(best)].size()) best = int32_t(s);
    }
    if (best >= 0) {
      r.matched = best;
      r.text = text.substr(0, end - stops[size_t(best)].size());
      return r;
    }
  }
  return r;
}

// The longest tail of `seen` that is a proper beginning of some stop string.
size_t reference_hold(const Stops& stops, const std::string& seen) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t n = std::min(s.size() - 1, seen.size()); n > hold; --n)
      if (seen.compare(seen.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

TEST(StopStrings, RandomCutsGiveTheSameAnswerAndNeverShowStopText) {
  std::mt19937 g(2024);
  const std::vector<std::string> alphabet = {"a", "b", "c", "\n", "é", "ab"};
  const std::vector<Stops> sets = {
      {"abc"},           {"ab", "abc"},      {"\n\n"}, {"aab", "ba"}, {"é\n", "cé", "b"},
      {"abcabd", "cab"}, {"\n\n", "\n\n\n"}, {"aaaa"}};
  for (int trial = 0; trial < 3000; ++trial) {
    const Stops& stops = sets[size_t(trial) % sets.size()];
    std::string text;
    const int len = 1 + int(g() % 30);
    for (int i = 0; i < len; ++i) text += alphabet[g() % alphabet.size()];
    const Fed want = reference(stops, text);

    // Random cut points, bytewise, so UTF-8 characters get split too.
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min(text.size() - i, size_t(g() % 5));
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    StopStringMatcher m(stops);
    std::string shown, seen;
    int32_t matched = -1;
    for (const auto& p : pieces) {
      const auto r = m.push(p);
      shown += r.text;
      seen += p;
      ASSERT_EQ(want.text.compare(0, shown.size(), shown), 0)
          << "shown text is not a prefix of the answer: " << shown;
      if (r.matched >= 0) {
        matched = r.matched;
        break;
      }
      // Hold back exactly what could still start a stop string.
      ASSERT_EQ(m.held_bytes(), reference_hold(stops, seen)) << "after " << seen;
      ASSERT_EQ(shown.size() + m.held_bytes(), seen.size());
    }
    if (matched < 0) shown += m.push("", /*last=*/true).text;
    ASSERT_EQ(matched, want.matched) << text;
    ASSERT_EQ(shown, want.text) << text;
    for (const auto& s : stops) ASSERT_EQ(shown.find(s), std::string::npos) << shown;
  }
}

// ---------------------------------------------------------------- params

TEST(StopParamsCheck, BadValuesAreNamed) {
  StopParams p;
  EXPECT_TRUE(check_stop_params(p).ok());
  p.stop = {"ok", ""};
  auto r = check_stop_params(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("stop[1]"), std::string::npos);
  p.stop = {std::string(kMaxStopStringBytes + 1, 'x')};
  EXPECT_FALSE(check_stop_params(p).ok());
  p.stop = Stops(kMaxStopStrings + 1, "x");
  EXPECT_FALSE(check_stop_params(p).ok());
  p.stop = {};
  p.stop_token_ids = {5, -1};
  r = check_stop_params(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("stop_token_ids[1]"), std::string::npos);
  p.stop_token_ids = {};
  p.max_tokens = -3;
  EXPECT_FALSE(check_stop_params(p).ok());
}

TEST(StopFinishReason, ApiNames) {
  EXPECT_EQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::Abort), "abort");
  EXPECT_EQ(finish_reason_name(FinishReason::Error), "error");
  EXPECT_EQ(finish_reason_name(FinishReason::None), "");
}

// ---------------------------------------------------------------- tokens

const Tokenizer& tiny() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::from_hf_json(testing::fixture_path("tokenizer/hf_tiny/tokenizer.json"));
    if (!r) ADD_FAILURE() << r.error().message;
    return std::move(r.value());
  }();
  return t;
}

struct Run {
  std::string text;
  StopMatcher::Step last;
  int32_t steps = 0;
};

Run run(const StopParams& p, const std::vector<int32_t>& ids) {
  StopMatcher m(p, tiny());
  Run r;
  for (int32_t id : ids) {
    r.last = m.step(id);
    r.text += r.last.text;
    ++r.steps;
    if (r.last.finish != FinishReason::None) {
      const auto again = m.step(id);
      EXPECT_TRUE(again.text.empty());
      EXPECT_EQ(again.finish, r.last.finish);
      break;
    }
  }
  if (r.last.finish == FinishReason::None) {
    r.last = m.finish(FinishReason::Length);  // the caller's context limit
    r.text += r.last.text;
  }
  return r;
}

std::vector<int32_t> ids_of(std::string_view text) { return tiny().encode(text, false, false); }

TEST(StopMatcherTokens, StopStringAcrossTokens) {
  const auto ids = ids_of("Hello world END of it");
  StopParams p;
  p.stop = {"D of"};
  const auto r = run(p, ids);
  EXPECT_EQ(r.text, "Hello world EN");
  EXPECT_EQ(r.last.finish, FinishReason::Stop);
  EXPECT_EQ(r.last.stop_string, 0);
  EXPECT_EQ(r.last.stop_token, -1);
  EXPECT_LT(r.steps, int32_t(ids.size()));
}

TEST(StopMatcherTokens, EndOfGenerationIdReleasesHeldText) {
  auto ids = ids_of("Hello E");
  const int32_t eog = tiny().eog_ids().front();
  ids.push_back(eog);
  ids.push_back(ids.front());  // never reached
  StopParams p;
  p.stop = {"END"};
  const auto r = run(p, ids);
  EXPECT_EQ(r.text, "Hello E");  // the held "E" comes out; the eog text never does
  EXPECT_EQ(r.last.finish, FinishReason::Stop);
  EXPECT_EQ(r.last.stop_token, eog);
  EXPECT_EQ(r.steps, int32_t(ids.size()) - 1);
}

TEST(StopMatcherTokens, StopTokenIdsAndIgnoreEos) {
  const auto ids = ids_of("one two three");
  StopParams p;
  p.stop_token_ids = {ids[1]};
  auto r = run(p, ids);
  EXPECT_EQ(r.text, tiny().decode(std::vector<int32_t>{ids[0]}));
  EXPECT_EQ(r.last.stop_token, ids[1]);

  auto with_eog = ids;
  with_eog.insert(with_eog.begin() + 1, tiny().eog_ids().front());
  StopParams q;
  q.ignore_eos = true;
  q.skip_special_tokens = true;
  r = run(q, with_eog);
  EXPECT_EQ(r.text, "one two three");  // the eog id neither stops nor shows
  EXPECT_EQ(r.last.finish, FinishReason::Length);
}

TEST(StopMatcherTokens, MaxTokensFinishesWithLength) {
  const auto ids = ids_of("alpha beta gamma delta");
  ASSERT_GE(ids.size(), 4u);
  StopParams p;
  p.max_tokens = 3;
  p.stop = {"gamma!"};  // "gamma" is held until the limit releases it
  StopMatcher m(p, tiny());
  std::string text;
  StopMatcher::Step s;
  for (size_t i = 0; i < 3; ++i) {
    s = m.step(ids[i]);
    text += s.text;
  }
  EXPECT_EQ(s.finish, FinishReason::Length);
  EXPECT_EQ(m.generated(), 3);
  EXPECT_EQ(text, tiny().decode(std::span(ids).first(3)));
}

TEST(StopMatcherTokens, StopOnTheLastAllowedTokenIsStop) {
  const auto ids = ids_of("ab cd");
  StopParams p;
  p.max_tokens = int32_t(ids.size());
  p.stop = {"cd"};
  const auto r = run(p, ids);
  EXPECT_EQ(r.text, "ab ");
  EXPECT_EQ(r.last.finish, FinishReason::Stop);
}

TEST(StopMatcherTokens, OutsideFinishReleasesHeldText) {
  const auto ids = ids_of("wait E");
  StopParams p;
  p.stop = {"END"};
  StopMatcher m(p, tiny());
  std::string text;
  for (int32_t id : ids) text += m.step(id).text;
  EXPECT_EQ(text, "wait ");
  const auto s = m.finish(FinishReason::Abort);
  EXPECT_EQ(s.text, "E");
  EXPECT_EQ(s.finish, FinishReason::Abort);
  EXPECT_EQ(m.finish(FinishReason::Error).finish, FinishReason::Abort);
}

TEST(StopMatcherTokens, MultiByteTextMatchesDecode) {
  const std::string text = "naïve café — 終わり 😀 done";
  const auto ids = ids_of(text);
  const auto r = run(StopParams{}, ids);
  EXPECT_EQ(r.text, text);
  StopParams p;
  p.stop = {"わ"};
  const auto s = run(p, ids);
  EXPECT_EQ(s.text, "naïve café — 終");
}

TEST(StopMatcherTokens, NoHeapAllocationPerStepOnceWarm) {
  // Short pieces: the decoder returns them in std::string's inline buffer.
  std::string text;
  for (int i = 0; i < 30; ++i) text += "one two three E\n";
  const auto ids = ids_of(text);
  StopParams p;
  p.stop = {"END", "\n\n", "two three four"};
  StopMatcher m(p, tiny());
  size_t i = 0;
  for (; i < 20; ++i) m.step(ids[i]);
  testing::AllocCounter allocs;
  for (; i < ids.size(); ++i) ASSERT_EQ(m.step(ids[i]).finish, FinishReason::None);
  EXPECT_EQ(allocs.count(), 0);
}

}  // namespace
}  // namespace kvant
