// Integer ranges as digit patterns (json_schema.h, integer_range_expr): the
// range is cut into pieces of one digit count, and each piece into
// "prefix, one digit range, any digits" patterns, on decimal strings so
// that no bound overflows.
#include <string>

#include "grammar/json_schema.h"

namespace kvant::grammar {

namespace {

Expr digits(char lo, char hi) { return Expr::byte_range(uint8_t(lo), uint8_t(hi)); }

bool all_of(std::string_view s, char c) { return s.find_first_not_of(c) == std::string_view::npos; }

// Decimal strings of the same length, lo <= hi.
Expr same_length(std::string_view lo, std::string_view hi) {
  const size_t n = lo.size();
  if (n == 1) return digits(lo[0], hi[0]);
  if (lo[0] == hi[0]) return Expr::seq({Expr::lit(std::string(1, lo[0])), same_length(lo.substr(1), hi.substr(1))});
  const std::string_view lr = lo.substr(1), hr = hi.substr(1);
  auto any_digits = [&] { return Expr::repeat(digits('0', '9'), uint32_t(n - 1), uint32_t(n - 1)); };
  std::vector<Expr> alts;
  char first_full = lo[0], last_full = hi[0];
  if (!all_of(lr, '0')) {
    alts.push_back(Expr::seq({Expr::lit(std::string(1, lo[0])), same_length(lr, std::string(n - 1, '9'))}));
    ++first_full;
  }
  if (!all_of(hr, '9')) --last_full;
  if (first_full <= last_full) alts.push_back(Expr::seq({digits(first_full, last_full), any_digits()}));
  if (!all_of(hr, '9'))
    alts.push_back(Expr::seq({Expr::lit(std::string(1, hi[0])), same_length(std::string(n - 1, '0'), hr)}));
  return Expr::alt(std::move(alts));
}

// Non-negative integers from a to b (b empty: no upper bound), as decimal
// strings without leading zeros.
void non_negative(const std::string& a, const std::string& b, std::vector<Expr>& out) {
  const size_t la = a.size();
  const size_t lb = b.empty() ? la : b.size();
  if (!b.empty() && (la > lb || (la == lb && a > b))) return;
  for (size_t d = la; d <= lb; ++d) {
    const std::string lo = d == la ? a : "1" + std::string(d - 1, '0');
    const std::string hi = !b.empty() && d == lb ? b : std::string(d, '9');
    out.push_back(same_length(lo, hi));
  }
  if (b.empty())
    out.push_back(Expr::seq({digits('1', '9'), Expr::repeat(digits('0', '9'), uint32_t(la), kUnbounded)}));
}

std::string magnitude(int64_t v) {
  const uint64_t m = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  return std::to_string(m);
}

}  // namespace

Expr integer_range_expr(const int64_t* lo, const int64_t* hi) {
  // An open end stops at 18 digits: every value fits 64 bits, and a model
  // cannot write digits forever.
  static const int64_t kMin = -kMaxJsonInteger, kMax = kMaxJsonInteger;
  if (lo == nullptr) lo = &kMin;
  if (hi == nullptr) hi = &kMax;
  std::vector<Expr> alts;
  if (lo == nullptr || *lo < 0) {
    // Negative values -m for m in [|min(hi, -1)|, |lo|].
    const int64_t top = hi != nullptr && *hi < -1 ? *hi : -1;
    if (lo == nullptr || *lo <= top) {
      std::vector<Expr> mags;
      non_negative(magnitude(top), lo ? magnitude(*lo) : std::string(), mags);
      if (!mags.empty()) alts.push_back(Expr::seq({Expr::lit("-"), Expr::alt(std::move(mags))}));
    }
  }
  if (hi == nullptr || *hi >= 0) {
    const int64_t a = lo != nullptr && *lo > 0 ? *lo : 0;
    non_negative(std::to_string(a), hi ? std::to_string(*hi) : std::string(), alts);
  }
  if (alts.empty()) return Expr::alt({});
  return Expr::alt(std::move(alts));
}

}  // namespace kvant::grammar
