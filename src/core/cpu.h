// CPU feature detection (cpuid + xgetbv), read once. Kernel dispatch asks
// this; nothing else should branch on ISA.
#pragma once

#include <string>

namespace kvant {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx_vnni = false;
  bool avx512_vbmi = false;  // VPERMB / VPERMI2B
  bool has_avx2_set() const { return avx2 && fma && f16c; }
  bool has_avx512_set() const {
    return avx512f && avx512bw && avx512vl && avx512dq && avx512_bf16 && avx512_vnni;
  }
  std::string describe() const;
};

const CpuFeatures& cpu_features();

}  // namespace kvant
