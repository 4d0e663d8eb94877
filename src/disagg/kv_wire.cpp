// The KV transfer protocol's codec (kv_wire.h).
#include "disagg/kv_wire.h"

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 with the widest vectors the CPU has, chosen at run time
#endif

#include <algorithm>
#include <cstring>
#include <new>

#include "engine/request_codec.h"

namespace kvant::disagg {
namespace {

class Writer {
 public:
  Writer() { out_.resize(kWireHeaderBytes); }  // the header's room (frame())
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i32(int32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void text(const std::string& s) {
    const size_t n = std::min(s.size(), kWireMaxText);
    u32(uint32_t(n));
    raw(s.data(), n);
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;  // little-endian hosts only (x86-64, AArch64)
};

// Reads with bounds checks; the first failure is kept and later reads
// return zeros, so a decoder reads straight through and checks ok() once.
class Reader {
 public:
  Reader(std::span<const uint8_t> b, const char* what) : b_(b), what_(what) {}
  bool ok() const { return err_.empty(); }
  const std::string& error() const { return err_; }
  size_t left() const { return b_.size() - pos_; }
  void fail(const std::string& why) {
    if (err_.empty())
      err_ = std::string("KV transfer: ") + what_ + " message: " + why + " (at byte " +
             std::to_string(pos_) + " of " + std::to_string(b_.size()) + ")";
  }
  // The next n bytes in place (the caller checked they are there).
  std::span<const uint8_t> take(size_t n) {
    auto out = b_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  bool raw(void* p, size_t n, const char* field) {
    if (!ok()) return false;
    if (n > left()) {
      fail(std::string(field) + ": " + std::to_string(n) + " bytes needed, " +
           std::to_string(left()) + " left");
      return false;
    }
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <class T>
  T get(const char* field) {
    T v{};
    if (!raw(&v, sizeof v, field)) return T{};
    return v;
  }
  std::string text(const char* field) {
    const uint32_t n = get<uint32_t>(field);
    if (!ok()) return {};
    if (n > kWireMaxText) {
      fail(std::string(field) + ": " + std::to_string(n) + " bytes, the limit is " +
           std::to_string(kWireMaxText));
      return {};
    }
    std::string s(n, '\0');
    raw(s.data(), n, field);
    return s;
  }
  // A count of elements of at least `each` bytes: refused when the bytes
  // left cannot hold them (nothing is sized from a corrupt count).
  uint64_t count(const char* field, uint64_t each, uint64_t limit) {
    const uint64_t n = get<uint64_t>(field);
    if (!ok()) return 0;
    if (n > limit || (each > 0 && n > left() / each)) {
      fail(std::string(field) + ": count " + std::to_string(n) + " (limit " +
           std::to_string(limit) + ", " + std::to_string(left()) + " bytes left)");
      return 0;
    }
    return n;
  }
  void done() {
    if (ok() && left() != 0) fail(std::to_string(left()) + " bytes after the message's end");
  }

 private:
  std::span<const uint8_t> b_;
  const char* what_;
  size_t pos_ = 0;
  std::string err_;
};

// A message's bytes: every encoder's Writer starts with kWireHeaderBytes
// of room, which this fills in once the payload behind it is written (the
// payload is never copied again).
std::vector<uint8_t> frame(WireType type, std::vector<uint8_t> msg) {
  const uint64_t n = msg.size() - kWireHeaderBytes;
  const uint16_t version = kWireVersion, t = uint16_t(type);
  const uint64_t h = XXH3_64bits(msg.data() + kWireHeaderBytes, n);
  std::memcpy(msg.data(), kWireMagic, 4);
  std::memcpy(msg.data() + 4, &version, 2);
  std::memcpy(msg.data() + 6, &t, 2);
  std::memcpy(msg.data() + 8, &n, 8);
  std::memcpy(msg.data() + 16, &h, 8);
  return msg;
}

Result<void> check_payload(const WireHeader& h, WireType want, std::span<const uint8_t> payload,
                           const char* what) {
  if (h.type != want)
    return make_error(std::string("KV transfer: a message of type ") +
                      std::to_string(int(h.type)) + " read as " + what);
  if (payload.size() != h.payload_bytes)
    return make_error(std::string("KV transfer: ") + what + " message: " +
                      std::to_string(payload.size()) + " payload bytes, the header says " +
                      std::to_string(h.payload_bytes));
  if (XXH3_64bits(payload.data(), payload.size()) != h.payload_hash)
    return make_error(std::string("KV transfer: ") + what +
                      " message: the payload does not match its checksum (corrupted in transit)");
  return {};
}

}  // namespace

WireHasher::WireHasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
WireHasher::~WireHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void WireHasher::update(std::span<const uint8_t> bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
uint64_t WireHasher::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::vector<uint8_t> encode(const WireHello& m) {
  Writer w;
  w.u16(uint16_t(m.role));
  w.text(m.model);
  w.u64(m.layout_hash);
  w.text(m.layout);
  return frame(WireType::kHello, std::move(w.out()));
}

std::vector<uint8_t> encode_handoff_head(uint64_t request_id, const KvHandoff& k) {
  Writer w;
  w.out().reserve(160 + k.prompt.size() * 4 + k.pages.size() * 16);
  w.u64(0);  // the metadata's length, filled in below
  w.u64(request_id);
  w.u64(k.layout_hash);
  w.i64(k.page_bytes);
  w.i64(k.page_tokens);
  w.u64(k.prompt.size());
  w.raw(k.prompt.data(), k.prompt.size() * 4);
  w.i32(k.first_token);
  w.u8(k.has_logprobs ? 1 : 0);
  if (k.has_logprobs) {
    w.i32(k.first_logprobs.chosen.token);
    w.f32(k.first_logprobs.chosen.logprob);
    w.i32(k.first_logprobs.n_top);
    for (const TokenLogprob& t : k.first_logprobs.top_tokens()) {
      w.i32(t.token);
      w.f32(t.logprob);
    }
  }
  w.u64(k.sampler_state);
  const size_t drafts = std::min<size_t>(k.mtp_draft.size(), kWireMaxDraft);
  w.u8(uint8_t(drafts));
  for (size_t i = 0; i < drafts; ++i) w.i32(k.mtp_draft[i]);
  w.u64(k.pages.size());
  for (const KvHandoffPage& p : k.pages) {
    w.u32(p.src_page);
    w.u32(p.src_generation);
    w.u64(p.checksum);
  }
  std::vector<uint8_t> out = std::move(w.out());
  const uint64_t meta = out.size() - kWireHeaderBytes - 8;
  std::memcpy(out.data() + kWireHeaderBytes, &meta, 8);
  // The header: the payload is this metadata and then the page bytes.
  const uint64_t n = out.size() - kWireHeaderBytes + k.data.size();
  const uint16_t version = kWireVersion, t = uint16_t(WireType::kHandoff);
  WireHasher hash;
  hash.update(std::span<const uint8_t>(out).subspan(kWireHeaderBytes));
  hash.update(k.data);
  const uint64_t h = hash.digest();
  std::memcpy(out.data(), kWireMagic, 4);
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &t, 2);
  std::memcpy(out.data() + 8, &n, 8);
  std::memcpy(out.data() + 16, &h, 8);
  return out;
}

std::vector<uint8_t> encode_handoff(uint64_t request_id, const KvHandoff& k) {
  std::vector<uint8_t> out = encode_handoff_head(request_id, k);
  out.insert(out.end(), k.data.begin(), k.data.end());
  return out;
}

std::vector<uint8_t> encode(const WireHandoff& m) { return encode_handoff(m.request_id, m.kv); }

std::vector<uint8_t> encode(const WireAck& m) {
  Writer w;
  w.u64(m.request_id);
  w.u32(m.status);
  w.text(m.message);
  return frame(WireType::kAck, std::move(w.out()));
}

// A pull's request travels as a one-request StepInputs (request_codec.h),
// so that one parser, already fuzzed, reads requests from peers.
std::vector<uint8_t> encode(const WirePull& m) {
  StepInputs in;
  in.submitted.emplace_back(m.request_id, m.request);
  in.submitted.back().second.on_event = nullptr;
  const std::vector<std::byte> body = encode_step_inputs(in);
  Writer w;
  w.u64(m.request_id);
  w.raw(body.data(), body.size());
  return frame(WireType::kPull, std::move(w.out()));
}

Result<WireHeader> decode_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kWireHeaderBytes)
    return make_error("KV transfer: a header needs " + std::to_string(kWireHeaderBytes) +
                      " bytes, got " + std::to_string(bytes.size()));
  if (std::memcmp(bytes.data(), kWireMagic, 4) != 0)
    return make_error("KV transfer: not a kvant KV transfer stream (bad magic)");
  Reader r(bytes.subspan(4, kWireHeaderBytes - 4), "header");
  const uint16_t version = r.get<uint16_t>("version");
  const uint16_t type = r.get<uint16_t>("type");
  WireHeader h;
  h.payload_bytes = r.get<uint64_t>("payload length");
  h.payload_hash = r.get<uint64_t>("payload hash");
  if (version != kWireVersion)
    return make_error("KV transfer: protocol version " + std::to_string(version) +
                      "; this build speaks version " + std::to_string(kWireVersion));
  if (type < uint16_t(WireType::kHello) || type > uint16_t(WireType::kPull))
    return make_error("KV transfer: unknown message type " + std::to_string(type));
  h.type = WireType(type);
  if (h.payload_bytes > kWireMaxPayload)
    return make_error("KV transfer: a payload of " + std::to_string(h.payload_bytes) +
                      " bytes is over the limit of " + std::to_string(kWireMaxPayload));
  return h;
}

Result<WireHello> decode_hello(const WireHeader& h, std::span<const uint8_t> payload) {
  KV_TRY(check_payload(h, WireType::kHello, payload, "hello"));
  Reader r(payload, "hello");
  WireHello m;
  const uint16_t role = r.get<uint16_t>("role");
  m.model = r.text("model");
  m.layout_hash = r.get<uint64_t>("layout hash");
  m.layout = r.text("layout");
  r.done();
  if (r.ok() && role != uint16_t(WireRole::kPrefill) && role != uint16_t(WireRole::kDecode))
    r.fail("unknown role " + std::to_string(role));
  if (!r.ok()) return make_error(r.error());
  m.role = WireRole(role);
  return m;
}

Result<WireHandoff> decode_handoff_meta(const WireHeader& h, std::span<const uint8_t> meta) {
  if (h.type != WireType::kHandoff)
    return make_error("KV transfer: a message of type " + std::to_string(int(h.type)) +
                      " read as handoff");
  Reader r(meta, "handoff");
  WireHandoff m;
  KvHandoff& k = m.kv;
  m.request_id = r.get<uint64_t>("request id");
  k.layout_hash = r.get<uint64_t>("layout hash");
  k.page_bytes = r.get<int64_t>("page bytes");
  k.page_tokens = r.get<int64_t>("page tokens");
  if (r.ok() && (k.page_bytes <= 0 || k.page_bytes > kWireMaxPageBytes))
    r.fail("page bytes " + std::to_string(k.page_bytes) + " out of (0, " +
           std::to_string(kWireMaxPageBytes) + "]");
  if (r.ok() && (k.page_tokens <= 0 || k.page_tokens > 4096))
    r.fail("page tokens " + std::to_string(k.page_tokens) + " out of (0, 4096]");
  const uint64_t n = r.count("prompt tokens", 4, uint64_t(kWireMaxPrompt));
  if (r.ok() && n == 0) r.fail("empty prompt");
  k.prompt.resize(size_t(n));
  r.raw(k.prompt.data(), size_t(n) * 4, "prompt");
  for (int32_t t : k.prompt)
    if (r.ok() && t < 0) r.fail("prompt token " + std::to_string(t));
  k.first_token = r.get<int32_t>("first token");
  if (r.ok() && k.first_token < 0) r.fail("first token " + std::to_string(k.first_token));
  const uint8_t has_lp = r.get<uint8_t>("logprobs flag");
  if (r.ok() && has_lp > 1) r.fail("logprobs flag " + std::to_string(has_lp));
  k.has_logprobs = has_lp == 1;
  if (r.ok() && k.has_logprobs) {
    StepLogprobs& lp = k.first_logprobs;
    lp.chosen.token = r.get<int32_t>("logprob token");
    lp.chosen.logprob = r.get<float>("logprob");
    const int32_t top = r.get<int32_t>("top logprobs");
    if (r.ok() && (top < 0 || top > kMaxTopLogprobs))
      r.fail("top logprobs " + std::to_string(top) + " out of [0, " +
             std::to_string(kMaxTopLogprobs) + "]");
    if (r.ok()) lp.n_top = top;
    for (int32_t i = 0; r.ok() && i < lp.n_top; ++i) {
      lp.top[size_t(i)].token = r.get<int32_t>("top token");
      lp.top[size_t(i)].logprob = r.get<float>("top logprob");
    }
  }
  k.sampler_state = r.get<uint64_t>("sampler state");
  const uint8_t drafts = r.get<uint8_t>("draft tokens");
  if (r.ok() && drafts > kWireMaxDraft)
    r.fail("draft tokens " + std::to_string(drafts) + " out of [0, " +
           std::to_string(kWireMaxDraft) + "]");
  for (uint8_t i = 0; r.ok() && i < drafts; ++i) {
    k.mtp_draft.push_back(r.get<int32_t>("draft token"));
    if (r.ok() && k.mtp_draft.back() < 0)
      r.fail("draft token " + std::to_string(k.mtp_draft.back()));
  }
  const uint64_t pages = r.count("pages", 16, uint64_t(kWireMaxPrompt));
  if (r.ok() && int64_t(pages) != (int64_t(n) + k.page_tokens - 1) / k.page_tokens)
    r.fail(std::to_string(pages) + " pages for " + std::to_string(n) + " tokens in pages of " +
           std::to_string(k.page_tokens));
  k.pages.resize(size_t(pages));
  for (KvHandoffPage& p : k.pages) {
    p.src_page = r.get<uint32_t>("source page");
    p.src_generation = r.get<uint32_t>("source generation");
    p.checksum = r.get<uint64_t>("page checksum");
  }
  r.done();
  // The page bytes follow the metadata and its length: exactly the pages'.
  if (r.ok() && h.payload_bytes != 8 + meta.size() + pages * uint64_t(k.page_bytes))
    r.fail(std::to_string(h.payload_bytes - std::min<uint64_t>(h.payload_bytes, 8 + meta.size())) +
           " bytes of page data for " + std::to_string(pages) + " pages of " +
           std::to_string(k.page_bytes));
  if (!r.ok()) return make_error(r.error());
  return m;
}

Result<WireHandoff> decode_handoff(const WireHeader& h, std::span<const uint8_t> payload) {
  KV_TRY(check_payload(h, WireType::kHandoff, payload, "handoff"));
  Reader r(payload, "handoff");
  const uint64_t meta = r.get<uint64_t>("metadata length");
  if (r.ok() && meta > r.left())
    r.fail("metadata of " + std::to_string(meta) + " bytes, " + std::to_string(r.left()) + " left");
  if (!r.ok()) return make_error(r.error());
  auto m = decode_handoff_meta(h, payload.subspan(8, size_t(meta)));
  if (!m) return m;
  const auto data = payload.subspan(8 + size_t(meta));
  m->kv.data.assign(data.begin(), data.end());
  return m;
}

Result<WireAck> decode_ack(const WireHeader& h, std::span<const uint8_t> payload) {
  KV_TRY(check_payload(h, WireType::kAck, payload, "ack"));
  Reader r(payload, "ack");
  WireAck m;
  m.request_id = r.get<uint64_t>("request id");
  m.status = r.get<uint32_t>("status");
  m.message = r.text("message");
  r.done();
  if (!r.ok()) return make_error(r.error());
  return m;
}

Result<WirePull> decode_pull(const WireHeader& h, std::span<const uint8_t> payload) {
  KV_TRY(check_payload(h, WireType::kPull, payload, "pull"));
  Reader r(payload, "pull");
  WirePull m;
  m.request_id = r.get<uint64_t>("request id");
  if (!r.ok()) return make_error(r.error());
  auto in = decode_step_inputs(std::as_bytes(payload.subspan(8)));
  if (!in) return make_error("KV transfer: pull message: " + in.error().message);
  if (in->submitted.size() != 1 || !in->cancelled.empty() || in->shutdown)
    return make_error("KV transfer: pull message: " + std::to_string(in->submitted.size()) +
                      " requests, " + std::to_string(in->cancelled.size()) +
                      " cancellations (one request and nothing else expected)");
  if (in->submitted[0].first != m.request_id)
    return make_error("KV transfer: pull message: the request id differs from its request's");
  m.request = std::move(in->submitted[0].second);
  return m;
}

std::string describe_layout(const KvLayout& l) {
  const KvGeometry& g = l.geometry;
  std::string s = kv_dtype_name(g.dtype);
  if (g.scale_mode != KvScaleMode::kNone) s += std::string(" ") + kv_scale_mode_name(g.scale_mode);
  s += ", " + std::to_string(g.page_tokens) + "-token pages of " + std::to_string(l.page_bytes) +
       " bytes, " + std::to_string(g.layers) + " layers x " + std::to_string(g.kv_heads) +
       " KV heads x " + std::to_string(g.head_dim);
  if (g.shared_kv) s += " (MLA latent)";
  if (g.index_dim > 0) s += ", indexer keys of " + std::to_string(g.index_dim);
  return s;
}

}  // namespace kvant::disagg
