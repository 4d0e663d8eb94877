// Scalar FP32 <-> page-dtype rows (see kv_codec.h).
#include "kvcache/kv_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {

float kv_dynamic_scale(KvDType dtype, const float* x, int64_t n) {
  return fp8_row_scale(kv_dtype_max_finite(dtype), x, n);
}

void kv_encode_row(KvDType dtype, const float* x, int64_t n, float scale, void* out) {
  switch (dtype) {
    case KvDType::kBf16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(x[i]);
      return;
    }
    case KvDType::kFp8E4m3: {
      auto* o = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_fp8_e4m3(x[i] / scale);
      return;
    }
    case KvDType::kFp8E5m2: {
      auto* o = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_fp8_e5m2(x[i] / scale);
      return;
    }
  }
}

void kv_decode_row(KvDType dtype, const void* in, int64_t n, float scale, float* out) {
  switch (dtype) {
    case KvDType::kBf16: {
      const auto* p = static_cast<const uint16_t*>(in);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case KvDType::kFp8E4m3: {
      const auto* p = static_cast<const uint8_t*>(in);
      const float* t = fp8_e4m3_table();
      for (int64_t i = 0; i < n; ++i) out[i] = t[p[i]] * scale;
      return;
    }
    case KvDType::kFp8E5m2: {
      const auto* p = static_cast<const uint8_t*>(in);
      const float* t = fp8_e5m2_table();
      for (int64_t i = 0; i < n; ++i) out[i] = t[p[i]] * scale;
      return;
    }
  }
}

}  // namespace kvant
