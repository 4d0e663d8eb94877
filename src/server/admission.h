// What the server lets in, as plain policy objects with no sockets, so each
// rule is tested on its own (tests/server/admission_test.cpp):
//  - ByteBudget: the bytes every request holds while queued and running
//    (its body while it is read and parsed, then its tokens, echo text and
//    the room its answer may take), admitted against one limit;
//  - ConnectionLimits: open connections in total and per client address;
//  - OriginPolicy: the Host and Origin headers a request may carry (DNS
//    rebinding and cross-site requests from web pages);
//  - the API key: from a flag, a file or KVANT_API_KEY, compared in
//    constant time.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace kvant::server {

class ByteBudget {
 public:
  explicit ByteBudget(int64_t limit) : limit_(limit) {}
  // Takes n bytes if they fit under the limit; false otherwise.
  bool try_reserve(int64_t n);
  void release(int64_t n);
  int64_t used() const { return used_.load(); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

// Bytes held from a ByteBudget, given back when it goes out of scope.
class Reservation {
 public:
  Reservation() = default;
  explicit Reservation(ByteBudget* b) : budget_(b) {}
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  Reservation(Reservation&& o) noexcept { *this = std::move(o); }
  Reservation& operator=(Reservation&& o) noexcept;
  ~Reservation() { reset(); }
  // Holds exactly n bytes from now on (growing may fail: false, unchanged).
  bool resize(int64_t n);
  void reset() { resize(0); }
  int64_t bytes() const { return bytes_; }

 private:
  ByteBudget* budget_ = nullptr;
  int64_t bytes_ = 0;
};

class ConnectionLimits {
 public:
  ConnectionLimits(int64_t total, int64_t per_address) : total_(total), per_address_(per_address) {}
  // Every verdict counts the connection; over a limit, the caller closes an
  // idle one to make room (of the same address for kOverAddress) or, with
  // none idle, refuses this one and releases it.
  enum class Verdict { kAccept, kOverTotal, kOverAddress };
  Verdict admit(const std::string& address);
  void release(const std::string& address);
  int64_t open() const;

 private:
  const int64_t total_, per_address_;
  mutable std::mutex mu_;
  int64_t open_ = 0;
  std::unordered_map<std::string, int64_t> by_address_;
};

// Host and Origin checks. With the server bound to a loopback address and
// no allowed hosts given, Host must name the loopback (localhost,
// 127.0.0.0/8, [::1], any port): a page whose DNS name was rebound to
// 127.0.0.1 sends its own name and is refused. An Origin header, when
// present, must be a loopback origin or one of allowed_origins ("*" allows
// any); "null" is refused.
struct OriginPolicy {
  bool loopback_bind = true;
  std::vector<std::string> allowed_hosts;    // host names (no port); "*" = any
  std::vector<std::string> allowed_origins;  // "scheme://host[:port]"; "*" = any
};
bool is_loopback_host(std::string_view host);  // host without port
// The error message, or nullopt when allowed.
std::optional<std::string> check_host(const OriginPolicy& p, std::string_view host_header);
std::optional<std::string> check_origin(const OriginPolicy& p, std::string_view origin);
// True when the origin was named in allowed_origins (CORS headers go back).
bool origin_listed(const OriginPolicy& p, std::string_view origin);

// application/json, any case, with or without parameters.
bool is_json_content_type(std::string_view value);

// `Authorization: Bearer KEY` (scheme in any case) against `key`, in time
// that does not depend on where they differ.
bool bearer_matches(std::string_view header, std::string_view key);
// The key from --api-key, else --api-key-file (first line, trimmed), else
// the KVANT_API_KEY environment variable; empty when none is set.
Result<std::string> resolve_api_key(const std::string& flag, const std::string& file);

}  // namespace kvant::server
