// Result<T>: the return type at I/O and API boundaries. Holds a value or an
// Error whose message names what was wrong (file, field, offset). Internal
// invariants use KV_CHECK (check.h) instead; this header does no logging.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kvant {

struct Error {
  std::string message;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}             // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}         // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }

 private:
  Error err_;
  bool ok_ = true;
};

inline Error make_error(std::string msg) { return Error{std::move(msg)}; }

}  // namespace kvant

// Propagates an error from an expression returning Result<...>.
#define KV_TRY(expr)                                   \
  do {                                                 \
    auto&& kv_try_r_ = (expr);                         \
    if (!kv_try_r_.ok()) return kv_try_r_.error();     \
  } while (0)
