// Helpers for the kernel tests: a test fixture parameterised over every ISA
// (skipped, with the reason, where this CPU lacks it) and random BF16/FP32
// data. Tests compare each table against the scalar reference in ref/.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "numerics/bf16.h"

namespace kvant::kernels::test {

class KernelIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    t_ = table_for(GetParam());
    if (!t_) GTEST_SKIP() << isa_name(GetParam()) << " is not supported by this CPU";
  }
  const KernelTable& T() const { return *t_; }
  const KernelTable* t_ = nullptr;
};

inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) {
  return isa_name(info.param);
}

inline std::vector<float> random_f32(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> random_bf16(size_t n, float lo, float hi, uint32_t seed) {
  std::vector<uint16_t> v(n);
  auto f = random_f32(n, lo, hi, seed);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

}  // namespace kvant::kernels::test
