// Logit digests for refactoring checks: with KVANT_LOGIT_DIGEST=<file> set,
// every forward output a model test produces through these helpers is hashed
// (XXH3 of its bytes) and appended to <file> as "<test> <call> <floats> <hash>",
// so two builds' files can be compared line by line for bitwise equality.
// Unset (the default, and in CI), it does nothing.
#pragma once

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace kvant::test {

inline void logit_digest(const float* data, size_t n) {
  static const char* path = std::getenv("KVANT_LOGIT_DIGEST");
  if (!path || !*path) return;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("-");
  static std::map<std::string, int> calls;
  const int call = calls[name]++;
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s %d %zu %016llx\n", name.c_str(), call, n,
                 static_cast<unsigned long long>(XXH3_64bits(data, n * sizeof(float))));
    std::fclose(f);
  }
}

}  // namespace kvant::test
