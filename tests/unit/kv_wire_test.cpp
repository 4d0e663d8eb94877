// The KV transfer protocol's codec (src/disagg/kv_wire.h): round trips of
// every message; the header's checks; every truncation, every trailing
// byte and every single-bit flip of a handoff refused (the payload hash) or
// harmless; corrupt counts refused before anything is sized from them; and
// a real engine's handoff through the wire taken by another engine.
#include "disagg/kv_wire.h"

#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "engine/engine.h"

using namespace kvant;
using namespace kvant::disagg;

namespace {

WireHandoff sample_handoff(bool logprobs) {
  WireHandoff m;
  m.request_id = 0x1122334455667788ull;
  KvHandoff& k = m.kv;
  k.layout_hash = 0xabcdef;
  k.page_bytes = 64;
  k.page_tokens = 4;
  k.prompt = {1, 2, 3, 4, 5, 6};
  k.first_token = 42;
  k.has_logprobs = logprobs;
  if (logprobs) {
    k.first_logprobs.chosen = {42, -0.25f};
    k.first_logprobs.n_top = 2;
    k.first_logprobs.top[0] = {42, -0.25f};
    k.first_logprobs.top[1] = {7, -1.5f};
  }
  k.sampler_state = 99;
  k.mtp_draft = {5, 9};
  k.pages.resize(2);
  k.data.resize(128);
  for (size_t i = 0; i < k.data.size(); ++i) k.data[i] = uint8_t(i * 31 + 7);
  for (size_t i = 0; i < 2; ++i)
    k.pages[i] = {uint32_t(10 + i), uint32_t(3 + i), kv_page_checksum(k.data.data() + i * 64, 64)};
  return m;
}

// Header and payload of an encoded message, decoded as its type says.
Result<WireHandoff> parse_handoff(std::span<const uint8_t> bytes) {
  auto h = decode_header(bytes);
  if (!h) return h.error();
  return decode_handoff(*h, bytes.subspan(kWireHeaderBytes));
}

// Re-frames a payload with a correct hash (to reach the payload checks).
std::vector<uint8_t> reframe(std::vector<uint8_t> msg) {
  const uint64_t n = msg.size() - kWireHeaderBytes;
  std::memcpy(msg.data() + 8, &n, 8);
  const uint64_t h = XXH3_64bits(msg.data() + kWireHeaderBytes, n);
  std::memcpy(msg.data() + 16, &h, 8);
  return msg;
}

}  // namespace

// The fuzzer's seeds (fuzz/kv_wire_seeds): one message of each type, each
// behind the fuzzer's flag byte (1: fix the payload hash). Written when
// KVANT_WRITE_WIRE_SEEDS names a directory; a no-op otherwise.
TEST(KvWire, WritesFuzzSeedsWhenAsked) {
  const char* dir = std::getenv("KVANT_WRITE_WIRE_SEEDS");
  if (!dir) GTEST_SKIP() << "set KVANT_WRITE_WIRE_SEEDS=DIR to write the fuzzer's seeds";
  WirePull pull;
  pull.request_id = 3;
  pull.request.prompt = {1, 2, 3};
  pull.request.handoff = true;
  const std::pair<const char*, std::vector<uint8_t>> seeds[] = {
      {"hello.bin", encode(WireHello{WireRole::kPrefill, "m", 5, "bf16"})},
      {"handoff.bin", encode(sample_handoff(true))},
      {"ack.bin", encode(WireAck{5, 0, ""})},
      {"pull.bin", encode(pull)}};
  for (const auto& [name, bytes] : seeds) {
    std::FILE* f = std::fopen((std::string(dir) + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr) << name;
    std::fputc(1, f);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

TEST(KvWire, RoundTripsEveryMessage) {
  for (bool lp : {false, true}) {
    const WireHandoff m = sample_handoff(lp);
    const auto bytes = encode(m);
    auto d = parse_handoff(bytes);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->request_id, m.request_id);
    EXPECT_EQ(d->kv.prompt, m.kv.prompt);
    EXPECT_EQ(d->kv.data, m.kv.data);
    EXPECT_EQ(d->kv.first_token, 42);
    EXPECT_EQ(d->kv.has_logprobs, lp);
    EXPECT_EQ(d->kv.first_logprobs.n_top, lp ? 2 : 0);
    EXPECT_EQ(d->kv.pages[1].src_generation, 4u);
    EXPECT_EQ(d->kv.sampler_state, 99u);
    EXPECT_EQ(d->kv.mtp_draft, (std::vector<int32_t>{5, 9}));
    EXPECT_EQ(encode(*d), bytes);
  }
  WireHello hello{WireRole::kDecode, "SmolLM2", 77, "bf16, 16-token pages"};
  auto hb = encode(hello);
  auto hh = decode_header(hb);
  ASSERT_TRUE(hh.ok());
  auto hd = decode_hello(*hh, std::span<const uint8_t>(hb).subspan(kWireHeaderBytes));
  ASSERT_TRUE(hd.ok()) << hd.error().message;
  EXPECT_EQ(hd->role, WireRole::kDecode);
  EXPECT_EQ(hd->model, "SmolLM2");
  EXPECT_EQ(hd->layout_hash, 77u);
  WireAck ack{5, 2, "layout differs"};
  auto ab = encode(ack);
  auto ah = decode_header(ab);
  ASSERT_TRUE(ah.ok());
  auto ad = decode_ack(*ah, std::span<const uint8_t>(ab).subspan(kWireHeaderBytes));
  ASSERT_TRUE(ad.ok()) << ad.error().message;
  EXPECT_EQ(ad->message, "layout differs");
  // A message read as another type is refused.
  EXPECT_FALSE(decode_hello(*ah, std::span<const uint8_t>(ab).subspan(kWireHeaderBytes)).ok());
}

TEST(KvWire, PullRoundTripsItsRequest) {
  WirePull pull;
  pull.request_id = 42;
  pull.request.prompt = {1, 2, 3, 4};
  pull.request.sampling.temperature = 0.7f;
  pull.request.sampling.seed = 9;
  pull.request.stop.max_tokens = 17;
  pull.request.stop.stop = {"\n\n"};
  pull.request.logprobs = true;
  pull.request.handoff = true;
  auto b = encode(pull);
  auto h = decode_header(b);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->type, WireType::kPull);
  auto d = decode_pull(*h, std::span<const uint8_t>(b).subspan(kWireHeaderBytes));
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->request_id, 42u);
  EXPECT_EQ(d->request.prompt, pull.request.prompt);
  EXPECT_EQ(d->request.sampling.temperature, 0.7f);
  EXPECT_EQ(d->request.sampling.seed, 9u);
  EXPECT_EQ(d->request.stop.max_tokens, 17);
  EXPECT_EQ(d->request.stop.stop, pull.request.stop.stop);
  EXPECT_TRUE(d->request.logprobs);
  EXPECT_TRUE(d->request.handoff);
  EXPECT_EQ(encode(*d), b);
  // The id outside and the request's inside must agree; trailing bytes and
  // truncations are refused.
  auto other = b;
  other[kWireHeaderBytes] = 43;
  other = reframe(other);
  auto oh = decode_header(other);
  EXPECT_FALSE(decode_pull(*oh, std::span<const uint8_t>(other).subspan(kWireHeaderBytes)).ok());
  for (size_t n = kWireHeaderBytes; n < b.size(); ++n) {
    auto cut = reframe(std::vector<uint8_t>(b.begin(), b.begin() + ptrdiff_t(n)));
    auto ch = decode_header(cut);
    ASSERT_TRUE(ch.ok());
    EXPECT_FALSE(decode_pull(*ch, std::span<const uint8_t>(cut).subspan(kWireHeaderBytes)).ok()) << n;
  }
}

TEST(KvWire, HeaderChecks) {
  auto b = encode(WireAck{1, 0, ""});
  auto bad = b;
  bad[0] = 'X';
  EXPECT_NE(decode_header(bad).error().message.find("magic"), std::string::npos);
  bad = b;
  bad[4] = 9;
  EXPECT_NE(decode_header(bad).error().message.find("version"), std::string::npos);
  bad = b;
  bad[6] = 77;
  EXPECT_NE(decode_header(bad).error().message.find("type"), std::string::npos);
  bad = b;
  bad[15] = 0x7f;  // a payload length in the exabytes
  EXPECT_NE(decode_header(bad).error().message.find("limit"), std::string::npos);
  EXPECT_FALSE(decode_header(std::span<const uint8_t>(b).first(23)).ok());
}

TEST(KvWire, TruncationsTrailingBytesAndFlipsAreRefused) {
  const auto bytes = encode(sample_handoff(true));
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(parse_handoff(std::span<const uint8_t>(bytes).first(n)).ok()) << n;
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(parse_handoff(longer).ok());
  EXPECT_FALSE(parse_handoff(reframe(longer)).ok());  // even with its hash right
  // Every single-bit flip: refused (header checks or the payload hash).
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto f = bytes;
      f[i] ^= uint8_t(1 << bit);
      auto d = parse_handoff(f);
      EXPECT_FALSE(d.ok()) << "byte " << i << " bit " << bit;
      if (d.ok()) return;
    }
}

TEST(KvWire, CorruptFieldsBehindAValidHashAreRefused) {
  const auto good = encode(sample_handoff(false));
  // Payload offsets: metadata length 0, request id 8, layout hash 16, page
  // bytes 24, page tokens 32, prompt count 40, 6 prompt tokens, first token
  // 72, logprobs flag 76, sampler state 77, draft count 85.
  struct Case {
    size_t at;
    uint64_t value;
    const char* want;
  } cases[] = {{kWireHeaderBytes + 24, 0, "page bytes"},
               {kWireHeaderBytes + 32, 100000, "page tokens"},
               {kWireHeaderBytes + 40, uint64_t(1) << 40, "prompt tokens"},
               {kWireHeaderBytes + 40, 0, "empty prompt"},
               {kWireHeaderBytes + 40, 1000, "prompt tokens"},
               {kWireHeaderBytes + 0, uint64_t(1) << 40, "metadata"},
               {kWireHeaderBytes + 0, 9, "bytes"},
               {kWireHeaderBytes + 85, 17, "draft tokens"},
               {kWireHeaderBytes + 86, uint64_t(0xffffffffu), "draft token"}};
  for (const Case& c : cases) {
    auto b = good;
    std::memcpy(b.data() + c.at, &c.value, 8);
    auto d = parse_handoff(reframe(b));
    ASSERT_FALSE(d.ok()) << c.want;
    EXPECT_NE(d.error().message.find(c.want), std::string::npos) << d.error().message;
  }
  // Random bytes behind a valid frame never crash.
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    auto b = good;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) b[kWireHeaderBytes + rng() % (b.size() - kWireHeaderBytes)] = uint8_t(rng());
    (void)parse_handoff(reframe(b));
  }
}

TEST(KvWire, AnEnginesHandoffThroughTheWire) {
  EngineOptions o;
  o.model_path = std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.kv_dtype = KvDType::kFp8E4m3;
  o.kv_scale_mode = KvScaleMode::kDynamic;
  o.kv_memory_bytes = int64_t(16) << 20;
  o.log_capacity = false;
  o.threads = 2;
  auto pre = Engine::create(o);
  auto dec = Engine::create(o);
  ASSERT_TRUE(pre.ok() && dec.ok());
  const auto prompt = (*pre)->tokenizer().encode("The capital of France is", true, false);
  std::vector<uint8_t> wire;
  Request r;
  r.prompt = prompt;
  r.handoff = true;
  r.on_event = [&](const RequestEvent& e) {
    if (e.handoff) wire = encode(WireHandoff{7, *e.handoff});
  };
  ASSERT_TRUE((*pre)->submit(std::move(r)).ok());
  ASSERT_TRUE((*pre)->run_until_idle().ok());
  ASSERT_FALSE(wire.empty());
  EXPECT_NE(describe_layout((*pre)->kv_layout()).find("fp8_e4m3"), std::string::npos);
  auto m = parse_handoff(wire);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->request_id, 7u);
  std::vector<int32_t> got;
  Request d;
  d.prompt = prompt;
  d.stop.max_tokens = 6;
  d.stop.ignore_eos = true;
  d.on_event = [&](const RequestEvent& e) {
    if (e.token >= 0) got.push_back(e.token);
  };
  auto id = (*dec)->submit_handoff(std::move(d), std::make_shared<KvHandoff>(std::move(m->kv)));
  ASSERT_TRUE(id.ok()) << id.error().message;
  ASSERT_TRUE((*dec)->run_until_idle().ok());
  EXPECT_EQ(got.size(), 6u);
}
