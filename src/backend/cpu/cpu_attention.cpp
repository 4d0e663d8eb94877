// The CPU backend's KV pages and attention: rows into page slots (the codec
// of kvcache/kv_codec.h), BF16 context rows for prefill, paged decode
// attention (FP8 decoded in the kernel) and causal prefill attention, each
// split over threads by task. Page addresses are computed here and nowhere
// above the backend.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "kvcache/kv_codec.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant::backend {

namespace {
uint8_t* layer_page(const KvSpan& kv, int64_t pos, int64_t layer) {
  const KvFormat& f = *kv.format;
  return kv.pages[pos / f.page_tokens] + layer * f.layer_bytes;
}

// Where step token t's rows go in layer l: its page's layer base and slot.
struct TokenSlot {
  const KvFormat& f;
  uint8_t* page;
  int64_t slot;
};
TokenSlot token_slot(const StepPlan& plan, int64_t t, int64_t l) {
  const StepToken& tk = plan.tokens[size_t(t)];
  const KvSpan& span = *plan.chunks[size_t(tk.chunk)].kv;
  return {*span.format, layer_page(span, tk.pos, l), tk.pos % span.format->page_tokens};
}
}  // namespace

void CpuBackend::kv_store(const StepPlan& plan, int64_t l, CF32 k, CF32 v) {
  pfor(plan.n_tokens(), 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [f, page, slot] = token_slot(plan, t, l);
      const int64_t hd = f.head_dim, kvh = f.kv_heads;
      const float* kr = k.row(t);
      const float* vr = v.data ? v.row(t) : nullptr;
      uint8_t* kd = page + f.k_offset + slot * f.row_bytes();
      uint8_t* vd = page + f.v_offset + slot * f.row_bytes();
      if (f.elem == KvDType::kBf16) {
        K_.f32_to_bf16(kr, reinterpret_cast<uint16_t*>(kd), kvh * hd);
        if (vr) K_.f32_to_bf16(vr, reinterpret_cast<uint16_t*>(vd), kvh * hd);
        continue;
      }
      auto* k_scales = reinterpret_cast<uint16_t*>(page + f.k_scale_offset) + slot * kvh;
      auto* v_scales = reinterpret_cast<uint16_t*>(page + f.v_scale_offset) + slot * kvh;
      for (int64_t h = 0; h < kvh; ++h) {
        float ks, vs = 1.f;
        if (f.dynamic_scales) {
          // Exact: kv_dynamic_scale returns BF16 values.
          ks = kv_dynamic_scale(f.elem, kr + h * hd, hd);
          k_scales[h] = f32_to_bf16(ks);
          if (vr) {
            vs = kv_dynamic_scale(f.elem, vr + h * hd, hd);
            v_scales[h] = f32_to_bf16(vs);
          }
        } else {
          ks = f.static_k[size_t(l * kvh + h)];
          if (vr) vs = f.static_v[size_t(l * kvh + h)];
        }
        kv_encode_row(f.elem, kr + h * hd, hd, ks, kd + h * hd);
        if (vr) kv_encode_row(f.elem, vr + h * hd, hd, vs, vd + h * hd);
      }
    }
  });
}

void CpuBackend::kv_store_index(const StepPlan& plan, int64_t l, CF32 k) {
  pfor(plan.n_tokens(), 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [f, page, slot] = token_slot(plan, t, l);
      K_.f32_to_bf16(k.row(t),
                     reinterpret_cast<uint16_t*>(page + f.index_offset) + slot * f.index_dim,
                     f.index_dim);
    }
  });
}

// Earlier positions decoded from the pages, the chunk's own from the fresh
// FP32 rows (so FP8 pages do not round-trip the chunk's own K/V; with BF16
// pages both give the same bits).
void CpuBackend::kv_gather(const StepPlan& plan, int64_t l, CF32 k_new, CF32 v_new, BF16 gk,
                           BF16 gv) {
  constexpr int64_t kMaxRow = 1024;
  pfor(int64_t(pieces_.size()), 1, [&](int64_t p0, int64_t p1) {
    float tmp[2 * kMaxRow];
    for (int64_t p = p0; p < p1; ++p) {
      const GatherPiece& pc = pieces_[size_t(p)];
      const StepChunk& c = plan.chunks[size_t(pc.chunk)];
      const KvFormat& f = *c.kv->format;
      const int64_t hd = f.head_dim, kvh = f.kv_heads, kvd = kvh * hd;
      KV_CHECK(hd <= kMaxRow);
      for (int64_t j = pc.j0; j < pc.j1; ++j) {
        const int64_t row = c.gather_off + j - c.gather_j0;
        uint16_t* dk = gk.row(row);
        uint16_t* dv = v_new.data ? gv.row(row) : nullptr;
        if (j >= c.pos0) {
          const int64_t t = c.t0 + j - c.pos0;
          K_.f32_to_bf16(k_new.row(t), dk, kvd);
          if (dv) K_.f32_to_bf16(v_new.row(t), dv, kvd);
          continue;
        }
        const uint8_t* page = layer_page(*c.kv, j, l);
        const int64_t slot = j % f.page_tokens;
        const uint8_t* kd = page + f.k_offset + slot * f.row_bytes();
        const uint8_t* vd = page + f.v_offset + slot * f.row_bytes();
        if (f.elem == KvDType::kBf16) {
          std::memcpy(dk, kd, size_t(kvd) * 2);
          if (dv) std::memcpy(dv, vd, size_t(kvd) * 2);
          continue;
        }
        const float* table = f.elem == KvDType::kFp8E4m3 ? fp8_e4m3_table() : fp8_e5m2_table();
        const auto* k_scales = reinterpret_cast<const uint16_t*>(page + f.k_scale_offset);
        const auto* v_scales = reinterpret_cast<const uint16_t*>(page + f.v_scale_offset);
        for (int64_t h = 0; h < kvh; ++h) {
          float ks, vs = 1.f;
          if (f.dynamic_scales) {
            ks = bf16_to_f32(k_scales[slot * kvh + h]);
            if (dv) vs = bf16_to_f32(v_scales[slot * kvh + h]);
          } else {
            ks = f.static_k[size_t(l * kvh + h)];
            if (dv) vs = f.static_v[size_t(l * kvh + h)];
          }
          for (int64_t d = 0; d < hd; ++d) tmp[d] = table[kd[h * hd + d]] * ks;
          K_.f32_to_bf16(tmp, dk + h * hd, hd);
          if (!dv) continue;
          for (int64_t d = 0; d < hd; ++d) tmp[hd + d] = table[vd[h * hd + d]] * vs;
          K_.f32_to_bf16(tmp + hd, dv + h * hd, hd);
        }
      }
    }
  });
}

namespace {
// Page pointers of decode task (chunk c, KV head kvh) in layer l, and the
// PagedKv over them. Arrays kp, vp, ksp, vsp of at least the task's pointer
// count; point(p, j) aims entry p at position j's rows.
struct DecodeView {
  const StepChunk& c;
  const KvFormat& f;
  int64_t l, kvh, hd;
  const uint8_t** kp;
  const uint8_t** vp;
  const uint16_t** ksp;
  const uint16_t** vsp;

  void point(int64_t p, int64_t j) const {
    const uint8_t* page = layer_page(*c.kv, j, l);
    const int64_t slot = j % f.page_tokens, eb = f.elem_bytes();
    kp[p] = page + f.k_offset + slot * f.row_bytes() + kvh * hd * eb;
    vp[p] = page + f.v_offset + slot * f.row_bytes() + kvh * hd * eb;
    if (f.dynamic_scales) {
      ksp[p] = reinterpret_cast<const uint16_t*>(page + f.k_scale_offset) + slot * f.kv_heads + kvh;
      vsp[p] = reinterpret_cast<const uint16_t*>(page + f.v_scale_offset) + slot * f.kv_heads + kvh;
    }
  }
  // n tokens from the pointers' entry 0, page_tokens per entry.
  kernels::PagedKv kv(int64_t n, int64_t page_tokens) const {
    kernels::PagedKv v;
    const bool shared = f.shared_kv();
    v.elem = f.elem;
    v.scale_stride = f.kv_heads;
    v.token_stride = f.row_bytes();
    if (!f.dynamic_scales && f.elem != KvDType::kBf16) {
      v.k_scale = f.static_k[size_t(l * f.kv_heads + kvh)];
      v.v_scale = shared ? v.k_scale : f.static_v[size_t(l * f.kv_heads + kvh)];
    }
    v.k_pages = kp;
    v.v_pages = shared ? kp : vp;  // MLA: the same row is K and V
    if (f.dynamic_scales) {
      v.k_scales = ksp;
      v.v_scales = shared ? ksp : vsp;
    }
    v.page_tokens = page_tokens;
    v.n_tokens = n;
    return v;
  }
};
}  // namespace

void CpuBackend::attention_decode(const StepPlan& plan, const DecodeAttn& a) {
  const int64_t Td = int64_t(plan.decode_chunks.size());
  if (Td == 0) return;
  const int64_t group = a.heads / a.kv_heads, blk = a.head_block, hd = a.head_dim;
  const int64_t key[4] = {step_, a.kv_heads, group, blk};
  if (!std::equal(key, key + 4, decode_key_)) {
    decode_tasks_.clear();
    for (int64_t d = 0; d < Td; ++d)
      for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh)
        for (int64_t b = 0; b < group; b += blk)
          decode_tasks_.push_back({d, kvh, kvh * group + b, std::min(blk, group - b)});
    std::copy(key, key + 4, decode_key_);
  }
  if (decode_split_applies(plan, a)) return attention_decode_split(plan, a);
  ensure_attention(std::max(blk, kPrefillQueries), plan.max_ctx,
                   std::max(plan.max_pages, plan.max_ctx));
  const int64_t l = a.layer, n_tasks = int64_t(decode_tasks_.size());
  const int nt = threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_tasks > 1 && nt > 1)
  for (int64_t w = 0; w < n_tasks; ++w) {
    const int tid = omp_get_thread_num();
    const DecodeTask& task = decode_tasks_[size_t(w)];
    const StepChunk& c = plan.chunks[size_t(plan.decode_chunks[size_t(task.d)])];
    const KvFormat& f = *c.kv->format;
    const int64_t pos = c.pos0;  // the single token's position
    const int64_t pt = f.page_tokens;
    const uint8_t** kp = ptrs_for(tid);
    const uint8_t** vp = kp + pages_;
    const uint16_t** ksp = reinterpret_cast<const uint16_t**>(vp + pages_);
    const uint16_t** vsp = ksp + pages_;
    const DecodeView view{c, f, l, task.kvh, hd, kp, vp, ksp, vsp};
    kernels::PagedKv kv;
    if (a.topk > 0 && a.sparse[c.t0]) {
      // Only the indexer's choice: one pointer per chosen token.
      const int32_t* sel = a.sel + c.t0 * a.topk;
      for (int64_t p = 0; p < a.topk; ++p) view.point(p, sel[p]);
      kv = view.kv(a.topk, 1);
    } else {
      const int64_t j0 = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      const int64_t n = pos - j0 + 1;
      // Page-aligned start: one pointer per page; a window starting inside a
      // page: one pointer per token (page_tokens = 1).
      const bool per_token = j0 % pt != 0;
      const int64_t np = per_token ? n : (n + pt - 1) / pt;
      for (int64_t p = 0; p < np; ++p) view.point(p, per_token ? j0 + p : j0 + p * pt);
      kv = view.kv(n, per_token ? 1 : pt);
    }
    const int64_t r = a.rows_by_token ? c.t0 : task.d;
    K_.paged_attn_decode(a.q.row(r) + task.h0 * hd, task.nh, hd, a.scale, kv, scores_for(tid),
                         a.out.row(r) + task.h0 * hd);
  }
}

bool CpuBackend::decode_split_applies(const StepPlan& plan, const DecodeAttn& a) const {
  if (split_min_ctx_ <= 0 || a.topk > 0 || a.window > 0) return false;
  int64_t longest = 0;
  for (int64_t ci : plan.decode_chunks)
    longest = std::max(longest, plan.chunks[size_t(ci)].pos0 + 1);
  if (longest < split_min_ctx_) return false;
  const int64_t nt = threads(), tasks = int64_t(decode_tasks_.size());
  return split_force_ || (nt > 1 && tasks < 2 * nt && tasks % nt != 0);
}

// Three passes over every task, each split into units the threads share:
// scores by page ranges, probabilities by head, weighted sums whole per task
// where the tasks go evenly over the threads and by head_dim ranges of 32 for
// the rest. The kernels' contract makes the result bitwise
// paged_attn_decode's, so whether a step splits changes no output.
void CpuBackend::attention_decode_split(const StepPlan& plan, const DecodeAttn& a) {
  const int64_t hd = a.head_dim, l = a.layer, n_tasks = int64_t(decode_tasks_.size());
  const int nt = threads();
  split_tasks_.clear();
  int64_t s_total = 0, p_total = 0, tokens = 0;
  for (const DecodeTask& task : decode_tasks_) {
    const StepChunk& c = plan.chunks[size_t(plan.decode_chunks[size_t(task.d)])];
    const int64_t n = c.pos0 + 1, pt = c.kv->format->page_tokens, np = (n + pt - 1) / pt;
    const int64_t lds = (n + 15) / 16 * 16;
    split_tasks_.push_back({n, np, lds, s_total, p_total});
    s_total += task.nh * lds;
    p_total += 4 * np;
    tokens += n;
  }
  if (int64_t(split_scores_.size()) < s_total)
    split_scores_ = AlignedBuffer<float>(size_t(s_total));
  if (int64_t(split_ptrs_.size()) < p_total)
    split_ptrs_ = AlignedBuffer<const uint8_t*>(size_t(p_total));
  // About 8 score ranges per thread over the whole step, none shorter than
  // split_min_part_ tokens; head_dim in ranges of 32.
  const int64_t part = std::max<int64_t>(split_min_part_, tokens / (8 * int64_t(nt)) + 1);
  for (auto& u : split_units_) u.clear();
  for (int64_t w = 0; w < n_tasks; ++w) {
    const SplitTask& st = split_tasks_[size_t(w)];
    const DecodeTask& task = decode_tasks_[size_t(w)];
    const int64_t pt =
        plan.chunks[size_t(plan.decode_chunks[size_t(task.d)])].kv->format->page_tokens;
    const int64_t step = std::max<int64_t>(1, (part + pt - 1) / pt);
    for (int64_t p0 = 0; p0 < st.np; p0 += step)
      split_units_[0].push_back({w, p0, std::min(st.np, p0 + step)});
    for (int64_t h = 0; h < task.nh; ++h) split_units_[1].push_back({w, h, h + 1});
    // Weighted sums: tasks whole while every thread gets one (a whole row's
    // V is read at the widest, fastest blocking); only the remainder that
    // would leave threads idle goes by head_dim ranges of 32.
    const int64_t pnt = split_plan_threads_ > 0 ? split_plan_threads_ : nt;
    if (w < n_tasks - n_tasks % pnt) {
      split_units_[2].push_back({w, 0, hd});
    } else {
      for (int64_t d0 = 0; d0 < hd; d0 += 32)
        split_units_[2].push_back({w, d0, std::min(hd, d0 + 32)});
    }
  }
  auto view_of = [&](int64_t w) {
    const DecodeTask& task = decode_tasks_[size_t(w)];
    const SplitTask& st = split_tasks_[size_t(w)];
    const StepChunk& c = plan.chunks[size_t(plan.decode_chunks[size_t(task.d)])];
    const uint8_t** kp = split_ptrs_.data() + st.p_off;
    const uint8_t** vp = kp + st.np;
    const uint16_t** ksp = reinterpret_cast<const uint16_t**>(vp + st.np);
    const uint16_t** vsp = ksp + st.np;
    return DecodeView{c, *c.kv->format, l, task.kvh, hd, kp, vp, ksp, vsp};
  };
  auto row_of = [&](int64_t w) {
    const DecodeTask& task = decode_tasks_[size_t(w)];
    return a.rows_by_token ? plan.chunks[size_t(plan.decode_chunks[size_t(task.d)])].t0 : task.d;
  };
  const int64_t n0 = int64_t(split_units_[0].size()), n1 = int64_t(split_units_[1].size()),
                n2 = int64_t(split_units_[2].size());
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n0; ++u) {
      const SplitUnit& su = split_units_[0][size_t(u)];
      const DecodeTask& task = decode_tasks_[size_t(su.task)];
      const SplitTask& st = split_tasks_[size_t(su.task)];
      const DecodeView v = view_of(su.task);
      const int64_t pt = v.f.page_tokens;
      for (int64_t p = su.a0; p < su.a1; ++p) v.point(p, p * pt);
      // The view of pages [a0, a1): pointer arrays from entry a0.
      const DecodeView part_v{v.c,           v.f,          l, v.kvh, hd, v.kp + su.a0, v.vp + su.a0,
                              v.ksp + su.a0, v.vsp + su.a0};
      const int64_t t0 = su.a0 * pt, n = std::min(st.n, su.a1 * pt) - t0;
      K_.paged_attn_scores(a.q.row(row_of(su.task)) + task.h0 * hd, task.nh, hd, a.scale,
                           part_v.kv(n, pt), split_scores_.data() + st.s_off + t0, st.lds);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n1; ++u) {
      const SplitUnit& su = split_units_[1][size_t(u)];
      const SplitTask& st = split_tasks_[size_t(su.task)];
      const DecodeView v = view_of(su.task);
      K_.paged_attn_probs(split_scores_.data() + st.s_off + su.a0 * st.lds, st.lds, 1,
                          v.kv(st.n, v.f.page_tokens));
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n2; ++u) {
      const SplitUnit& su = split_units_[2][size_t(u)];
      const DecodeTask& task = decode_tasks_[size_t(su.task)];
      const SplitTask& st = split_tasks_[size_t(su.task)];
      const DecodeView v = view_of(su.task);
      K_.paged_attn_wsum(split_scores_.data() + st.s_off, st.lds, task.nh, hd,
                         v.kv(st.n, v.f.page_tokens), su.a0, su.a1,
                         a.out.row(row_of(su.task)) + task.h0 * hd);
    }
  }
}

// Causal (optionally windowed, soft-capped or sparse) softmax attention of
// consecutive tokens of one head per task. Each token's result is bitwise
// what it gets alone (attn_*_multi's contract), so chunking does not change
// it. Tasks are head-major: consecutive tasks read the same KV head's rows,
// so a thread's working set is one head's K and V.
void CpuBackend::attention_prefill(const StepPlan& plan, const PrefillAttn& a) {
  if (!plan.any_prefill) return;
  // The query heads that share a KV head go in one task where the multi-query
  // kernels exist and their scores fit (kGroupScoreBytes a thread): a K or V
  // row is then widened once for all of them, not once per head.
  const int64_t nh = K_.attn_scores_multi && K_.attn_weighted_sum_multi && a.group > 1 &&
                             a.group * kPrefillQueries * plan.max_ctx * 4 <= kGroupScoreBytes
                         ? a.group
                         : 1;
  if (prefill_key_[0] != step_ || prefill_key_[1] != a.heads || prefill_key_[2] != nh) {
    prefill_tasks_.clear();
    for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
      const StepChunk& c = plan.chunks[ci];
      if (c.decodes()) continue;
      for (int64_t h = 0; h < a.heads; h += nh)
        for (int64_t i = 0; i < c.n_tokens; i += kPrefillQueries)
          prefill_tasks_.push_back(
              {int64_t(ci), c.t0 + i, h, std::min(kPrefillQueries, c.n_tokens - i), nh});
    }
    prefill_key_[0] = step_;
    prefill_key_[1] = a.heads;
    prefill_key_[2] = nh;
  }
  ensure_attention(nh * kPrefillQueries, plan.max_ctx, std::max(plan.max_pages, plan.max_ctx));
  const int64_t n_tasks = int64_t(prefill_tasks_.size());
  const int nt = threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_tasks > 1 && nt > 1)
  for (int64_t w = 0; w < n_tasks; ++w) {
    const int tid = omp_get_thread_num();
    float* sc = scores_for(tid);
    const PrefillTask& task = prefill_tasks_[size_t(w)];
    const StepChunk& c = plan.chunks[size_t(task.chunk)];
    const int64_t h = task.h, kvh = h / a.group, g0 = c.gather_off - c.gather_j0;
    const uint16_t* kbase = a.k.data + kvh * a.k_head_stride;
    const uint16_t* vbase = a.v.data + kvh * a.v_head_stride;
    int64_t j0s[kPrefillQueries], ns[kPrefillQueries];
    bool same_start = true;
    for (int64_t i = 0; i < task.n; ++i) {
      const int64_t pos = plan.tokens[size_t(task.t + i)].pos;
      j0s[i] = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      ns[i] = pos - j0s[i] + 1;
      same_start = same_start && j0s[i] == j0s[0];
    }
    // Soft-capping, then (DSA) the positions the indexer did not choose masked out.
    auto adjust = [&](int64_t i, float* row) {
      if (a.softcap > 0.f)
        for (int64_t j = 0; j < ns[i]; ++j) row[j] = std::tanh(row[j] / a.softcap) * a.softcap;
      if (a.topk <= 0 || !a.sparse[task.t + i]) return;
      uint8_t* keep = dsa_keep_.data() + int64_t(tid) * ctx_;
      std::fill(keep, keep + ns[i], uint8_t(0));
      const int32_t* sel = a.sel + (task.t + i) * a.topk;
      for (int64_t p = 0; p < a.topk; ++p) keep[sel[p]] = 1;
      for (int64_t j = 0; j < ns[i]; ++j)
        if (!keep[j]) row[j] = -INFINITY;
    };
    if (task.n * task.nh > 1 && same_start && K_.attn_scores_multi && K_.attn_weighted_sum_multi) {
      // Query (head hl, token i) is row hl * n + i of contiguous copies; each
      // result is its one-query value (the multi kernels' contract).
      const int64_t n = task.n, m = task.nh * n, row0 = g0 + j0s[0], n_max = ns[n - 1];
      thread_local std::vector<float> qb, ob;
      thread_local std::vector<int64_t> nb;
      qb.resize(size_t(m * a.head_dim));
      ob.resize(size_t(m * a.v_dim));
      nb.resize(size_t(m));
      for (int64_t hl = 0; hl < task.nh; ++hl)
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(qb.data() + (hl * n + i) * a.head_dim,
                      a.q.row(task.t + i) + (h + hl) * a.q_head_stride, size_t(a.head_dim) * 4);
          nb[size_t(hl * n + i)] = ns[i];
        }
      K_.attn_scores_multi(qb.data(), a.head_dim, m, kbase + row0 * a.k.ld, a.k.ld, n_max,
                           a.head_dim, a.scale, sc, n_max);
      for (int64_t r = 0; r < m; ++r) {
        adjust(r % n, sc + r * n_max);
        K_.softmax(sc + r * n_max, ns[r % n]);
      }
      K_.attn_weighted_sum_multi(sc, n_max, nb.data(), m, vbase + row0 * a.v.ld, a.v.ld, a.v_dim,
                                 ob.data(), a.v_dim);
      for (int64_t hl = 0; hl < task.nh; ++hl)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(a.out.row(task.t + i) + (h + hl) * a.v_dim,
                      ob.data() + (hl * n + i) * a.v_dim, size_t(a.v_dim) * 4);
      continue;
    }
    // One query at a time (a sliding window gives each token its own first row).
    for (int64_t hh = h; hh < h + task.nh; ++hh)
      for (int64_t i = 0; i < task.n; ++i) {
        const int64_t row0 = g0 + j0s[i];
        K_.attn_scores(a.q.row(task.t + i) + hh * a.q_head_stride, kbase + row0 * a.k.ld, a.k.ld,
                       ns[i], a.head_dim, a.scale, sc);
        adjust(i, sc);
        K_.softmax(sc, ns[i]);
        K_.attn_weighted_sum(sc, vbase + row0 * a.v.ld, a.v.ld, ns[i], a.v_dim,
                             a.out.row(task.t + i) + hh * a.v_dim);
      }
  }
}

}  // namespace kvant::backend
