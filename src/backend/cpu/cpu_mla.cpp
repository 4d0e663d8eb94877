// The CPU backend's latent-attention expansion (MLA prefill) and GLM-5's
// sparse-attention choice (DSA): the arithmetic of those two blocks that is
// neither a product nor a plain row operation.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "numerics/bf16.h"

namespace kvant::backend {

// Latent rows into per-head K and V, kExpandRows at a time through FP32:
// the latent part through W_kv_b, the shared RoPE key copied into every head.
void CpuBackend::mla_expand(const MlaExpand& a) {
  const int64_t H = a.heads, R = a.rank, nope = a.nope, dr = a.rope, dv = a.v_dim;
  const int64_t W = nope + dv, qk = nope + dr, rows = a.latent.rows;
  if (int64_t(exp_in_.size()) < kExpandRows * R) {
    exp_in_ = AlignedBuffer<float>(size_t(kExpandRows * R));
    exp_out_ = AlignedBuffer<float>(size_t(kExpandRows * H * W));
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kExpandRows) {
    const int64_t n = std::min(kExpandRows, rows - r0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < R; ++k)
        exp_in_[size_t(r * R + k)] = bf16_to_f32(a.latent.row(r0 + r)[k]);
    linear(dense<const float>(exp_in_.data(), n, R), {a.wkv_b, nullptr},
           dense(exp_out_.data(), n, H * W));
    pfor(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* x = exp_out_.data() + r * H * W;
        uint16_t* kr = a.k.row(r0 + r);
        uint16_t* vr = a.v.row(r0 + r);
        for (int64_t h = 0; h < H; ++h) {
          K_.f32_to_bf16(x + h * W, kr + h * qk, nope);
          std::memcpy(kr + h * qk + nope, a.latent.row(r0 + r) + R, size_t(dr) * 2);
          K_.f32_to_bf16(x + h * W + nope, vr + h * dv, dv);
        }
      }
    });
  }
}

void CpuBackend::dsa_select(const StepPlan& plan, int64_t l, CF32 q, CF32 head_w, int64_t ih,
                            int64_t ihd, int64_t Kt, int32_t* sel, uint8_t* sparse) {
  const int64_t T = plan.n_tokens();
  constexpr int64_t kMaxKey = 1024;
  KV_CHECK(ihd <= kMaxKey);
  std::fill(sparse, sparse + T, uint8_t(0));
  ensure_attention(kPrefillQueries, plan.max_ctx, std::max(plan.max_pages, plan.max_ctx));
  const float qscale = 1.f / std::sqrt(float(ihd)), wscale = 1.f / std::sqrt(float(ih));
  const int nt = threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (T > 1 && nt > 1)
  for (int64_t t = 0; t < T; ++t) {
    const int tid = omp_get_thread_num();
    const StepToken& tk = plan.tokens[size_t(t)];
    const KvSpan& span = *plan.chunks[size_t(tk.chunk)].kv;
    const KvFormat& f = *span.format;
    const int64_t n = tk.pos + 1;
    if (n <= Kt) continue;
    sparse[t] = 1;
    const float* qt = q.row(t);
    const float* w = head_w.row(t);
    float* s = dsa_score_.data() + int64_t(tid) * ctx_;
    float kf[kMaxKey];
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* page = span.pages[j / f.page_tokens] + l * f.layer_bytes;
      const uint16_t* kr =
          reinterpret_cast<const uint16_t*>(page + f.index_offset) + (j % f.page_tokens) * ihd;
      for (int64_t d = 0; d < ihd; ++d) kf[d] = bf16_to_f32(kr[d]);
      float acc = 0.f;
      for (int64_t h = 0; h < ih; ++h) {
        float dot = 0.f;
        for (int64_t d = 0; d < ihd; ++d) dot = std::fma(qt[h * ihd + d], kf[d], dot);
        acc += w[h] * wscale * std::max(0.f, dot * qscale);
      }
      s[j] = acc;
    }
    int32_t* order = dsa_order_.data() + int64_t(tid) * ctx_;
    for (int64_t j = 0; j < n; ++j) order[j] = int32_t(j);
    std::nth_element(order, order + Kt, order + n, [&](int32_t x, int32_t y) {
      return s[x] > s[y] || (s[x] == s[y] && x < y);
    });
    std::sort(order, order + Kt);
    std::copy(order, order + Kt, sel + t * Kt);
  }
}

}  // namespace kvant::backend
