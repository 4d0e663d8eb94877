// Kernel micro-benchmarks (Google Benchmark): BF16 GEMM throughput on the
// SmolLM2-135M projection shapes for m = 1 (decode), 32 and 512 (prefill),
// plain and packed weights, 1 and 2 threads split over n as the model splits
// them; the FMA/VDPBF16PS peak each table can reach; STREAM-style memory
// bandwidth; decode attention over a 4,096-token paged context (BF16 vs FP8
// pages, GB/s of KV read); INT4 weight products (gemm_q4, every variant the
// CPU runs) and FP8 weight products (gemm_f8, 128x128 block scales) with the
// weight bytes they stream. Figures only, never pass/fail (see docs/BENCHMARKS.md).
//
// Weights rotate through enough copies (>= 192 MB, 4x this machine's L3) that
// every call reads them from DRAM, as a forward pass does.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "numerics/bf16.h"
#include "numerics/bf16.h"

namespace {

using kvant::AlignedBuffer;
using kvant::kernels::Isa;
using kvant::kernels::KernelTable;

constexpr int64_t kColdBytes = int64_t(192) << 20;

struct Shape {
  const char* name;
  int64_t k, n;
};
// SmolLM2-135M: hidden 576, 9 q heads / 3 kv heads of 64, MLP 1536, vocab 49152 (tied).
const Shape kShapes[] = {{"q_o_576x576", 576, 576},
                         {"kv_192x576", 576, 192},
                         {"gate_up_1536x576", 576, 1536},
                         {"down_576x1536", 1536, 576},
                         {"lm_head_49152x576", 576, 49152}};

uint64_t next(uint64_t& s) {
  s ^= s << 13, s ^= s >> 7, s ^= s << 17;
  return s;
}

void fill_bf16(uint16_t* p, int64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; ++i)
    p[i] = kvant::f32_to_bf16(float(int64_t(next(s) % 2001) - 1000) * 1e-3f);
}

// Copies of one weight matrix, plain and packed, for the shape last asked for.
struct WeightSet {
  int64_t n = 0, k = 0;
  std::vector<AlignedBuffer<uint16_t>> plain, packed;
};

const WeightSet& weights(int64_t n, int64_t k) {
  static WeightSet ws;
  if (ws.n == n && ws.k == k) return ws;
  ws = WeightSet{};
  ws.n = n, ws.k = k;
  const int64_t bytes = n * k * 2;
  const int64_t copies = std::max<int64_t>(1, (kColdBytes + bytes - 1) / bytes);
  const auto& T = kvant::kernels::active();
  for (int64_t c = 0; c < copies; ++c) {
    ws.plain.emplace_back(size_t(n * k));
    if (c == 0)
      fill_bf16(ws.plain[0].data(), n * k, 1);
    else
      std::memcpy(ws.plain[c].data(), ws.plain[0].data(), size_t(bytes));
    ws.packed.emplace_back(size_t(kvant::kernels::gemm_bf16_packed_size(n, k)));
    T.pack_bf16(ws.plain[c].data(), n, k, ws.packed[c].data());
  }
  return ws;
}

void bm_gemm(benchmark::State& state, const KernelTable* T, Shape shape, int64_t m, bool packed,
             int threads) {
  const WeightSet& ws = weights(shape.n, shape.k);
  const int64_t k = shape.k, n = shape.n;
  AlignedBuffer<uint16_t> x(size_t(m * k));
  fill_bf16(x.data(), m * k, 2);
  AlignedBuffer<float> y(size_t(m * n));
  kvant::set_num_threads(threads);
  size_t copy = 0;
  for (auto _ : state) {
    const uint16_t* w = packed ? ws.packed[copy].data() : ws.plain[copy].data();
    copy = (copy + 1) % ws.plain.size();
    kvant::parallel_for(n, 64, [&](int64_t n0, int64_t n1) {
      if (packed)
        T->gemm_bf16_packed(x.data(), k, w, k, y.data(), n, m, n0, n1);
      else
        T->gemm_bf16(x.data(), k, w, k, y.data(), n, m, n0, n1);
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double it = double(state.iterations());
  state.counters["GFLOPS"] =
      benchmark::Counter(2e-9 * double(m * n * k) * it, benchmark::Counter::kIsRate);
  state.counters["weight_GBps"] =
      benchmark::Counter(2e-9 * double(n * k) * it, benchmark::Counter::kIsRate);
  state.counters["m"] = double(m), state.counters["n"] = double(n), state.counters["k"] = double(k);
  state.counters["threads"] = threads;
}

// INT4 (Q4 P16) copies of one shape's weights, group size g, symmetric.
struct Q4Set {
  int64_t n = 0, k = 0, group = 0;
  std::vector<AlignedBuffer<uint8_t>> w;
  std::vector<AlignedBuffer<uint16_t>> scales;
  int64_t bytes() const { return int64_t(w[0].size() + scales[0].size() * 2); }
};

const Q4Set& q4_weights(int64_t n, int64_t k, int64_t group) {
  static Q4Set qs;
  if (qs.n == n && qs.k == k && qs.group == group) return qs;
  qs = Q4Set{};
  qs.n = n, qs.k = k, qs.group = group;
  const int64_t groups = kvant::kernels::q4_groups(k, group);
  std::vector<int8_t> q(size_t(n * k));
  std::vector<float> sc(size_t(n * groups));
  uint64_t st = 7;
  for (auto& v : q) v = int8_t(int64_t(next(st) % 16) - 8);
  for (auto& v : sc) v = float(int64_t(next(st) % 1000) + 1) * 1e-5f;
  const int64_t panels = kvant::kernels::q4_panels(n);
  const int64_t bytes = panels * k * 8 + panels * groups * 32;
  const int64_t copies = std::max<int64_t>(1, (kColdBytes + bytes - 1) / bytes);
  for (int64_t c = 0; c < copies; ++c) {
    qs.w.emplace_back(size_t(panels * k * 8));
    qs.scales.emplace_back(size_t(panels * groups * 16));
    kvant::kernels::pack_q4(q.data(), sc.data(), nullptr, n, k, group, qs.w[c].data(),
                            qs.scales[c].data(), nullptr);
  }
  return qs;
}

// gemm_q4 as the model calls it: activations quantized once (counted), then
// the product split over output rows.
void bm_gemm_q4(benchmark::State& state, const KernelTable* T,
                decltype(KernelTable::gemm_q4) fn, Shape shape, int64_t m, int64_t group,
                int threads) {
  const Q4Set& qs = q4_weights(shape.n, shape.k, group);
  const int64_t k = shape.k, n = shape.n, nb = k / kvant::kernels::kQ4Block;
  AlignedBuffer<float> x(size_t(m * k));
  uint64_t st = 3;
  for (int64_t i = 0; i < m * k; ++i) x[i] = float(int64_t(next(st) % 2001) - 1000) * 1e-3f;
  AlignedBuffer<int8_t> xq(size_t(m * k));
  AlignedBuffer<float> xs(size_t(m * nb));
  AlignedBuffer<int32_t> xsum(size_t(m * nb));
  AlignedBuffer<float> y(size_t(m * n));
  kvant::set_num_threads(threads);
  size_t copy = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < m; ++i)
      T->quantize_q8(x.data() + i * k, k, xq.data() + i * k, xs.data() + i * nb,
                     xsum.data() + i * nb);
    const kvant::kernels::Q4Weights w{qs.w[copy].data(), qs.scales[copy].data(), nullptr, n, k,
                                      group};
    copy = (copy + 1) % qs.w.size();
    const kvant::kernels::Q8Rows xr{xq.data(), xs.data(), xsum.data(), k, nb};
    kvant::parallel_for(n, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t i0 = 0; i0 < m; i0 += 64) {
        const kvant::kernels::Q8Rows xt{xr.q + i0 * k, xr.s + i0 * nb, xr.sum + i0 * nb, k, nb};
        fn(xt, w, y.data() + i0 * n, n, std::min<int64_t>(64, m - i0), n0, n1);
      }
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double it = double(state.iterations());
  state.counters["GFLOPS"] =
      benchmark::Counter(2e-9 * double(m * n * k) * it, benchmark::Counter::kIsRate);
  state.counters["weight_GBps"] =
      benchmark::Counter(1e-9 * double(qs.bytes()) * it, benchmark::Counter::kIsRate);
  state.counters["m"] = double(m), state.counters["n"] = double(n), state.counters["k"] = double(k);
  state.counters["threads"] = threads;
}

// FP8 (F8 P16) copies of one shape's weights: random finite codes, one FP32
// scale per 128x128 block (DeepSeek-V3 style), replicated per row.
struct F8Set {
  int64_t n = 0, k = 0;
  std::vector<AlignedBuffer<uint8_t>> w;
  std::vector<AlignedBuffer<float>> scales;
  float subnormal_share = 0.f;  // uniform codes: 1 in 16 (as the backend counts them)
  int64_t bytes() const { return int64_t(w[0].size() + scales[0].size() * 4); }
};

const F8Set& f8_weights(int64_t n, int64_t k) {
  static F8Set fs;
  if (fs.n == n && fs.k == k) return fs;
  fs = F8Set{};
  fs.n = n, fs.k = k;
  const int64_t groups = kvant::kernels::f8_groups(k, 128);
  std::vector<uint8_t> codes(size_t(n * k));
  std::vector<float> sc(size_t(n * groups));
  uint64_t st = 11;
  for (auto& v : codes) {
    v = uint8_t(next(st));
    if ((v & 0x7f) == 0x7f) v ^= 1;
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g) sc[size_t(r * groups + g)] = float((r / 128 + g) % 7 + 1) * 1e-4f;
  fs.subnormal_share = kvant::kernels::f8_subnormal_share(codes.data(), n * k);
  const int64_t panels = kvant::kernels::q4_panels(n);
  const int64_t bytes = kvant::kernels::f8_packed_bytes(n, k, 128) + panels * groups * 64;
  const int64_t copies = std::max<int64_t>(1, (kColdBytes + bytes - 1) / bytes);
  for (int64_t c = 0; c < copies; ++c) {
    fs.w.emplace_back(size_t(kvant::kernels::f8_packed_bytes(n, k, 128)));
    fs.scales.emplace_back(size_t(panels * groups * 16));
    kvant::kernels::pack_f8(codes.data(), sc.data(), n, k, 128, fs.w[c].data(), fs.scales[c].data());
  }
  return fs;
}

// gemm_f8 as the model calls it: BF16 activations, the product split over
// output rows, tokens in tiles of 64.
void bm_gemm_f8(benchmark::State& state, const KernelTable* T, Shape shape, int64_t m, int threads) {
  const F8Set& fs = f8_weights(shape.n, shape.k);
  const int64_t k = shape.k, n = shape.n;
  AlignedBuffer<uint16_t> x(size_t(m * k));
  fill_bf16(x.data(), m * k, 2);
  AlignedBuffer<float> y(size_t(m * n));
  kvant::set_num_threads(threads);
  size_t copy = 0;
  for (auto _ : state) {
    const kvant::kernels::F8Weights w{fs.w[copy].data(), fs.scales[copy].data(), n, k, 128, false,
                                      fs.subnormal_share};
    copy = (copy + 1) % fs.w.size();
    kvant::parallel_for(n, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t i0 = 0; i0 < m; i0 += 64)
        T->gemm_f8(x.data() + i0 * k, k, w, y.data() + i0 * n, n, std::min<int64_t>(64, m - i0),
                   n0, n1);
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double it = double(state.iterations());
  state.counters["GFLOPS"] =
      benchmark::Counter(2e-9 * double(m * n * k) * it, benchmark::Counter::kIsRate);
  state.counters["weight_GBps"] =
      benchmark::Counter(1e-9 * double(fs.bytes()) * it, benchmark::Counter::kIsRate);
  state.counters["m"] = double(m), state.counters["n"] = double(n), state.counters["k"] = double(k);
  state.counters["threads"] = threads;
}

void bm_peak(benchmark::State& state, const KernelTable* T, int threads) {
  constexpr int64_t kIters = 1 << 20;
  kvant::set_num_threads(threads);
  float sink = 0;
  for (auto _ : state) {
    kvant::parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) benchmark::DoNotOptimize(T->peak_probe(kIters));
    });
    benchmark::DoNotOptimize(sink);
  }
  state.counters["GFLOPS"] = benchmark::Counter(
      1e-9 * double(T->peak_flops_per_iter * kIters * threads) * double(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// STREAM-style kernels on 256 MB arrays of doubles (well past the 48 MB L3).
// Bytes counted as STREAM does: what the loop reads plus what it writes.
constexpr int64_t kStreamN = int64_t(32) << 20;

struct StreamArrays {
  AlignedBuffer<double> a{size_t(kStreamN)}, b{size_t(kStreamN)}, c{size_t(kStreamN)};
  StreamArrays() {
    for (int64_t i = 0; i < kStreamN; ++i) a[i] = 1.0, b[i] = 2.0, c[i] = 0.5;
  }
};
StreamArrays& stream_arrays() {
  static StreamArrays s;
  return s;
}

enum class StreamOp { Read, Read8, Copy, Triad };

void bm_stream(benchmark::State& state, StreamOp op, int threads) {
  StreamArrays& s = stream_arrays();
  kvant::set_num_threads(threads);
  double* a = s.a.data();
  double* b = s.b.data();
  double* c = s.c.data();
  for (auto _ : state) {
    kvant::parallel_for(kStreamN, 4096, [&](int64_t i0, int64_t i1) {
      switch (op) {
        case StreamOp::Read: {
          // Integer sums vectorise without reassociation concerns.
          const auto* u = reinterpret_cast<const uint64_t*>(a);
          uint64_t acc = 0;
          for (int64_t i = i0; i < i1; ++i) acc += u[i];
          benchmark::DoNotOptimize(acc);
          break;
        }
        case StreamOp::Read8: {
          // Eight sequential streams per thread, as the packed GEMV reads
          // eight weight panels at once: one stream per core leaves DRAM
          // bandwidth unused on this machine (the prefetchers track streams).
          const auto* u = reinterpret_cast<const uint64_t*>(a);
          const int64_t len = (i1 - i0) / 8;
          uint64_t acc[8] = {};
          for (int64_t i = 0; i < len; ++i)
            for (int s = 0; s < 8; ++s) acc[s] += u[i0 + s * len + i];
          for (int64_t i = i0 + 8 * len; i < i1; ++i) acc[0] += u[i];
          uint64_t t = 0;
          for (uint64_t v : acc) t += v;
          benchmark::DoNotOptimize(t);
          break;
        }
        case StreamOp::Copy:
          for (int64_t i = i0; i < i1; ++i) c[i] = a[i];
          break;
        case StreamOp::Triad:
          for (int64_t i = i0; i < i1; ++i) a[i] = b[i] + 3.0 * c[i];
          break;
      }
    });
    benchmark::ClobberMemory();
  }
  const double arrays = op == StreamOp::Read || op == StreamOp::Read8 ? 1
                        : op == StreamOp::Copy                        ? 2
                                                                      : 3;
  state.counters["GBps"] =
      benchmark::Counter(1e-9 * arrays * 8.0 * double(kStreamN) * double(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

// Decode attention at depth on SmolLM2-135M shapes: 30 layers x 3 KV heads of
// 64, GQA groups of 3, kTokens tokens in pages of kPage tokens; one iteration is one
// token's attention over every layer and KV head (about 94 MB of BF16 KV at
// 4,096 tokens, 377 MB at 16,384). FP8 uses dynamic per-(token, head) scales.
// head_major: a page block holds [kv_heads, page_tokens, head_dim] (one
// head's rows contiguous) instead of [page_tokens, kv_heads, head_dim].
// threads > 1: the (layer, head) calls are shared out as the CPU backend's
// decode does, one layer at a time.
void bm_paged_attn(benchmark::State& state, const KernelTable* T, kvant::KvDType elem,
                   bool dynamic_scales, int64_t kTokens, bool head_major, int threads,
                   int64_t kPage) {
  constexpr int64_t kLayers = 30, kKvHeads = 3, kHd = 64, kGroup = 3;
  const int64_t kPages = kTokens / kPage;
  const int64_t eb = elem == kvant::KvDType::kBf16 ? 2 : 1;
  const bool fp8 = eb == 1, dyn = fp8 && dynamic_scales;
  kvant::set_num_threads(threads);
  // Dynamic scales: BF16, [page_tokens, kv_heads] per block, padded to 64 bytes.
  const int64_t block = kPage * kKvHeads * kHd * eb, sblock = dyn ? (kPage * kKvHeads * 2 + 63) / 64 * 64 : 0;
  const int64_t layer_bytes = 2 * block + 2 * sblock, page_bytes = kLayers * layer_bytes;
  AlignedBuffer<uint8_t> arena(size_t(kPages * page_bytes));
  uint64_t seed = 7;
  for (int64_t i = 0; i < kPages * page_bytes; ++i)
    arena.data()[i] = uint8_t(0x30 | (next(seed) & 0x0f));  // normal in every dtype
  for (int64_t p = 0; p < kPages; ++p)                      // scales: plausible positive values
    for (int64_t l = 0; l < kLayers && dyn; ++l) {
      auto* sc =
          reinterpret_cast<uint16_t*>(arena.data() + p * page_bytes + l * layer_bytes + 2 * block);
      for (int64_t i = 0; i < sblock; ++i) sc[i] = kvant::f32_to_bf16(0.01f);
    }
  // Pointer tables per (layer, kv head).
  const int64_t head_off = head_major ? kPage * kHd * eb : kHd * eb;
  std::vector<const uint8_t*> kp(size_t(kLayers * kKvHeads * kPages)), vp(kp.size());
  std::vector<const uint16_t*> ksp(kp.size()), vsp(kp.size());
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t h = 0; h < kKvHeads; ++h)
      for (int64_t p = 0; p < kPages; ++p) {
        const size_t i = size_t((l * kKvHeads + h) * kPages + p);
        const uint8_t* base = arena.data() + p * page_bytes + l * layer_bytes;
        kp[i] = base + h * head_off;
        vp[i] = base + block + h * head_off;
        ksp[i] = reinterpret_cast<const uint16_t*>(base + 2 * block) + h;
        vsp[i] = reinterpret_cast<const uint16_t*>(base + 2 * block + sblock) + h;
      }
  std::vector<float> q(size_t(kGroup * kHd), 0.05f), out(size_t(threads) * q.size()),
      scratch(size_t(threads * kGroup * kTokens));
  auto call = [&](int64_t lh, int tid) {
    kvant::kernels::PagedKv kv;
    kv.k_pages = kp.data() + lh * kPages;
    kv.v_pages = vp.data() + lh * kPages;
    kv.token_stride = head_major ? kHd * eb : kKvHeads * kHd * eb;
    kv.k_scale = kv.v_scale = 0.01f;
    if (dyn) {
      kv.k_scales = ksp.data() + lh * kPages;
      kv.v_scales = vsp.data() + lh * kPages;
    }
    kv.scale_stride = kKvHeads;
    kv.page_tokens = kPage;
    kv.n_tokens = kTokens;
    kv.elem = elem;
    T->paged_attn_decode(q.data(), kGroup, kHd, 0.125f, kv, scratch.data() + tid * kGroup * kTokens,
                         out.data() + tid * q.size());
  };
  for (auto _ : state) {
    if (threads == 1) {
      for (int64_t lh = 0; lh < kLayers * kKvHeads; ++lh) call(lh, 0);
    } else {
      for (int64_t l = 0; l < kLayers; ++l) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t h = 0; h < kKvHeads; ++h) call(l * kKvHeads + h, omp_get_thread_num());
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes =
      double(kLayers * kKvHeads * kTokens) * (2.0 * kHd * double(eb) + (dyn ? 8 : 0));
  state.counters["GBps"] =
      benchmark::Counter(1e-9 * bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

// Prefill attention at depth (head 64 as SmolLM2-135M, or 128): one task of
// the CPU backend, kM queries against ctx BF16 rows: 16 consecutive tokens
// at positions ctx-16 .. ctx-1 of one head (kM 16), or of the 3 heads that
// share a KV head (kM 48, SmolLM2's group: one task since the group change),
// scores, softmax, weighted sum, as attention_prefill runs them. One thread;
// GFLOPS counts 4 * hd FLOPs per (query, row) pair.
void bm_prefill_attn(benchmark::State& state, const KernelTable* T, int64_t ctx, int64_t kHd,
                     int64_t kM) {
  std::vector<uint16_t> k(size_t(ctx * kHd)), v(k.size());
  fill_bf16(k.data(), int64_t(k.size()), 4);
  fill_bf16(v.data(), int64_t(v.size()), 5);
  std::vector<float> q(size_t(kM * kHd));
  uint64_t seed = 3;
  for (float& x : q) x = float(int64_t(next(seed) % 2001) - 1000) * 1e-3f;
  std::vector<float> sc(size_t(kM * ctx)), out(size_t(kM * kHd));
  std::vector<int64_t> ns(static_cast<size_t>(kM));
  for (int64_t i = 0; i < kM; ++i) ns[size_t(i)] = ctx - 15 + i % 16;
  const float scale = 1.f / std::sqrt(float(kHd));
  for (auto _ : state) {
    if (T->attn_scores_multi) {
      T->attn_scores_multi(q.data(), kHd, kM, k.data(), kHd, ctx, kHd, scale, sc.data(), ctx);
      for (int64_t i = 0; i < kM; ++i) T->softmax(sc.data() + i * ctx, ns[size_t(i)]);
      T->attn_weighted_sum_multi(sc.data(), ctx, ns.data(), kM, v.data(), kHd, kHd, out.data(), kHd);
    } else {
      for (int64_t i = 0; i < kM; ++i) {
        T->attn_scores(q.data() + i * kHd, k.data(), kHd, ns[size_t(i)], kHd, scale, sc.data());
        T->softmax(sc.data(), ns[size_t(i)]);
        T->attn_weighted_sum(sc.data(), v.data(), kHd, ns[size_t(i)], kHd, out.data() + i * kHd);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  double pairs = 0;
  for (int64_t i = 0; i < kM; ++i) pairs += double(ns[size_t(i)]);
  state.counters["GFLOPS"] = benchmark::Counter(1e-9 * 4.0 * kHd * pairs * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

void register_all() {
  std::vector<const KernelTable*> tables;
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16})
    if (const KernelTable* t = kvant::kernels::table_for(isa)) tables.push_back(t);
  for (const KernelTable* t : tables)
    for (int th : {1, 2}) {
      const std::string name =
          std::string("peak/") + kvant::kernels::isa_name(t->isa) + "/t" + std::to_string(th);
      benchmark::RegisterBenchmark(name.c_str(), bm_peak, t, th)->UseRealTime();
    }
  const std::pair<StreamOp, const char*> ops[] = {{StreamOp::Read, "read"},
                                                  {StreamOp::Read8, "read8"},
                                                  {StreamOp::Copy, "copy"},
                                                  {StreamOp::Triad, "triad"}};
  for (auto [op, opname] : ops)
    for (int th : {1, 2}) {
      const std::string name = std::string("stream/") + opname + "/t" + std::to_string(th);
      benchmark::RegisterBenchmark(name.c_str(), bm_stream, op, th)->UseRealTime();
    }
  // FP8 with dynamic (per-token) scales, as the KV cache writes them, and static ones.
  struct PagedCase {
    kvant::KvDType elem;
    bool dynamic_scales;
    const char* name;
  };
  const PagedCase paged[] = {{kvant::KvDType::kBf16, false, "bf16"},
                             {kvant::KvDType::kFp8E4m3, true, "fp8_e4m3"},
                             {kvant::KvDType::kFp8E4m3, false, "fp8_e4m3_static"},
                             {kvant::KvDType::kFp8E5m2, true, "fp8_e5m2"},
                             {kvant::KvDType::kFp8E5m2, false, "fp8_e5m2_static"}};
  for (const KernelTable* t : tables)
    for (const PagedCase& c : paged) {
      const std::string name =
          std::string("paged_attn/") + kvant::kernels::isa_name(t->isa) + "/" + c.name + "/ctx4096";
      benchmark::RegisterBenchmark(name.c_str(), bm_paged_attn, t, c.elem, c.dynamic_scales, 4096,
                                   false, 1, 16)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  // The active kernels at depth, both page layouts, 1 and 2 threads, pages
  // of 16 tokens (the engine's default) and 64.
  for (const PagedCase& c : paged)
    for (int64_t ctx : {4096, 16384})
      for (int64_t page : {16, 64})
        for (bool hm : {false, true})
          for (int th : {1, 2}) {
            if (c.name != std::string("bf16") && c.name != std::string("fp8_e4m3")) continue;
            if (page != 16 && ctx != 16384) continue;
            const std::string name = std::string("paged_attn_depth/") + c.name + "/ctx" +
                                     std::to_string(ctx) + "/page" + std::to_string(page) +
                                     (hm ? "/head_major" : "/token_major") + "/t" + std::to_string(th);
            benchmark::RegisterBenchmark(name.c_str(), bm_paged_attn, &kvant::kernels::active(),
                                         c.elem, c.dynamic_scales, ctx, hm, th, page)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
  // Head size 64 (SmolLM2) unnamed, 128 (Llama 3, Qwen3) as hd128; 16
  // queries unnamed, a group of 3 heads' 48 as q48.
  for (const KernelTable* t : tables)
    for (int64_t hd : {64, 128})
      for (int64_t ctx : {512, 4096, 16384})
        for (int64_t m : {16, 48}) {
          const std::string name =
              std::string("prefill_attn/") + kvant::kernels::isa_name(t->isa) +
              (hd == 64 ? "" : "/hd" + std::to_string(hd)) + "/ctx" + std::to_string(ctx) +
              (m == 16 ? "" : "/q" + std::to_string(m));
          benchmark::RegisterBenchmark(name.c_str(), bm_prefill_attn, t, ctx, hd, m)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
  // INT4 weights: every gemm_q4 this CPU runs, at g128 (and g32 for decode).
  kvant::kernels::Q4Variant variants[8];
  const int nv = kvant::kernels::q4_variants(variants, 8);
  const KernelTable* best = &kvant::kernels::active();
  for (const Shape& s : kShapes)
    for (int64_t group : {128, 32})
      for (int64_t m : {1, 32, 512}) {
        if (group == 32 && m != 1) continue;
        for (int v = 1; v < nv; ++v)  // not the scalar reference
          for (int th : {1, 2}) {
            const std::string name = std::string("gemm_q4/") + variants[v].name + "/g" +
                                     std::to_string(group) + "/" + s.name + "/m" +
                                     std::to_string(m) + "/t" + std::to_string(th);
            benchmark::RegisterBenchmark(name.c_str(), bm_gemm_q4, best, variants[v].fn, s, m,
                                         group, th)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
      }
  // FP8 weights, 128x128 block scales, every SIMD table.
  for (const Shape& s : kShapes)
    for (int64_t m : {1, 32, 512})
      for (const KernelTable* t : tables)
        for (int th : {1, 2}) {
          const std::string name = std::string("gemm_f8/") + kvant::kernels::isa_name(t->isa) +
                                   "/" + s.name + "/m" + std::to_string(m) + "/t" +
                                   std::to_string(th);
          benchmark::RegisterBenchmark(name.c_str(), bm_gemm_f8, t, s, m, th)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
  // Shape outermost: the cold weight copies are built once per shape.
  // m 4 and 8: batched decode (a few requests, or one with draft tokens).
  for (const Shape& s : kShapes)
    for (int64_t m : {1, 4, 8, 32, 512})
      for (const KernelTable* t : tables)
        for (bool packed : {false, true})
          for (int th : {1, 2}) {
            const std::string name = std::string("gemm/") + kvant::kernels::isa_name(t->isa) +
                                     (packed ? "/packed/" : "/plain/") + s.name + "/m" +
                                     std::to_string(m) + "/t" + std::to_string(th);
            benchmark::RegisterBenchmark(name.c_str(), bm_gemm, t, s, m, packed, th)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("kvant_isa", kvant::kernels::isa_name(kvant::kernels::active().isa));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
