// The KV transfer protocol's messages (disaggregated prefill and decode):
// what a prefill server and a decode server say to each other over a byte
// stream, encoded and parsed here and nowhere else. The parser takes bytes
// from the network, so it trusts nothing: every count is checked against
// the bytes left before anything is sized from it, every enum and flag
// against its values, every length against its limits, and trailing bytes
// are an error. It is fuzzed (fuzz/fuzz_kv_wire.cpp) and every malformed
// message is refused with a message naming what is wrong and where.
//
// Framing: each message is a 24-byte header, then its payload:
//   magic "KVXF" | version u16 | type u16 | payload length u64 |
//   XXH3-64 of the payload u64
// little-endian throughout. The header's checksum covers the whole payload
// (metadata and page bytes alike); the handoff's per-page XXH3 values are
// checked again by the decode engine against the bytes it copies in, so a
// page is verified end to end, from the prefill pool to the decode pool.
//
// Messages:
//   Hello    each side, first: role, model name, the KV layout's hash and a
//            description of it (dtype, page size, geometry) for the message
//            when they differ; both sides refuse a peer whose hash differs.
//   Handoff  prefill -> decode: a request's K/V (engine/kv_handoff.h) and the
//            request id it belongs to: u64 metadata length, the metadata
//            (everything but the page bytes), then the page bytes, so that
//            a receiver can put them straight where they go.
//   Pull     decode -> prefill: run this request's prompt (the engine's
//            Request, in the request codec's encoding, engine/
//            request_codec.h) and send its handoff; the decode side sends it
//            once it has room for the pages.
//   Ack      decode -> prefill: a request's handoff was taken (status 0) or
//            refused (status != 0, with the reason); the prefill side may
//            then drop its copy. prefill -> decode: the prefill side could
//            not produce the handoff (status != 0, the reason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/engine.h"
#include "engine/kv_handoff.h"

namespace kvant::disagg {

inline constexpr char kWireMagic[4] = {'K', 'V', 'X', 'F'};
// 2: a handoff's metadata length first; 3: the prefill side's MTP draft
inline constexpr uint16_t kWireVersion = 3;
inline constexpr uint8_t kWireMaxDraft = 16;  // draft tokens a handoff may carry
inline constexpr size_t kWireHeaderBytes = 24;
// Limits a parser enforces (a peer beyond them is refused, not trusted).
inline constexpr uint64_t kWireMaxPayload = uint64_t(1) << 36;  // 64 GiB
inline constexpr int64_t kWireMaxPrompt = int64_t(1) << 24;     // tokens
inline constexpr int64_t kWireMaxPageBytes = int64_t(1) << 30;
inline constexpr size_t kWireMaxText = 4096;  // names, descriptions, messages

enum class WireType : uint16_t { kHello = 1, kHandoff = 2, kAck = 3, kPull = 4 };
enum class WireRole : uint16_t { kPrefill = 1, kDecode = 2 };

struct WireHeader {
  WireType type = WireType::kHello;
  uint64_t payload_bytes = 0;
  uint64_t payload_hash = 0;
};

struct WireHello {
  WireRole role = WireRole::kPrefill;
  std::string model;
  uint64_t layout_hash = 0;
  std::string layout;  // human-readable, for refusals
};

struct WireHandoff {
  uint64_t request_id = 0;
  KvHandoff kv;
};

struct WirePull {
  uint64_t request_id = 0;
  Request request;  // on_event is not carried
};

struct WireAck {
  uint64_t request_id = 0;
  uint32_t status = 0;  // 0: taken
  std::string message;
};

// A whole message (header and payload).
std::vector<uint8_t> encode(const WireHello& m);
std::vector<uint8_t> encode(const WireHandoff& m);
// The same bytes as encode(WireHandoff{request_id, kv}), without a copy of kv.
std::vector<uint8_t> encode_handoff(uint64_t request_id, const KvHandoff& kv);
// All of a handoff message but its page bytes (kv.data), which follow it on
// the wire: a sender writes this and then kv.data, never copying the pages.
// The header's length and hash cover the page bytes too.
std::vector<uint8_t> encode_handoff_head(uint64_t request_id, const KvHandoff& kv);
std::vector<uint8_t> encode(const WireAck& m);
std::vector<uint8_t> encode(const WirePull& m);

// The header at the start of `bytes` (at least kWireHeaderBytes): magic,
// version, type and payload length checked; the payload is then read by the
// caller and handed to decode_* with this header.
Result<WireHeader> decode_header(std::span<const uint8_t> bytes);
// The payload of a message of the header's type; its hash is checked first.
Result<WireHello> decode_hello(const WireHeader& h, std::span<const uint8_t> payload);
Result<WireHandoff> decode_handoff(const WireHeader& h, std::span<const uint8_t> payload);
// A handoff read in parts (a receiver that puts the page bytes straight
// into kv.data): the metadata (the payload's bytes after its u64 length),
// checked as decode_handoff checks it, kv.data left empty, and the header's
// length checked to be the metadata's plus exactly the pages' bytes. The
// payload hash is the caller's to check (WireHasher over the whole payload).
Result<WireHandoff> decode_handoff_meta(const WireHeader& h, std::span<const uint8_t> meta);

// XXH3-64 over bytes given in pieces: the header's payload hash.
class WireHasher {
 public:
  WireHasher();
  ~WireHasher();
  WireHasher(const WireHasher&) = delete;
  WireHasher& operator=(const WireHasher&) = delete;
  void update(std::span<const uint8_t> bytes);
  uint64_t digest() const;

 private:
  void* state_;
};
Result<WireAck> decode_ack(const WireHeader& h, std::span<const uint8_t> payload);
Result<WirePull> decode_pull(const WireHeader& h, std::span<const uint8_t> payload);

// A layout's description for Hello ("fp8_e4m3 dynamic, 16-token pages of
// 92160 bytes, 30 layers x 3 KV heads x 64").
std::string describe_layout(const KvLayout& l);

}  // namespace kvant::disagg
