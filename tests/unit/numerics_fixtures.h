// Loads the raw little-endian arrays under tests/fixtures/numerics/ (made by
// tools/fixtures/gen_numerics.py) for the numerics_*_test.cpp files. Owns only
// file reading; what each array means is in that directory's README.md.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace kvant::testing {

static_assert(std::endian::native == std::endian::little,
              "fixtures are little-endian and read without byte swapping");

// Reads the whole file as an array of T. A missing or ragged file adds a test
// failure and returns an empty vector, so callers should ASSERT on the size.
template <class T>
std::vector<T> load_numerics_fixture(const std::string& name) {
  const std::string path = std::string(KVANT_FIXTURES) + "/numerics/" + name;
  std::vector<T> out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    ADD_FAILURE() << "cannot open fixture " << path;
    return out;
  }
  std::vector<unsigned char> bytes;
  unsigned char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  std::fclose(f);
  if (bytes.size() % sizeof(T) != 0) {
    ADD_FAILURE() << path << ": " << bytes.size() << " bytes is not a whole number of " << sizeof(T)
                  << "-byte elements";
    return out;
  }
  out.resize(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

}  // namespace kvant::testing
