// KV_CHECK*: invariant checks that print both values and abort. For bugs,
// never for bad input (bad input returns Result errors).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace kvant::detail {
[[noreturn]] inline void check_failed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "kvant: check failed at %s:%d: %s\n", file, line, what.c_str());
  std::abort();
}
template <class A, class B>
std::string describe(const char* ea, const char* op, const char* eb, const A& a, const B& b) {
  std::ostringstream s;
  s << ea << " " << op << " " << eb << " (" << a << " vs " << b << ")";
  return s.str();
}
}  // namespace kvant::detail

#define KV_CHECK(c) \
  do { if (!(c)) ::kvant::detail::check_failed(__FILE__, __LINE__, #c); } while (0)
#define KV_CHECK_OP_(a, b, op)                                                            \
  do {                                                                                    \
    const auto& kv_a_ = (a);                                                              \
    const auto& kv_b_ = (b);                                                              \
    if (!(kv_a_ op kv_b_))                                                                \
      ::kvant::detail::check_failed(__FILE__, __LINE__,                                   \
                                    ::kvant::detail::describe(#a, #op, #b, kv_a_, kv_b_)); \
  } while (0)
#define KV_CHECK_EQ(a, b) KV_CHECK_OP_(a, b, ==)
#define KV_CHECK_NE(a, b) KV_CHECK_OP_(a, b, !=)
#define KV_CHECK_LT(a, b) KV_CHECK_OP_(a, b, <)
#define KV_CHECK_LE(a, b) KV_CHECK_OP_(a, b, <=)
#define KV_CHECK_GE(a, b) KV_CHECK_OP_(a, b, >=)
#define KV_CHECK_GT(a, b) KV_CHECK_OP_(a, b, >)
