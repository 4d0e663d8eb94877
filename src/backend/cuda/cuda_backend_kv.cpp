// The CUDA backend's step tables, KV pages and attention (cuda_backend_impl.h):
// the step plan as device tables (built once per step when the pages are
// device memory, per operation when they are host memory and staged), the
// KV stores and gathers, and the two attention kernels' arguments. Operations
// the kernels do not take (wider heads, mixed page formats) run on the CPU
// backend after a device synchronization.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "backend/cuda/cuda_backend_impl.h"

namespace kvant::backend::cuda_impl {

CudaBackend::Step CudaBackend::step_tables(const StepPlan& plan, int64_t layer) {
  Step out;
  staged_.clear();
  if (plan.chunks.empty()) return out;
  const KvFormat& f = *plan.chunks[0].kv->format;
  for (const auto& c : plan.chunks)
    if (c.kv->format != &f && (c.kv->format->layer_bytes != f.layer_bytes ||
                               c.kv->format->elem != f.elem || c.kv->format->dynamic_scales != f.dynamic_scales))
      return out;
  // A pool's pages are all of one kind: each chunk's first page tells.
  bool host_pages = false;
  for (const auto& c : plan.chunks)
    if (c.kv->n_pages > 0 && !device_accessible(c.kv->pages[0])) host_pages = true;
  const bool reuse = !host_pages && &plan == plan_ && built_step_ == step_;
  if (!reuse) {
    // Pack every table into one host buffer, then one upload. The vectors
    // are members: a steady state allocates nothing.
    auto& [chunks, pages, tok_chunk, tok_pos, gather, tasks, tok_writes] = host_tables_;
    chunks.clear();
    pages.clear();
    tok_chunk.clear();
    tok_pos.clear();
    gather.clear();
    tasks.clear();
    std::unordered_map<uint8_t*, uint8_t*> seen;  // host pages only (tests)
    if (host_pages) {
      int64_t n = 0;
      for (const auto& c : plan.chunks) n += c.kv->n_pages;
      staged_bytes_ = n * f.layer_bytes;
    }
    auto* blocks = host_pages ? static_cast<uint8_t*>(staged_pages_.get(size_t(staged_bytes_))) : nullptr;
    int64_t next_block = 0;
    for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
      const StepChunk& c = plan.chunks[ci];
      cuda::DevChunk d{c.pos0, c.n_tokens, c.t0, c.gather_off, c.gather_j0, int64_t(pages.size()), c.kv->n_pages};
      for (int64_t p = 0; p < c.kv->n_pages; ++p) {
        uint8_t* pg = c.kv->pages[p];
        if (!host_pages) {
          pages.push_back(pg);
          continue;
        }
        auto it = seen.find(pg);
        if (it == seen.end()) {
          uint8_t* dst = blocks + next_block++ * f.layer_bytes;
          ck(cudaMemcpy(dst, pg + layer * f.layer_bytes, size_t(f.layer_bytes), cudaMemcpyHostToDevice),
             "stage page");
          it = seen.emplace(pg, dst).first;
          staged_.push_back({pg + layer * f.layer_bytes, dst});
        }
        pages.push_back(it->second);
      }
      chunks.push_back(d);
      if (!c.decodes()) {
        for (int64_t j = c.gather_j0; j < c.pos0 + c.n_tokens; ++j) gather.push_back(int64_t(ci) << 40 | j);
        for (int64_t t = c.t0; t < c.t0 + c.n_tokens; t += cuda::kPrefillQ) tasks.push_back(int64_t(ci) << 40 | t);
      }
    }
    for (const auto& t : plan.tokens) {
      tok_chunk.push_back(t.chunk);
      tok_pos.push_back(t.pos);
    }
    // Two tokens of one step writing one slot (only in tests that give two
    // chunks one span): the later one stores, as on the CPU.
    tok_writes.assign(plan.tokens.size(), 1);
    bool shared_span = false;
    for (size_t a = 0; a < plan.chunks.size() && !shared_span; ++a)
      for (size_t b = a + 1; b < plan.chunks.size() && !shared_span; ++b)
        shared_span = plan.chunks[a].kv == plan.chunks[b].kv;
    if (shared_span) {
      std::unordered_map<const uint8_t*, size_t> last;
      for (size_t t = 0; t < plan.tokens.size(); ++t) {
        const StepChunk& c = plan.chunks[size_t(plan.tokens[t].chunk)];
        const int64_t pos = plan.tokens[t].pos;
        const uint8_t* key = c.kv->pages[pos / f.page_tokens] + (pos % f.page_tokens);
        auto [it, fresh] = last.emplace(key, t);
        if (!fresh) {
          tok_writes[it->second] = 0;
          it->second = t;
        }
      }
    }
    size_t off = 0;
    auto place = [&](size_t bytes) {
      const size_t o = off;
      off += (bytes + 15) / 16 * 16;
      return o;
    };
    const size_t o_chunks = place(chunks.size() * sizeof(cuda::DevChunk));
    const size_t o_pages = place(pages.size() * sizeof(uint8_t*));
    const size_t o_tc = place(tok_chunk.size() * 4), o_tp = place(tok_pos.size() * 8);
    const size_t o_dc = place(plan.decode_chunks.size() * 8), o_g = place(gather.size() * 8);
    const size_t o_t = place(tasks.size() * 8), o_w = place(tok_writes.size());
    host_meta_.assign(off, 0);
    auto put = [&](size_t o, const void* src, size_t bytes) {
      if (bytes) std::memcpy(host_meta_.data() + o, src, bytes);
    };
    put(o_chunks, chunks.data(), chunks.size() * sizeof(cuda::DevChunk));
    put(o_pages, pages.data(), pages.size() * sizeof(uint8_t*));
    put(o_tc, tok_chunk.data(), tok_chunk.size() * 4);
    put(o_tp, tok_pos.data(), tok_pos.size() * 8);
    put(o_dc, plan.decode_chunks.data(), plan.decode_chunks.size() * 8);
    put(o_g, gather.data(), gather.size() * 8);
    put(o_t, tasks.data(), tasks.size() * 8);
    put(o_w, tok_writes.data(), tok_writes.size());
    // The previous step's kernels may still read the tables: wait for them.
    sync();
    auto* dm = static_cast<uint8_t*>(meta_.get(off));
    ck(cudaMemcpy(dm, host_meta_.data(), off, cudaMemcpyHostToDevice), "step tables");
    cuda::DevStep& st = cached_.st;
    st.chunks = reinterpret_cast<const cuda::DevChunk*>(dm + o_chunks);
    st.pages = reinterpret_cast<uint8_t* const*>(dm + o_pages);
    st.tok_chunk = reinterpret_cast<const int32_t*>(dm + o_tc);
    st.tok_pos = reinterpret_cast<const int64_t*>(dm + o_tp);
    st.decode_chunks = reinterpret_cast<const int64_t*>(dm + o_dc);
    st.gather_rows = reinterpret_cast<const int64_t*>(dm + o_g);
    st.tok_writes = dm + o_w;
    st.n_tokens = plan.n_tokens();
    st.n_decode = int64_t(plan.decode_chunks.size());
    st.n_gather = int64_t(gather.size());
    st.max_ctx = plan.max_ctx;
    cached_.prefill_tasks = reinterpret_cast<const int64_t*>(dm + o_t);
    cached_.n_prefill_tasks = int64_t(tasks.size());
    if (!host_pages && &plan == plan_) built_step_ = step_;
  }
  out = cached_;
  out.ok = true;
  cuda::DevKvFormat& d = out.f;
  d.elem = int32_t(f.elem);
  d.kv_heads = int32_t(f.kv_heads);
  d.head_dim = int32_t(f.head_dim);
  d.page_tokens = int32_t(f.page_tokens);
  d.dynamic = f.dynamic_scales ? 1 : 0;
  d.layer_off = host_pages ? 0 : layer * f.layer_bytes;
  d.k_offset = f.k_offset;
  d.v_offset = f.v_offset;
  d.k_scale_offset = f.k_scale_offset;
  d.v_scale_offset = f.v_scale_offset;
  d.row_bytes = f.row_bytes();
  d.index_offset = f.index_offset;
  d.index_dim = f.index_dim;
  d.layer_bytes = f.layer_bytes;
  if (!f.static_k.empty()) {
    d.static_k = constant(f.static_k.data(), f.static_k.size()) + layer * f.kv_heads;
    d.static_v = f.shared_kv() || f.static_v.empty() ? d.static_k
                                    : constant(f.static_v.data(), f.static_v.size()) + layer * f.kv_heads;
  }
  return out;
}

void CudaBackend::pages_back(const StepPlan& plan, int64_t) {
  if (staged_.empty()) return;
  const int64_t lb = plan.chunks[0].kv->format->layer_bytes;
  for (auto& [host, dev] : staged_)
    ck(cudaMemcpy(host, dev, size_t(lb), cudaMemcpyDeviceToHost), "page back");
  staged_.clear();
}

void CudaBackend::kv_store(const StepPlan& plan, int64_t layer, CF32 k, CF32 v) {
  Stager st(stage_);
  const Step s = step_tables(plan, layer);
  if (!s.ok || (s.f.elem != 0 && !s.f.dynamic && !s.f.static_k)) {
    sync();
    return cpu_.kv_store(plan, layer, k, v);
  }
  const CF32 kd = st.view(k, false);
  const CF32 vd = st.view(v, false);
  cuda::kv_store(s.st, s.f, kd.data, kd.ld, vd.data, vd.ld, s_);
  pages_back(plan, layer);
}

void CudaBackend::kv_store_index(const StepPlan& plan, int64_t layer, CF32 k) {
  Stager st(stage_);
  const Step s = step_tables(plan, layer);
  if (!s.ok) {
    sync();
    return cpu_.kv_store_index(plan, layer, k);
  }
  const CF32 kd = st.view(k, false);
  cuda::kv_store_index(s.st, s.f, kd.data, kd.ld, s_);
  pages_back(plan, layer);
}

void CudaBackend::kv_gather(const StepPlan& plan, int64_t layer, CF32 k_new, CF32 v_new, BF16 k,
                            BF16 v) {
  if (!plan.any_prefill) return;
  Stager st(stage_);
  const Step s = step_tables(plan, layer);
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.kv_gather(plan, layer, k_new, v_new, k, v);
  }
  const CF32 kn = st.view(k_new, false), vn = st.view(v_new, false);
  const BF16 gk = st.view(k, true);
  const BF16 gv = v_new.data ? st.view(v, true) : BF16{};
  cuda::kv_gather(s.st, s.f, kn.data, kn.ld, vn.data, vn.ld, gk.data, gk.ld, gv.data, gv.ld, s_);
  staged_.clear();
}

void CudaBackend::attention_decode(const StepPlan& plan, const DecodeAttn& a) {
  if (plan.decode_chunks.empty()) return;
  const bool fits = a.head_dim <= cuda::kMaxAttnDim && a.head_dim % 2 == 0;
  Stager st(stage_);
  const Step s = fits ? step_tables(plan, a.layer) : Step{};
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.attention_decode(plan, a);
  }
  cuda::DecodeArgs d;
  const CF32 q = st.view(a.q, false);
  const F32 o = st.view(a.out, true);
  d.q = q.data;
  d.ldq = q.ld;
  d.out = o.data;
  d.ldo = o.ld;
  d.rows_by_token = a.rows_by_token ? 1 : 0;
  d.heads = int32_t(a.heads);
  d.kv_heads = int32_t(a.kv_heads);
  d.head_dim = int32_t(a.head_dim);
  d.scale = a.scale;
  d.window = a.window;
  d.topk = a.topk;
  if (a.topk > 0) {
    const size_t rows = size_t(plan.n_tokens());
    d.sel = st.get(a.sel, rows * size_t(a.topk), false);
    d.sparse = st.get(a.sparse, rows, false);
  }
  const int64_t nf = cuda::decode_partial_floats(s.st.n_decode, a.heads, a.head_dim, plan.max_ctx);
  auto* part = static_cast<float*>(partial_.get(size_t(nf) * 4));
  cuda::attention_decode(s.st, s.f, d, part, s_);
  staged_.clear();
}

void CudaBackend::attention_prefill(const StepPlan& plan, const PrefillAttn& a) {
  if (!plan.any_prefill) return;
  const bool fits = a.head_dim <= cuda::kMaxAttnDim && a.v_dim <= cuda::kMaxAttnDim;
  Stager st(stage_);
  const Step s = fits ? step_tables(plan, 0) : Step{};
  if (!s.ok) {
    sync();
    cpu_.begin_step(plan);
    return cpu_.attention_prefill(plan, a);
  }
  cuda::PrefillArgs p;
  const CF32 q = st.view(a.q, false);
  const CBF16 k = st.view(a.k, false), v = st.view(a.v, false);
  const F32 o = st.view(a.out, true);
  p.q = q.data;
  p.ldq = q.ld;
  p.q_head_stride = a.q_head_stride;
  p.k = k.data;
  p.ldk = k.ld;
  p.k_head_stride = a.k_head_stride;
  p.v = v.data;
  p.ldv = v.ld;
  p.v_head_stride = a.v_head_stride;
  p.out = o.data;
  p.ldo = o.ld;
  p.heads = int32_t(a.heads);
  p.group = int32_t(a.group);
  p.head_dim = int32_t(a.head_dim);
  p.v_dim = int32_t(a.v_dim);
  p.scale = a.scale;
  p.softcap = a.softcap;
  p.window = a.window;
  p.topk = a.topk;
  if (a.topk > 0) {
    const size_t rows = size_t(plan.n_tokens());
    p.sel = st.get(a.sel, rows * size_t(a.topk), false);
    p.sparse = st.get(a.sparse, rows, false);
  }
  cuda::attention_prefill(s.st, p, s.prefill_tasks, s.n_prefill_tasks, s_);
  staged_.clear();
}

}  // namespace kvant::backend::cuda_impl
