// Admission policy objects (see admission.h).
#include "server/admission.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace kvant::server {

bool ByteBudget::try_reserve(int64_t n) {
  if (n <= 0) return true;
  int64_t cur = used_.load();
  do {
    if (cur + n > limit_) return false;
  } while (!used_.compare_exchange_weak(cur, cur + n));
  return true;
}

void ByteBudget::release(int64_t n) {
  if (n > 0) used_.fetch_sub(n);
}

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    reset();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

bool Reservation::resize(int64_t n) {
  if (budget_ == nullptr) return n <= 0;
  if (n > bytes_) {
    if (!budget_->try_reserve(n - bytes_)) return false;
  } else {
    budget_->release(bytes_ - n);
  }
  bytes_ = n;
  return true;
}

ConnectionLimits::Verdict ConnectionLimits::admit(const std::string& address) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t mine = ++by_address_[address];
  ++open_;
  if (per_address_ > 0 && mine > per_address_) return Verdict::kOverAddress;
  if (total_ > 0 && open_ > total_) return Verdict::kOverTotal;
  return Verdict::kAccept;
}

void ConnectionLimits::release(const std::string& address) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return;
  if (--it->second <= 0) by_address_.erase(it);
  --open_;
}

int64_t ConnectionLimits::open() const {
  std::lock_guard<std::mutex> lk(mu_);
  return open_;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// "host:port", "[v6]:port", "host" -> the host, lower case, without brackets.
std::string host_part(std::string_view hp) {
  hp = trim(hp);
  if (!hp.empty() && hp.front() == '[') {
    const size_t close = hp.find(']');
    if (close == std::string_view::npos) return "";
    return lower(hp.substr(1, close - 1));
  }
  const size_t colon = hp.rfind(':');
  if (colon != std::string_view::npos && hp.find(':') == colon) hp = hp.substr(0, colon);
  return lower(hp);
}

bool listed(const std::vector<std::string>& list, const std::string& value) {
  for (const auto& v : list)
    if (v == "*" || lower(v) == value) return true;
  return false;
}

}  // namespace

bool is_loopback_host(std::string_view host) {
  const std::string h = lower(host);
  if (h == "localhost" || h.ends_with(".localhost") || h == "::1") return true;
  // 127.0.0.0/8 in dotted form.
  if (!h.starts_with("127.")) return false;
  int dots = 0;
  for (char c : h) {
    if (c == '.') ++dots;
    else if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return dots == 3;
}

std::optional<std::string> check_host(const OriginPolicy& p, std::string_view host_header) {
  const std::string host = host_part(host_header);
  if (!p.allowed_hosts.empty()) {
    if (listed(p.allowed_hosts, host)) return std::nullopt;
    return "the Host header '" + std::string(trim(host_header)) +
           "' is not one this server answers (--allowed-hosts)";
  }
  if (!p.loopback_bind) return std::nullopt;
  if (is_loopback_host(host)) return std::nullopt;
  return "the Host header '" + std::string(trim(host_header)) +
         "' does not name the loopback address this server listens on; "
         "start it with --allowed-hosts to answer other names";
}

namespace {
// "scheme://host[:port]" -> host; empty when it is not of that form.
std::string origin_host(std::string_view origin) {
  const size_t sep = origin.find("://");
  if (sep == std::string_view::npos) return "";
  std::string_view rest = origin.substr(sep + 3);
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos)
    rest = rest.substr(0, slash);
  return host_part(rest);
}
}  // namespace

bool origin_listed(const OriginPolicy& p, std::string_view origin) {
  const std::string o = lower(trim(origin));
  for (const auto& v : p.allowed_origins)
    if (v == "*" || lower(v) == o) return true;
  return false;
}

std::optional<std::string> check_origin(const OriginPolicy& p, std::string_view origin) {
  origin = trim(origin);
  if (origin_listed(p, origin)) return std::nullopt;
  if (origin != "null") {
    const std::string host = origin_host(origin);
    if (!host.empty() && is_loopback_host(host)) return std::nullopt;
  }
  return "requests from the web origin '" + std::string(origin) +
         "' are not allowed; start the server with --allowed-origins to permit it";
}

bool is_json_content_type(std::string_view value) {
  std::string v = lower(trim(value));
  if (const size_t semi = v.find(';'); semi != std::string::npos) v.resize(semi);
  return trim(v) == "application/json";
}

bool bearer_matches(std::string_view header, std::string_view key) {
  header = trim(header);
  if (header.size() < 7 || lower(header.substr(0, 7)) != "bearer ") return false;
  std::string_view got = trim(header.substr(7));
  // Every byte of the longer one is looked at whatever matched before.
  const size_t n = std::max(got.size(), key.size());
  unsigned diff = unsigned(got.size() != key.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    const unsigned char b = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
    diff |= unsigned(a ^ b);
  }
  return diff == 0 && !key.empty();
}

Result<std::string> resolve_api_key(const std::string& flag, const std::string& file) {
  if (!flag.empty()) return flag;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return make_error("--api-key-file: cannot read '" + file + "'");
    std::string line;
    std::getline(in, line);
    const std::string key(trim(line));
    if (key.empty()) return make_error("--api-key-file: '" + file + "' has no key on its first line");
    return key;
  }
  if (const char* k = std::getenv("KVANT_API_KEY")) return std::string(trim(k));
  return std::string();
}

}  // namespace kvant::server
