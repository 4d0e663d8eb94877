// Scalar conversion of one head's K or V row between FP32 and the page dtype:
// the reference that attention kernels reading pages are tested against.
// Owns the scaling rule (code = dtype(x / scale), value = decode(code) * scale)
// and the dynamic-scale formula; it does not know where rows live in a page
// (kv_layout.h / page_pool.h do).
#pragma once

#include <cstdint>

#include "kvcache/kv_layout.h"

namespace kvant {

// Dynamic scale for one (token, head) row: amax / max_finite over the finite
// entries, rounded up to the next BF16 value (pages store it as BF16), so the
// largest magnitude maps onto (nearly) the format's largest code. A row
// with no finite non-zero entry gets 1 (any scale decodes zeros exactly, and 1
// keeps x / scale finite). For MLA the row is the whole latent including its
// RoPE part, so the one scale covers both uses of the row.
float kv_dynamic_scale(KvDType dtype, const float* x, int64_t n);

// out: n elements of `dtype` (uint16 BF16 bits or FP8 codes). scale is
// ignored for BF16. Rounds to nearest even, saturates finite overflow (FP8).
void kv_encode_row(KvDType dtype, const float* x, int64_t n, float scale, void* out);
// Exact inverse up to the encoding's rounding: decode(code) * scale in FP32.
void kv_decode_row(KvDType dtype, const void* in, int64_t n, float scale, float* out);

}  // namespace kvant
