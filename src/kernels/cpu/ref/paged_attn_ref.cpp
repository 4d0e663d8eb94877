// Scalar reference for paged_attn_decode (contract in kernels.h): decodes each
// element through numerics/ (bf16, fp8 tables), takes dot products in double
// like ref::attn_scores, then ref::softmax and the contract's sequential FMA
// sum. Written to be obviously right; speed is the SIMD versions' job.
#include <cmath>
#include <cstring>

#include "kernels/cpu/paged_attn_common.h"
#include "kernels/cpu/ref/ref.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant::kernels::ref {
namespace {

float decode(const uint8_t* row, int64_t d, KvDType e) {
  switch (e) {
    case KvDType::kFp8E4m3:
      return fp8_e4m3_to_f32(row[d]);
    case KvDType::kFp8E5m2:
      return fp8_e5m2_to_f32(row[d]);
    default: {
      uint16_t h;
      std::memcpy(&h, row + 2 * d, 2);
      return kvant::bf16_to_f32(h);
    }
  }
}

}  // namespace

void paged_attn_scores(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* s, int64_t lds) {
  const bool fp8 = kv.elem != KvDType::kBf16;
  for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
    const uint8_t* row = kv.k_pages[pg] + i * kv.token_stride;
    const float c = fp8 ? scale * k_token_scale(kv, pg, i) : scale;
    for (int64_t h = 0; h < group; ++h) {
      double acc = 0;
      for (int64_t d = 0; d < head_dim; ++d)
        acc += double(q[h * head_dim + d]) * decode(row, d, kv.elem);
      s[h * lds + t] = float(acc * c);
    }
  });
}

void paged_attn_probs(float* s, int64_t lds, int64_t group, const PagedKv& kv) {
  probs_pass(s, lds, group, kv, [](float* x, int64_t n) { softmax(x, n); });
}

void paged_attn_wsum(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                     const PagedKv& kv, int64_t d0, int64_t d1, float* out) {
  for (int64_t h = 0; h < group; ++h)
    for (int64_t d = d0; d < d1; ++d) {
      float acc = 0.f;
      for_each_token(kv, [&](int64_t t, int64_t pg, int64_t i) {
        acc = std::fma(p[h * lds + t], decode(kv.v_pages[pg] + i * kv.token_stride, d, kv.elem),
                       acc);
      });
      out[h * head_dim + d] = acc;
    }
}

void paged_attn_decode(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* scratch, float* out) {
  const int64_t n = kv.n_tokens;
  paged_attn_scores(q, group, head_dim, scale, kv, scratch, n);
  paged_attn_probs(scratch, n, group, kv);
  paged_attn_wsum(scratch, n, group, head_dim, kv, 0, head_dim, out);
}

}  // namespace kvant::kernels::ref
