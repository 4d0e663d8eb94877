// The CUDA backend's host side (cuda_backend.h): weights uploaded at prepare
// time, host memory staged per operation, the row and product operations,
// MoE's permutation and combination on the device and its routing on the
// CPU backend. The step's device tables, KV pages and attention are in
// cuda_backend_kv.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/device_math.h"
#include "kernels/cpu/kernels.h"

namespace kvant::backend {
namespace cuda_impl {

void ck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "kvant cuda backend: %s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

// Managed allocations this process's CUDA backends made (alloc), by start:
// a pointer inside one needs no driver query.
std::mutex g_ranges_mu;
std::map<uintptr_t, size_t> g_ranges;

// Memory a kernel can read: device or managed (or host memory registered
// and mapped, which reports a device pointer).
bool device_accessible(const void* p) {
  if (!p) return true;
  {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    auto it = g_ranges.upper_bound(a);
    if (it != g_ranges.begin() && a < std::prev(it)->first + std::prev(it)->second) return true;
  }
  cudaPointerAttributes at{};
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

// log2 of a power-of-two group size, else -1 (the products then take the
// general kernel).
int32_t group_shift(int64_t group) {
  for (int32_t b = 0; b < 40; ++b)
    if (int64_t(1) << b == group) return b;
  return -1;
}

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}


Matrix CudaBackend::prepare_bf16(const uint16_t* w, int64_t rows, int64_t cols) const {
  Matrix m = cpu_.prepare_bf16(w, rows, cols);
  Resident r;
  const size_t bytes = size_t(rows * cols) * 2;
  void* d = dev_alloc(bytes);
  ck(cudaMemcpy(d, w, bytes, cudaMemcpyHostToDevice), "upload bf16 weights");
  r.bufs.push_back(d);
  r.w.kind = cuda::WKind::kBf16;
  r.w.n = rows;
  r.w.k = cols;
  r.w.bf16 = static_cast<const uint16_t*>(d);
  keep(m.packed.data(), std::move(r));
  return m;
}

Q4Matrix CudaBackend::prepare_int4(const int8_t* q, const float* scale, const int8_t* zero,
                                   int64_t rows, int64_t cols, int64_t group) const {
  Q4Matrix m = cpu_.prepare_int4(q, scale, zero, rows, cols, group);
  const int64_t G = (cols + group - 1) / group;
  std::vector<uint8_t> nib(size_t(rows * ((cols + 1) / 2)), 0x88);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint8_t& b = nib[size_t(r * ((cols + 1) / 2) + c / 2)];
      const uint8_t v = uint8_t(q[r * cols + c] + 8) & 0xf;
      b = (c & 1) ? uint8_t((b & 0x0f) | (v << 4)) : uint8_t((b & 0xf0) | v);
    }
  std::vector<float> sc(size_t(rows * G));
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = cuda_math::round_bf16(scale[i]);  // as the CPU keeps them
  Resident r;
  auto up = [&](const void* src, size_t bytes) {
    void* d = dev_alloc(bytes);
    ck(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice), "upload int4 weights");
    r.bufs.push_back(d);
    return d;
  };
  r.w.kind = cuda::WKind::kInt4;
  r.w.n = rows;
  r.w.k = cols;
  r.w.group = group;
  r.w.gshift = group_shift(group);
  r.w.q = static_cast<const uint8_t*>(up(nib.data(), nib.size()));
  r.w.scales = static_cast<const float*>(up(sc.data(), sc.size() * 4));
  if (zero) r.w.zeros = static_cast<const int8_t*>(up(zero, size_t(rows * G)));
  keep(m.w.data(), std::move(r));
  return m;
}

F8Matrix CudaBackend::prepare_fp8(const uint8_t* codes, const float* scale, int64_t rows,
                                  int64_t cols, int64_t group) const {
  F8Matrix m = cpu_.prepare_fp8(codes, scale, rows, cols, group);
  const int64_t G = (cols + group - 1) / group;
  Resident r;
  void* dq = dev_alloc(size_t(rows * cols));
  void* ds = dev_alloc(size_t(rows * G) * 4);
  ck(cudaMemcpy(dq, codes, size_t(rows * cols), cudaMemcpyHostToDevice), "upload fp8 codes");
  ck(cudaMemcpy(ds, scale, size_t(rows * G) * 4, cudaMemcpyHostToDevice), "upload fp8 scales");
  r.bufs = {dq, ds};
  r.w.kind = cuda::WKind::kFp8;
  r.w.n = rows;
  r.w.k = cols;
  r.w.group = group;
  r.w.gshift = group_shift(group);
  r.w.nan_codes = m.nan_codes ? 1 : 0;
  r.w.q = static_cast<const uint8_t*>(dq);
  r.w.scales = static_cast<const float*>(ds);
  keep(m.w.data(), std::move(r));
  return m;
}

DeviceBuffer CudaBackend::alloc(size_t bytes) {
  if (bytes == 0) return {};
  void* p = nullptr;
  ck(cudaMallocManaged(&p, bytes), "cudaMallocManaged");
  int dev = 0;
  cudaGetDevice(&dev);
#if CUDART_VERSION >= 13000
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc);
#else
  cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, dev);
#endif
  cudaGetLastError();  // the advice is a hint
  ck(cudaMemset(p, 0, bytes), "cudaMemset");
  ck(cudaDeviceSynchronize(), "alloc");
  {
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    g_ranges[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  return DeviceBuffer(p, bytes, [](void* q, size_t) {
    cudaDeviceSynchronize();
    {
      std::lock_guard<std::mutex> lock(g_ranges_mu);
      g_ranges.erase(reinterpret_cast<uintptr_t>(q));
    }
    cudaFree(q);
  });
}

void CudaBackend::begin_step(const StepPlan& plan) {
  ++step_;
  plan_ = &plan;
  built_step_ = -1;
}

void CudaBackend::embed(const Matrix& table, int64_t row0, const int32_t* tokens, float scale,
                        F32 out) {
  auto it = weights_.find(table.packed.data());
  if (it == weights_.end()) {
    sync();
    return cpu_.embed(table, row0, tokens, scale, out);
  }
  Stager st(stage_);
  const F32 o = st.view(out, true);
  const int32_t* tk = st.get(tokens, size_t(out.rows), false);
  cuda::embed(it->second.w.bf16, table.rows, table.cols, row0, tk, scale, o.data, o.ld, o.rows, s_);
}

void CudaBackend::rmsnorm(CF32 x, const float* w, float eps, F32 y) {
  const float* wd = constant(w, size_t(x.cols));
  Stager st(stage_);
  if (y.data == x.data) {  // in place
    const F32 yd = st.view(y, true);
    cuda::rmsnorm(yd.data, yd.ld, wd, eps, yd.data, yd.ld, x.rows, x.cols, 1, s_);
    return;
  }
  const CF32 xd = st.view(x, false);
  const F32 yd = st.view(y, true);
  cuda::rmsnorm(xd.data, xd.ld, wd, eps, yd.data, yd.ld, x.rows, x.cols, 1, s_);
}

void CudaBackend::rmsnorm_heads(F32 x, int64_t heads, int64_t hd, const float* w, float eps) {
  const float* wd = constant(w, size_t(hd));
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  cuda::rmsnorm(xd.data, xd.ld, wd, eps, xd.data, xd.ld, x.rows, heads * hd, heads, s_);
}

void CudaBackend::layernorm(F32 x, const float* w, const float* b, double eps) {
  const float* wd = constant(w, size_t(x.cols));
  const float* bd = constant(b, size_t(x.cols));
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  cuda::layernorm(xd.data, xd.ld, wd, bd, eps, x.rows, x.cols, s_);
}

void CudaBackend::add(F32 x, CF32 y) {
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  const CF32 yd = st.view(y, false);
  cuda::add(xd.data, xd.ld, yd.data, yd.ld, nullptr, x.rows, x.cols, s_);
}

void CudaBackend::add_bias(F32 x, const float* b) {
  const float* bd = constant(b, size_t(x.cols));
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  cuda::add(xd.data, xd.ld, nullptr, 0, bd, x.rows, x.cols, s_);
}

void CudaBackend::gated_act(GateAct act, CF32 gu, F32 out) {
  Stager st(stage_);
  const CF32 g = st.view(gu, false);
  const F32 o = st.view(out, true);
  cuda::gated_act(act == GateAct::kGeluTanh ? 1 : 0, g.data, g.ld, o.data, o.ld, out.rows, out.cols, s_);
}

void CudaBackend::softcap(F32 x, float cap) {
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  cuda::softcap(xd.data, xd.ld, cap, x.rows, x.cols, s_);
}

void CudaBackend::copy_rows(CF32 src, const int64_t* src_rows, F32 dst, const int64_t* dst_rows,
                            int64_t n) {
  if (n == 0) return;
  Stager st(stage_);
  // The views' whole extent: rows may be addressed in any order.
  const CF32 s = st.view(src, false);
  const F32 d = st.view(dst, true);
  const int64_t* sr = st.get(src_rows, size_t(n), false);
  const int64_t* dr = st.get(dst_rows, size_t(n), false);
  cuda::copy_rows(s.data, s.ld, sr, d.data, d.ld, dr, n, src.cols, s_);
}

void CudaBackend::linear(CF32 x, LinearRef w, F32 y) {
  const cuda::DevWeights* dw = resident(w);
  if (!dw) {
    sync();
    return cpu_.linear(x, w, y);
  }
  Stager st(stage_);
  const CF32 xd = st.view(x, false);
  const F32 yd = st.view(y, true);
  auto* xb = static_cast<uint16_t*>(xb_.get(size_t(cuda::linear_scratch_bytes(x.rows, *dw))));
  cuda::linear(xd.data, xd.ld, x.rows, *dw, yd.data, yd.ld, xb, s_);
}

// The routing is the CPU backend's: the T x E logits come to the host in one
// copy and the T x k choices go back in two (copies, not page faults on the
// managed buffers).
void CudaBackend::moe_route(const RouterConfig& rc, CF32 logits, const float* bias, int32_t* ids,
                            float* weights) {
  if (logits.rows == 0) return;
  const size_t n = size_t(logits.rows * logits.cols), nk = size_t(logits.rows * rc.top_k);
  route_logits_.resize(n);
  route_w_.resize(nk);
  route_ids_.resize(nk);
  ck(cudaMemcpy2D(route_logits_.data(), size_t(logits.cols) * 4, logits.data, size_t(logits.ld) * 4,
                  size_t(logits.cols) * 4, size_t(logits.rows), cudaMemcpyDefault),
     "router logits");
  cpu_.moe_route(rc, dense(static_cast<const float*>(route_logits_.data()), logits.rows, logits.cols),
                 bias, route_ids_.data(), route_w_.data());
  ck(cudaMemcpy(ids, route_ids_.data(), nk * 4, cudaMemcpyDefault), "expert choices");
  ck(cudaMemcpy(weights, route_w_.data(), nk * 4, cudaMemcpyDefault), "expert weights");
}

// The counting sort on the host (the choices are host memory, written by
// moe_route; the model reads the offsets back), the rows moved on the device.
void CudaBackend::moe_permute(const int32_t* ids, int64_t k, int64_t E, CF32 x, F32 xs,
                              const MoeSort& s) {
  const int64_t n = x.rows * k;
  moe_counting_sort(ids, n, E, s);
  src_rows_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) src_rows_[size_t(i)] = i / k;
  copy_rows(x, src_rows_.data(), xs, s.slot, n);
}

void CudaBackend::moe_combine(CF32 ys, const float* weights, const int64_t* slot, int64_t k,
                              F32 out) {
  if (out.rows == 0) return;
  Stager st(stage_);
  const size_t n = size_t(out.rows * k);
  const CF32 y = st.view(ys, false);
  const F32 o = st.view(out, true);
  const float* w = st.get(weights, n, false);
  const int64_t* sl = st.get(slot, n, false);
  cuda::moe_combine(y.data, y.ld, w, sl, k, o.data, o.ld, out.rows, out.cols, s_);
}

void CudaBackend::rope_table(const StepPlan& plan, const float* inv_freq, int64_t n,
                             float attn_factor, F32 cos, F32 sin) {
  // The CPU's own cos/sin (bitwise the reference tables), then one upload.
  const int64_t T = plan.n_tokens();
  std::vector<float> c(size_t(T * n)), s(size_t(T * n));
  for (int64_t t = 0; t < T; ++t) {
    const float pos = float(plan.tokens[size_t(t)].pos);
    for (int64_t j = 0; j < n; ++j) {
      const float a = pos * inv_freq[j];
      c[size_t(t * n + j)] = std::cos(a) * attn_factor;
      s[size_t(t * n + j)] = std::sin(a) * attn_factor;
    }
  }
  if (T == 0 || n == 0) return;
  sync();
  ck(cudaMemcpy2D(cos.data, size_t(cos.ld) * 4, c.data(), size_t(n) * 4, size_t(n) * 4, size_t(T),
                  cudaMemcpyDefault), "rope table");
  ck(cudaMemcpy2D(sin.data, size_t(sin.ld) * 4, s.data(), size_t(n) * 4, size_t(n) * 4, size_t(T),
                  cudaMemcpyDefault), "rope table");
}

void CudaBackend::rope(F32 x, int64_t heads, int64_t stride, int64_t dim, CF32 cos, CF32 sin,
                       bool interleave) {
  Stager st(stage_);
  const F32 xd = st.view(x, true);
  const CF32 c = st.view(cos, false), s = st.view(sin, false);
  cuda::rope(xd.data, xd.ld, x.rows, heads, stride, dim, c.data, c.ld, s.data, s.ld, interleave ? 1 : 0, s_);
}

}  // namespace cuda_impl


int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  if (cuda_device_count() == 0) {
    if (why) *why = "no CUDA device (driver or GPU missing)";
    return nullptr;
  }
  return std::make_unique<cuda_impl::CudaBackend>();
}

}  // namespace kvant::backend
