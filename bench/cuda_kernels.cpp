// kvant_bench_cuda: the CUDA backend's hot operations timed on device-resident
// data through the backend interface, as bytes moved per second against the
// GPU's memory bandwidth (--peak-gbs, 4800 for an H200's HBM3e). One JSON
// object per line, then a table on stderr.
//  - linear, one activation row (decode GEMV): BF16, INT4 (group 128) and
//    FP8 weights, large matrices; bytes = the weights read once.
//  - paged decode attention over BF16 and FP8 e4m3 pages (dynamic scales),
//    GQA 64 query / 8 KV heads of 128, batch x context; bytes = every K and
//    V row (and scale) of every sequence read once.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kvcache/kv_layout.h"
#include "kvcache/kv_view.h"
#include "numerics/bf16.h"

using namespace kvant;
using namespace kvant::backend;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: `reps` calls after two warm-ups, timed to the device's end.
template <class Fn>
double time_op(Fn&& fn, int reps) {
  fn();
  fn();
  cudaDeviceSynchronize();
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) fn();
  cudaDeviceSynchronize();
  return (now_s() - t0) / reps;
}

struct Row {
  std::string op, shape;
  double bytes, seconds;
};

void report(std::vector<Row>& rows, const Row& r, double peak) {
  rows.push_back(r);
  const double gbs = r.bytes / r.seconds / 1e9;
  std::printf("{\"op\": \"%s\", \"shape\": \"%s\", \"bytes\": %.0f, \"us\": %.2f, \"gbs\": %.1f, "
              "\"of_peak\": %.3f}\n",
              r.op.c_str(), r.shape.c_str(), r.bytes, r.seconds * 1e6, gbs, gbs / peak);
  std::fflush(stdout);
}

void bench_linear(Backend& be, std::vector<Row>& rows, double peak, int reps) {
  std::mt19937 rng(1);
  struct Shape { int64_t n, k; };
  for (Shape s : {Shape{8192, 8192}, Shape{28672, 8192}, Shape{8192, 28672}}) {
    const std::string shape = std::to_string(s.n) + "x" + std::to_string(s.k);
    DeviceBuffer xb = be.alloc(size_t(8 * s.k) * 4), yb = be.alloc(size_t(8 * s.n) * 4);
    std::vector<float> xh(size_t(8 * s.k));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& v : xh) v = u(rng);
    cudaMemcpy(xb.data(), xh.data(), xh.size() * 4, cudaMemcpyDefault);
    const CF32 x = dense(static_cast<const float*>(xb.data()), 1, s.k);
    const F32 y = dense(static_cast<float*>(yb.data()), 1, s.n);
    {
      std::vector<uint16_t> w(size_t(s.n * s.k));
      for (auto& v : w) v = f32_to_bf16(u(rng) * 0.05f);
      Matrix m = be.prepare_bf16(w.data(), s.n, s.k);
      const double t = time_op([&] { be.linear(x, {&m, nullptr}, y); }, reps);
      report(rows, {"gemv_bf16", shape, double(s.n * s.k) * 2, t}, peak);
    }
    {
      const int64_t g = 128, G = s.k / g;
      std::vector<int8_t> q(size_t(s.n * s.k));
      for (auto& v : q) v = int8_t(int(rng() % 16) - 8);
      std::vector<float> sc(size_t(s.n * G), 0.01f);
      QMatrix qm;
      qm.q4 = be.prepare_int4(q.data(), sc.data(), nullptr, s.n, s.k, g);
      const double t = time_op([&] { be.linear(x, {nullptr, &qm}, y); }, reps);
      report(rows, {"gemv_int4_g128", shape, double(s.n * s.k) / 2 + double(s.n * G) * 4, t}, peak);
    }
    {
      const int64_t g = 128, G = s.k / g;
      std::vector<uint8_t> c(size_t(s.n * s.k));
      for (auto& v : c) v = uint8_t(rng() % 0x7e) | uint8_t(rng() & 0x80);
      std::vector<float> sc(size_t(s.n * G), 0.01f);
      QMatrix qm;
      qm.f8 = be.prepare_fp8(c.data(), sc.data(), s.n, s.k, g);
      const double t = time_op([&] { be.linear(x, {nullptr, &qm}, y); }, reps);
      report(rows, {"gemv_fp8_b128", shape, double(s.n * s.k) + double(s.n * G) * 4, t}, peak);
    }
  }
}

void bench_decode(Backend& be, std::vector<Row>& rows, double peak, int reps) {
  const int64_t heads = 64, kvh = 8, hd = 128, pt = 16;
  struct Case { int64_t batch, ctx; };
  for (KvDType dt : {KvDType::kBf16, KvDType::kFp8E4m3})
    for (Case cs : {Case{1, 32768}, Case{8, 32768}, Case{64, 4096}, Case{64, 16384}}) {
      KvGeometry g;
      g.layers = 1;
      g.kv_heads = kvh;
      g.head_dim = hd;
      g.dtype = dt;
      g.page_tokens = pt;
      g.scale_mode = dt == KvDType::kBf16 ? KvScaleMode::kNone : KvScaleMode::kDynamic;
      auto layout = make_kv_layout(g);
      if (!layout.ok()) return;
      const KvFormat fmt = kv_format(*layout);
      const int64_t pages_per = cs.ctx / pt, n_pages = pages_per * cs.batch;
      DeviceBuffer arena = be.alloc(size_t(n_pages * layout->page_bytes));
      // 0x38: e4m3 1.0 codes and small BF16 values and scales, all finite.
      cudaMemset(arena.data(), 0x38, size_t(n_pages * layout->page_bytes));
      std::vector<uint8_t*> ptrs;
      for (int64_t p = 0; p < n_pages; ++p)
        ptrs.push_back(static_cast<uint8_t*>(arena.data()) + p * layout->page_bytes);
      std::vector<KvSpan> spans;
      for (int64_t b = 0; b < cs.batch; ++b) spans.push_back({&fmt, ptrs.data() + b * pages_per, pages_per});
      StepPlan plan;
      for (int64_t b = 0; b < cs.batch; ++b) {
        plan.chunks.push_back({&spans[size_t(b)], cs.ctx - 1, 1, b});
        plan.tokens.push_back({int32_t(b), cs.ctx - 1});
        plan.decode_chunks.push_back(b);
        plan.decode_rows.push_back(b);
      }
      plan.max_ctx = cs.ctx;
      plan.max_pages = pages_per;
      DeviceBuffer qb = be.alloc(size_t(cs.batch * heads * hd) * 4), ob = be.alloc(size_t(cs.batch * heads * hd) * 4);
      cudaMemset(qb.data(), 0, size_t(cs.batch * heads * hd) * 4);
      DecodeAttn a;
      a.layer = 0;
      a.q = dense(static_cast<const float*>(qb.data()), cs.batch, heads * hd);
      a.out = dense(static_cast<float*>(ob.data()), cs.batch, heads * hd);
      a.heads = heads;
      a.kv_heads = kvh;
      a.head_dim = hd;
      a.head_block = 8;
      a.scale = 0.088f;
      be.begin_step(plan);
      const double t = time_op([&] { be.attention_decode(plan, a); }, reps);
      const double row = double(kvh * hd) * (dt == KvDType::kBf16 ? 2 : 1) +
                         (dt == KvDType::kBf16 ? 0 : double(kvh) * 2);
      const double bytes = 2 * row * double(cs.ctx) * double(cs.batch);
      report(rows,
             {std::string("decode_attn_") + (dt == KvDType::kBf16 ? "bf16" : "fp8_e4m3"),
              "b" + std::to_string(cs.batch) + "_ctx" + std::to_string(cs.ctx) + "_h64_kv8_d128",
              bytes, t},
             peak);
    }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvant_bench_cuda: CUDA backend kernels against the memory bandwidth"};
  double peak = 4800;
  int reps = 50;
  app.add_option("--peak-gbs", peak, "the GPU's memory bandwidth in GB/s (H200: 4800)");
  app.add_option("--reps", reps, "timed calls per case");
  CLI11_PARSE(app, argc, argv);
  auto be = make_backend("cuda");
  if (!be) {
    std::fprintf(stderr, "kvant_bench_cuda: no CUDA backend here (not a CUDA build, or no GPU)\n");
    return 2;
  }
  std::fprintf(stderr, "device: %s\n", be->device().c_str());
  std::vector<Row> rows;
  {
    // What the memory moves for a plain copy (bytes read and written), as the
    // measured ceiling beside the nominal one.
    const size_t bytes = size_t(2) << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
      const double t = time_op([&] { cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); }, 10);
      report(rows, {"copy_d2d", "2GiB", 2.0 * double(bytes), t}, peak);
    }
    cudaFree(a);
    cudaFree(b);
  }
  bench_linear(*be, rows, peak, reps);
  bench_decode(*be, rows, peak, reps);
  std::fprintf(stderr, "%-22s %-30s %10s %10s %8s\n", "op", "shape", "us", "GB/s", "of peak");
  for (const Row& r : rows) {
    const double gbs = r.bytes / r.seconds / 1e9;
    std::fprintf(stderr, "%-22s %-30s %10.2f %10.1f %7.1f%%\n", r.op.c_str(), r.shape.c_str(),
                 r.seconds * 1e6, gbs, 100 * gbs / peak);
  }
  return 0;
}
