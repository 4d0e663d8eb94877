// StepInputs encoding tests, no model: a request with every field away from
// its default comes back bit for bit (negative zero, a subnormal, stop
// strings with NUL bytes and UTF-8), without its callback; empty and mixed
// messages; every truncation of a valid message, bytes after it, another
// magic or version and corrupt counts or bools are errors; single-byte
// corruptions anywhere never crash.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "engine/request_codec.h"

namespace kvant {
namespace {

using Bytes = std::vector<std::byte>;

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// The fields in which two requests differ (floats compared as bits), and
// how many fields were compared. Every struct is taken apart by name, so a
// field added to one stops this compiling until it is compared here (and
// given a non-default value in full_request()).
struct Diff {
  std::vector<std::string> differ;
  size_t fields = 0;
  void field(const char* name, bool same) {
    ++fields;
    if (!same) differ.push_back(name);
  }
};

void compare(const SamplingParams& a, const SamplingParams& b, Diff& d) {
  const auto& [temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
               frequency_penalty, seed, top_logprobs, logit_bias] = a;
  d.field("sampling.temperature", same_bits(temperature, b.temperature));
  d.field("sampling.top_k", top_k == b.top_k);
  d.field("sampling.top_p", same_bits(top_p, b.top_p));
  d.field("sampling.min_p", same_bits(min_p, b.min_p));
  d.field("sampling.repetition_penalty", same_bits(repetition_penalty, b.repetition_penalty));
  d.field("sampling.presence_penalty", same_bits(presence_penalty, b.presence_penalty));
  d.field("sampling.frequency_penalty", same_bits(frequency_penalty, b.frequency_penalty));
  d.field("sampling.seed", seed == b.seed);
  d.field("sampling.top_logprobs", top_logprobs == b.top_logprobs);
  bool same_bias = logit_bias.size() == b.logit_bias.size();
  for (size_t i = 0; same_bias && i < logit_bias.size(); ++i)
    same_bias = logit_bias[i].first == b.logit_bias[i].first &&
                same_bits(logit_bias[i].second, b.logit_bias[i].second);
  d.field("sampling.logit_bias", same_bias);
}

void compare(const StopParams& a, const StopParams& b, Diff& d) {
  const auto& [stop, stop_token_ids, ignore_eos, max_tokens, skip_special_tokens] = a;
  d.field("stop.stop", stop == b.stop);
  d.field("stop.stop_token_ids", stop_token_ids == b.stop_token_ids);
  d.field("stop.ignore_eos", ignore_eos == b.ignore_eos);
  d.field("stop.max_tokens", max_tokens == b.max_tokens);
  d.field("stop.skip_special_tokens", skip_special_tokens == b.skip_special_tokens);
}

Diff compare(const Request& a, const Request& b) {
  const auto& [prompt, sampling, stop, logprobs, prompt_logprobs, prompt_logprobs_from,
               prompt_only, handoff, constraint, speculative, on_event] = a;
  (void)on_event;  // not carried: checked apart
  (void)constraint;  // not carried: distributed engines refuse constrained requests
  Diff d;
  d.field("prompt", prompt == b.prompt);
  compare(sampling, b.sampling, d);
  compare(stop, b.stop, d);
  d.field("logprobs", logprobs == b.logprobs);
  d.field("prompt_logprobs", prompt_logprobs == b.prompt_logprobs);
  d.field("prompt_logprobs_from", prompt_logprobs_from == b.prompt_logprobs_from);
  d.field("prompt_only", prompt_only == b.prompt_only);
  d.field("handoff", handoff == b.handoff);
  d.field("speculative.num_tokens", speculative.num_tokens == b.speculative.num_tokens);
  d.field("speculative.min_ngram", speculative.min_ngram == b.speculative.min_ngram);
  d.field("speculative.max_ngram", speculative.max_ngram == b.speculative.max_ngram);
  d.field("speculative.method", speculative.method == b.speculative.method);
  return d;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Every field away from its default, with values whose bytes are easy to
// get wrong: sign bits, 64-bit values past 32 bits, negative zero, a
// subnormal, floats one ulp apart, NUL bytes and multi-byte UTF-8.
Request full_request() {
  Request q;
  q.prompt = {1, 0, 42, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
              -1};
  q.sampling.temperature = 0.1f;
  q.sampling.top_k = 40;
  q.sampling.top_p = std::nextafter(0.9f, 1.f);
  q.sampling.min_p = -0.0f;
  q.sampling.repetition_penalty = 1.1f;
  q.sampling.presence_penalty = -1.5f;
  q.sampling.frequency_penalty = std::numeric_limits<float>::denorm_min();
  q.sampling.seed = 0xFEDCBA9876543210ull;
  q.sampling.top_logprobs = 5;
  q.sampling.logit_bias = {{70000, -0.0f}, {3, 100.f}};
  q.stop.stop = {"END", std::string("a\0b", 3), "\xE2\x9C\x93 \xF0\x9F\x98\x80 \xC3\xA9",
                 std::string(300, 'x'), "", std::string(1, '\0')};
  q.stop.stop_token_ids = {2, 128001, 0};
  q.stop.ignore_eos = true;
  q.stop.max_tokens = -77;
  q.stop.skip_special_tokens = false;
  q.logprobs = true;
  q.prompt_logprobs = 3;
  q.prompt_logprobs_from = (int64_t(1) << 40) + 1;
  q.prompt_only = true;
  q.handoff = true;
  q.speculative = {7, 3, 9, SpecMethod::kMtp};
  q.on_event = [](const RequestEvent&) {};
  return q;
}

StepInputs mixed_inputs() {
  StepInputs in;
  in.seq = 0x0123456789ABCDEFull;
  in.submitted.emplace_back(1, full_request());
  in.submitted.emplace_back(7, Request{});
  Request long_prompt;
  long_prompt.prompt.resize(1000);
  for (size_t i = 0; i < long_prompt.prompt.size(); ++i) long_prompt.prompt[i] = int32_t(i * 7919);
  long_prompt.prompt_only = true;
  in.submitted.emplace_back(std::numeric_limits<RequestId>::max(), long_prompt);
  in.cancelled = {3, 0, std::numeric_limits<RequestId>::max()};
  in.shutdown = true;
  return in;
}

void expect_same(const StepInputs& a, const StepInputs& b) {
  const auto& [seq, submitted, cancelled, shutdown] = a;
  EXPECT_EQ(seq, b.seq);
  ASSERT_EQ(submitted.size(), b.submitted.size());
  for (size_t i = 0; i < submitted.size(); ++i) {
    EXPECT_EQ(submitted[i].first, b.submitted[i].first) << "request " << i;
    const Diff d = compare(submitted[i].second, b.submitted[i].second);
    EXPECT_TRUE(d.differ.empty()) << "request " << i << " differs in " << joined(d.differ);
  }
  EXPECT_EQ(cancelled, b.cancelled);
  EXPECT_EQ(shutdown, b.shutdown);
}

// Encodes, decodes, compares, and checks that the decoded message encodes
// to the same bytes.
StepInputs round_trip(const StepInputs& in) {
  const Bytes bytes = encode_step_inputs(in);
  auto out = decode_step_inputs(bytes);
  EXPECT_TRUE(out.ok()) << out.error().message;
  if (!out.ok()) return {};
  expect_same(*out, in);
  EXPECT_EQ(encode_step_inputs(*out), bytes);
  return std::move(out).value();
}

void put_u32(Bytes& b, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) b[at + i] = std::byte((v >> (8 * i)) & 0xFF);
}

std::string error_of(const Bytes& b) {
  const auto r = decode_step_inputs(b);
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string() : r.error().message;
}

// Byte offsets in a message: header (magic, version), then seq.
constexpr size_t kSubmittedCount = 13;  // after "KVSI", version, u64 seq
constexpr size_t kFirstPromptCount = kSubmittedCount + 4 + 8;  // after the count, the first id

TEST(RequestCodec, FullRequestSetsEveryField) {
  const Diff d = compare(full_request(), Request{});
  // Every field differs from its default, or the round trip below would
  // not show that the field is carried.
  EXPECT_EQ(d.differ.size(), d.fields) << "fields compared: " << d.fields
                                       << ", differing: " << joined(d.differ);
  EXPECT_EQ(d.fields, 25u);
}

TEST(RequestCodec, RoundTripsEveryField) {
  StepInputs in;
  in.seq = 5;
  in.submitted.emplace_back(42, full_request());
  const StepInputs out = round_trip(in);
  ASSERT_EQ(out.submitted.size(), 1u);
  EXPECT_FALSE(out.submitted[0].second.on_event);  // the callback stays behind
  const Request& q = out.submitted[0].second;
  EXPECT_TRUE(std::signbit(q.sampling.min_p));
  EXPECT_EQ(q.sampling.frequency_penalty, std::numeric_limits<float>::denorm_min());
  ASSERT_EQ(q.sampling.logit_bias.size(), 2u);
  EXPECT_TRUE(std::signbit(q.sampling.logit_bias[0].second));
  ASSERT_EQ(q.stop.stop.size(), 6u);
  EXPECT_EQ(q.stop.stop[1].size(), 3u);
  EXPECT_EQ(q.stop.stop[1][1], '\0');
  EXPECT_EQ(q.stop.stop[2], "\xE2\x9C\x93 \xF0\x9F\x98\x80 \xC3\xA9");
  EXPECT_EQ(q.stop.stop[3].size(), 300u);
}

TEST(RequestCodec, EmptyMessage) {
  const Bytes b = encode_step_inputs(StepInputs{});
  // Header, seq, two empty counts, shutdown.
  ASSERT_EQ(b.size(), 5u + 8 + 4 + 4 + 1);
  EXPECT_EQ(b[0], std::byte('K'));
  EXPECT_EQ(b[1], std::byte('V'));
  EXPECT_EQ(b[2], std::byte('S'));
  EXPECT_EQ(b[3], std::byte('I'));
  EXPECT_EQ(b[4], std::byte(kStepInputsVersion));
  const StepInputs out = round_trip(StepInputs{});
  EXPECT_TRUE(out.submitted.empty());
  EXPECT_TRUE(out.cancelled.empty());
  EXPECT_FALSE(out.shutdown);
}

TEST(RequestCodec, LittleEndianSeq) {
  StepInputs in;
  in.seq = 0x0102030405060708ull;
  const Bytes b = encode_step_inputs(in);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(b[5 + i], std::byte(8 - i)) << "byte " << i;
}

TEST(RequestCodec, SeveralRequestsCancelsAndShutdown) {
  const StepInputs out = round_trip(mixed_inputs());
  ASSERT_EQ(out.submitted.size(), 3u);
  EXPECT_EQ(out.submitted[2].first, std::numeric_limits<RequestId>::max());
  EXPECT_EQ(out.submitted[2].second.prompt.size(), 1000u);
  EXPECT_TRUE(out.shutdown);
}

TEST(RequestCodec, EveryTruncationIsAnError) {
  const Bytes b = encode_step_inputs(mixed_inputs());
  for (size_t n = 0; n < b.size(); ++n) {
    const auto r = decode_step_inputs(std::span<const std::byte>(b.data(), n));
    ASSERT_FALSE(r.ok()) << "a " << n << "-byte prefix of " << b.size() << " decoded";
    EXPECT_NE(r.error().message.find("step inputs:"), std::string::npos) << r.error().message;
  }
  EXPECT_NE(error_of(Bytes(b.begin(), b.begin() + 3)).find("header"), std::string::npos);
  EXPECT_NE(error_of(Bytes(b.begin(), b.end() - 1)).find("truncated"), std::string::npos);
}

TEST(RequestCodec, TrailingBytesAreAnError) {
  Bytes b = encode_step_inputs(mixed_inputs());
  b.push_back(std::byte{0});
  EXPECT_NE(error_of(b).find("trailing"), std::string::npos);
}

TEST(RequestCodec, BadMagicOrVersionIsAnError) {
  const Bytes good = encode_step_inputs(mixed_inputs());
  for (size_t i = 0; i < 4; ++i) {
    Bytes b = good;
    b[i] ^= std::byte{0x20};
    EXPECT_NE(error_of(b).find("magic"), std::string::npos) << "byte " << i;
  }
  for (int v : {0, kStepInputsVersion + 1, 255}) {
    Bytes b = good;
    b[4] = std::byte(v);
    EXPECT_NE(error_of(b).find("version " + std::to_string(v)), std::string::npos);
  }
}

TEST(RequestCodec, CorruptCountsAndBoolsAreErrors) {
  StepInputs one;
  one.submitted.emplace_back(9, full_request());
  const Bytes good = encode_step_inputs(one);
  const size_t prompt_bytes = 4 * full_request().prompt.size();
  // After the sampling: 40 bytes of scalars, then the bias count and 2 entries.
  const size_t stop_count = kFirstPromptCount + 4 + prompt_bytes + 40 + 4 + 2 * 8;

  // Counts far beyond what the message holds: errors, sized from nothing.
  for (size_t at : {kSubmittedCount, kFirstPromptCount, stop_count}) {
    for (uint32_t n : {0xFFFFFFFFu, 0x40000000u, uint32_t(good.size())}) {
      Bytes b = good;
      put_u32(b, at, n);
      const std::string e = error_of(b);
      EXPECT_NE(e.find("count " + std::to_string(n)), std::string::npos) << e;
    }
  }
  // The first stop string's length, past the end of the message.
  Bytes b = good;
  put_u32(b, stop_count + 4, 0x7FFFFFFFu);
  EXPECT_NE(error_of(b).find("stop string"), std::string::npos);
  // A bool that is neither 0 nor 1: the shutdown flag, the last byte.
  b = good;
  b.back() = std::byte{2};
  EXPECT_NE(error_of(b).find("shutdown"), std::string::npos);
  // The error names the request it was found in.
  b = good;
  put_u32(b, kFirstPromptCount, 0xFFFFFFFFu);
  EXPECT_NE(error_of(b).find("submitted[0] prompt"), std::string::npos);
}

TEST(RequestCodec, ByteCorruptionsNeverCrash) {
  const Bytes good = encode_step_inputs(mixed_inputs());
  size_t decoded = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (std::byte x : {std::byte{0x01}, std::byte{0x80}, std::byte{0xFF}}) {
      Bytes b = good;
      b[i] ^= x;
      const auto r = decode_step_inputs(b);
      if (!r.ok()) {
        EXPECT_FALSE(r.error().message.empty());
        continue;
      }
      // A corruption that still parses (a token id, a float) re-encodes to
      // exactly the corrupted bytes.
      ++decoded;
      EXPECT_EQ(encode_step_inputs(r.value()), b) << "byte " << i;
    }
  }
  EXPECT_GT(decoded, 0u);
}

}  // namespace
}  // namespace kvant
