// The CPU backend's weights, scratch, row operations, linear products, RoPE
// and MoE permutation (cpu_backend.h). Attention and the KV pages are in
// cpu_attention.cpp, latent and sparse attention in cpu_mla.cpp.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/check.h"
#include "core/threads.h"
#include "numerics/bf16.h"

namespace kvant {

void Matrix::row_f32(int64_t r, float scale, float* out) const {
  // Inverse of the P16-pair packing for one row: element (r, 2q+e) sits at
  // ((panel * kp) + q) * 32 + 2 * (r % 16) + e.
  const int64_t kp = (cols + 1) / 2;
  const uint16_t* base =
      packed.data() + (r / kernels::kPackRows) * kp * 32 + 2 * (r % kernels::kPackRows);
  for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(base[(c / 2) * 32 + (c & 1)]) * scale;
}

namespace backend {

CpuBackend::CpuBackend(const kernels::KernelTable& k, int threads, const char* name)
    : K_(k), threads_(threads), name_(name) {
  // KVANT_DECODE_SPLIT_CTX: the context from which decode attention may
  // split one KV head over threads (0: never; see tune_decode_split).
  if (const char* e = std::getenv("KVANT_DECODE_SPLIT_CTX")) split_min_ctx_ = std::atoll(e);
}

int CpuBackend::threads() const { return threads_ > 0 ? threads_ : num_threads(); }

Matrix CpuBackend::prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.packed = AlignedBuffer<uint16_t>(size_t(kernels::gemm_bf16_packed_size(rows, cols)));
  K_.pack_bf16(w, rows, cols, m.packed.data());
  return m;
}

Q4Matrix CpuBackend::prepare_int4(const int8_t* q, const float* scale, const int8_t* zero,
                                  int64_t rows, int64_t cols, int64_t group) const {
  Q4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.group = group;
  const int64_t panels = kernels::q4_panels(rows);
  m.w = AlignedBuffer<uint8_t>(size_t(panels * cols * 8));
  m.scales = AlignedBuffer<uint16_t>(size_t(panels * kernels::q4_groups(cols, group) * 16));
  if (zero) m.offs = AlignedBuffer<uint8_t>(m.scales.size());
  kernels::pack_q4(q, scale, zero, rows, cols, group, m.w.data(), m.scales.data(),
                   zero ? m.offs.data() : nullptr);
  return m;
}

F8Matrix CpuBackend::prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows,
                                 int64_t cols, int64_t group) const {
  KV_CHECK(cols % 2 == 0 && group % 2 == 0 && (group <= kernels::kF8MaxGroup || group >= cols));
  F8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.group = group;
  m.w = AlignedBuffer<uint8_t>(size_t(kernels::f8_packed_bytes(rows, cols, group)));
  m.scales = AlignedBuffer<float>(size_t(kernels::q4_panels(rows) * kernels::f8_groups(cols, group) * 16));
  m.nan_codes = kernels::pack_f8(codes, scale, rows, cols, group, m.w.data(), m.scales.data());
  m.subnormal_share = kernels::f8_subnormal_share(codes, rows * cols);
  return m;
}

DeviceBuffer CpuBackend::alloc(size_t bytes) {
  if (bytes == 0) return {};
  // Huge pages from kHugeBytes on (core/aligned.h).
  return DeviceBuffer(detail::alloc_zeroed(bytes), bytes,
                      [](void* q, size_t n) { detail::free_aligned(q, n); });
}

void CpuBackend::reserve(const WorkspaceSize& s) {
  if (s.tokens * s.widest_input > int64_t(xb_.size()))
    xb_ = AlignedBuffer<uint16_t>(size_t(s.tokens * s.widest_input));
  const int64_t values = s.tokens * s.widest_input;
  if (values > int64_t(q8_.size())) {
    q8_ = AlignedBuffer<int8_t>(size_t(values));
    q8_s_ = AlignedBuffer<float>(size_t(values / kernels::kQ4Block + 1));
    q8_sum_ = AlignedBuffer<int32_t>(size_t(values / kernels::kQ4Block + 1));
  }
  ensure_attention(std::max(s.score_rows, kPrefillQueries), s.context,
                   std::max(s.pages, s.context));
  decode_tasks_.reserve(size_t(s.tokens * s.heads));
  prefill_tasks_.reserve(size_t(s.tokens * s.heads));
  if (s.experts > 0) {
    const RouterConfig rc{RouterScoring::kSoftmax, int(s.experts), 1, int(s.expert_groups)};
    router_.resize(std::max(router_.size(), size_t(router_scratch_size(rc) + 1)));
  }
}

void CpuBackend::ensure_attention(int64_t rows, int64_t ctx, int64_t pages) {
  const int nt = threads();
  if (rows > score_rows_ || ctx > ctx_) {
    score_rows_ = std::max(rows, score_rows_);
    ctx_ = std::max(ctx, ctx_);
    scores_ = AlignedBuffer<float>(size_t(nt * score_rows_ * ctx_));
    dsa_keep_.assign(size_t(nt * ctx_), 0);
    dsa_score_.assign(size_t(nt * ctx_), 0.f);
    dsa_order_.assign(size_t(nt * ctx_), 0);
  }
  if (pages > pages_) {
    pages_ = pages;
    ptrs_ = AlignedBuffer<const uint8_t*>(size_t(nt * 4 * pages_));
  }
}

void CpuBackend::begin_step(const StepPlan& plan) {
  ++step_;
  ensure_attention(kPrefillQueries, plan.max_ctx, std::max(plan.max_pages, plan.max_ctx));
  // One gather task per (chunk, page) of rows.
  pieces_.clear();
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const StepChunk& c = plan.chunks[ci];
    if (c.decodes()) continue;
    const int64_t pt = c.kv->format->page_tokens, end = c.pos0 + c.n_tokens;
    for (int64_t j = c.gather_j0; j < end;) {
      const int64_t e = std::min((j / pt + 1) * pt, end);
      pieces_.push_back({int64_t(ci), j, e});
      j = e;
    }
  }
}

void CpuBackend::embed(const Matrix& table, int64_t row0, const int32_t* tokens, float scale,
                       F32 out) {
  for (int64_t t = 0; t < out.rows; ++t) {
    const int64_t r = int64_t(tokens[t]) - row0;
    if (r >= 0 && r < table.rows)
      table.row_f32(r, scale, out.row(t));
    else
      std::fill(out.row(t), out.row(t) + out.cols, 0.f);
  }
}

void CpuBackend::rmsnorm(CF32 x, const float* w, float eps, F32 y) {
  for (int64_t r = 0; r < x.rows; ++r) K_.rmsnorm(x.row(r), w, 0.f, eps, y.row(r), x.cols);
}

void CpuBackend::rmsnorm_heads(F32 x, int64_t heads, int64_t hd, const float* w, float eps) {
  pfor(x.rows, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x.row(t) + h * hd;
        K_.rmsnorm(p, w, 0.f, eps, p, hd);
      }
  });
}

void CpuBackend::layernorm(F32 x, const float* w, const float* b, double eps) {
  const int64_t n = x.cols;
  pfor(x.rows, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* k = x.row(t);
      double mean = 0, var = 0;
      for (int64_t d = 0; d < n; ++d) mean += k[d];
      mean /= double(n);
      for (int64_t d = 0; d < n; ++d) var += (k[d] - mean) * (k[d] - mean);
      const float inv = float(1.0 / std::sqrt(var / double(n) + eps));
      for (int64_t d = 0; d < n; ++d) k[d] = (k[d] - float(mean)) * inv * w[d] + b[d];
    }
  });
}

void CpuBackend::add(F32 x, CF32 y) {
  for (int64_t r = 0; r < x.rows; ++r) {
    float* a = x.row(r);
    const float* b = y.row(r);
    for (int64_t i = 0; i < x.cols; ++i) a[i] += b[i];
  }
}

void CpuBackend::add_bias(F32 x, const float* b) {
  pfor(x.rows, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* a = x.row(t);
      for (int64_t i = 0; i < x.cols; ++i) a[i] += b[i];
    }
  });
}

void CpuBackend::gated_act(GateAct act, CF32 gu, F32 out) {
  const int64_t F = out.cols;
  for (int64_t r = 0; r < out.rows; ++r) {
    const float* g = gu.row(r);
    if (act == GateAct::kGeluTanh)
      K_.gelu_tanh_mul(g, g + F, out.row(r), F);
    else
      K_.silu_mul(g, g + F, out.row(r), F);
  }
}

void CpuBackend::softcap(F32 x, float cap) {
  for (int64_t r = 0; r < x.rows; ++r) {
    float* a = x.row(r);
    for (int64_t i = 0; i < x.cols; ++i) a[i] = std::tanh(a[i] / cap) * cap;
  }
}

void CpuBackend::copy_rows(CF32 src, const int64_t* src_rows, F32 dst, const int64_t* dst_rows,
                           int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst.row(dst_rows ? dst_rows[i] : i), src.row(src_rows ? src_rows[i] : i),
                size_t(src.cols) * sizeof(float));
}

void CpuBackend::linear(CF32 x, LinearRef w, F32 y) {
  if (w.is_int4()) return linear_int4(x, w.q->q4, y);
  if (w.is_fp8()) return linear_fp8(x, w.q->f8, y);
  linear_bf16(x, *w.bf16, y);
}

// The rows in BF16, then the product split over output rows as for BF16,
// tokens in tiles of 64 (a thread's weight slice stays in its L2 across a
// tile's strips).
void CpuBackend::linear_fp8(CF32 x, const F8Matrix& W, F32 y) {
  const int64_t m = x.rows, k = W.cols;
  const uint16_t* xb = rows_bf16(x, k);
  const kernels::F8Weights w{W.w.data(), W.scales.data(), W.rows, W.cols, W.group, W.nan_codes,
                                    W.subnormal_share};
  constexpr int64_t kTile = 64;
  pfor(W.rows, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t i0 = 0; i0 < m; i0 += kTile)
      K_.gemm_f8(xb + i0 * k, k, w, y.row(i0), y.ld, std::min(kTile, m - i0), n0, n1);
  });
}

// x's first k columns as BF16 rows of stride k (in xb_, grown when needed).
const uint16_t* CpuBackend::rows_bf16(CF32 x, int64_t k) {
  if (x.rows * k > int64_t(xb_.size())) xb_ = AlignedBuffer<uint16_t>(size_t(x.rows * k));
  for (int64_t r = 0; r < x.rows; ++r) K_.f32_to_bf16(x.row(r), xb_.data() + r * k, k);
  return xb_.data();
}

// The rows in BF16, then the product split over output rows in whole packed
// panels of 16 so every thread streams its own slice of the weights (576
// rows go 288 / 288 over 2 threads, not 256 / 320 as blocks of 64 would).
void CpuBackend::linear_bf16(CF32 x, const Matrix& W, F32 y) {
  const int64_t m = x.rows, k = W.cols;
  const uint16_t* xb = rows_bf16(x, k);
  pfor(W.rows, 16, [&](int64_t n0, int64_t n1) {
    K_.gemm_bf16_packed(xb, k, W.packed.data(), k, y.data, y.ld, m, n0, n1);
  });
}

// The rows quantized into int8 blocks once, then split across threads by
// output rows, tokens in tiles of 64 so a thread's weight slice and a tile of
// activations stay in its L2 during prefill.
void CpuBackend::linear_int4(CF32 x, const Q4Matrix& W4, F32 y) {
  const int64_t m = x.rows, k = W4.cols, nb = k / kernels::kQ4Block;
  if (m * k > int64_t(q8_.size())) {
    q8_ = AlignedBuffer<int8_t>(size_t(m * k));
    q8_s_ = AlignedBuffer<float>(size_t(m * k / kernels::kQ4Block + 1));
    q8_sum_ = AlignedBuffer<int32_t>(size_t(m * k / kernels::kQ4Block + 1));
  }
  pfor(m, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      K_.quantize_q8(x.row(r), k, q8_.data() + r * k, q8_s_.data() + r * nb,
                     q8_sum_.data() + r * nb);
  });
  const kernels::Q4Weights w{W4.w.data(), W4.scales.data(),
                             W4.offs.size() ? W4.offs.data() : nullptr, W4.rows, W4.cols,
                             W4.group};
  constexpr int64_t kTile = 64;
  pfor(W4.rows, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t i0 = 0; i0 < m; i0 += kTile) {
      const kernels::Q8Rows xr{q8_.data() + i0 * k, q8_s_.data() + i0 * nb,
                               q8_sum_.data() + i0 * nb, k, nb};
      K_.gemm_q4(xr, w, y.row(i0), y.ld, std::min(kTile, m - i0), n0, n1);
    }
  });
}

void CpuBackend::rope_table(const StepPlan& plan, const float* inv_freq, int64_t n,
                            float attn_factor, F32 cos, F32 sin) {
  for (int64_t t = 0; t < plan.n_tokens(); ++t) {
    const float pos = float(plan.tokens[size_t(t)].pos);
    for (int64_t j = 0; j < n; ++j) {
      const float a = pos * inv_freq[j];
      cos.row(t)[j] = std::cos(a) * attn_factor;
      sin.row(t)[j] = std::sin(a) * attn_factor;
    }
  }
}

void CpuBackend::rope(F32 x, int64_t heads, int64_t stride, int64_t dim, CF32 cos, CF32 sin,
                      bool interleave) {
  const int64_t half = dim / 2;
  pfor(x.rows, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos.row(t);
      const float* s = sin.row(t);
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x.row(t) + h * stride;
        if (interleave) {
          for (int64_t i = 0; i < half; ++i) {
            const float a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * c[i] - b * s[i];
            p[2 * i + 1] = b * c[i] + a * s[i];
          }
        } else {
          for (int64_t i = 0; i < half; ++i) {
            const float a = p[i], b = p[i + half];
            p[i] = a * c[i] - b * s[i];
            p[i + half] = b * c[i] + a * s[i];
          }
        }
      }
    }
  });
}

void CpuBackend::moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                           float* weights) {
  KV_CHECK_EQ(logits.ld, logits.cols);
  const size_t need = size_t(router_scratch_size(rc) + 1);
  if (router_.size() < need) router_.resize(need);
  route_tokens(rc, logits.data, bias, logits.rows, ids, weights, router_.data());
}

void CpuBackend::moe_permute(const int32_t* ids, int64_t k, int64_t E, CF32 x, F32 xs,
                             const MoeSort& s) {
  const int64_t n = x.rows * k;
  moe_counting_sort(ids, n, E, s);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(xs.row(s.slot[i]), x.row(i / k), size_t(x.cols) * sizeof(float));
}

void CpuBackend::moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                             F32 out) {
  for (int64_t t = 0; t < out.rows; ++t) {
    float* o = out.row(t);
    std::fill(o, o + out.cols, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights[t * k + j];
      const float* y = ys.row(slot[t * k + j]);
      for (int64_t d = 0; d < out.cols; ++d) o[d] = std::fma(w, y[d], o[d]);
    }
  }
}

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>(kernels::active());
}

}  // namespace backend
}  // namespace kvant
