// Chooses the kernel table once from cpuid (and KVANT_ISA; where the CPU has
// AVX512_BF16, also from a short timing of its dot-product instruction). The tables are
// assembled here, in baseline code, from function pointers only: no SIMD code
// runs until core/cpu.h has confirmed the CPU (and OS) support its ISA.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/cpu.h"
#include "kernels/cpu/avx2/avx2.h"
#include "kernels/cpu/avx512/avx512.h"
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/avx512vnni/avx512vnni.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ref/ref.h"

namespace kvant::kernels {

namespace {

template <class Ns>
void fill(KernelTable& t) {
  t.gemm_bf16 = Ns::gemm_bf16;
  t.gemm_bf16_packed = Ns::gemm_bf16_packed;
  t.pack_bf16 = Ns::pack_bf16;
  t.f32_to_bf16 = Ns::f32_to_bf16;
  t.bf16_to_f32 = Ns::bf16_to_f32;
  t.rmsnorm = Ns::rmsnorm;
  t.silu_mul = Ns::silu_mul;
  t.gelu_tanh_mul = Ns::gelu_tanh_mul;
  t.softmax = Ns::softmax;
  t.argmax = Ns::argmax;
  t.attn_scores = Ns::attn_scores;
  t.attn_weighted_sum = Ns::attn_weighted_sum;
  t.paged_attn_decode = Ns::paged_attn_decode;
  t.paged_attn_scores = Ns::paged_attn_scores;
  t.paged_attn_probs = Ns::paged_attn_probs;
  t.paged_attn_wsum = Ns::paged_attn_wsum;
  t.peak_probe = Ns::peak_probe;
  t.quantize_q8 = Ns::quantize_q8;
  t.gemm_q4 = Ns::gemm_q4;
  t.gemm_f8 = Ns::gemm_f8;
  t.peak_flops_per_iter = Ns::kPeakFlopsPerIter;
}

// Namespaces cannot be template arguments; these structs name their functions.
#define KVANT_ISA_FUNCS(ns)                                             \
  struct ns##_funcs {                                                   \
    static constexpr auto gemm_bf16 = ns::gemm_bf16;                    \
    static constexpr auto gemm_bf16_packed = ns::gemm_bf16_packed;      \
    static constexpr auto pack_bf16 = ns::pack_bf16;                    \
    static constexpr auto f32_to_bf16 = ns::f32_to_bf16;                \
    static constexpr auto bf16_to_f32 = ns::bf16_to_f32;                \
    static constexpr auto rmsnorm = ns::rmsnorm;                        \
    static constexpr auto silu_mul = ns::silu_mul;                      \
    static constexpr auto gelu_tanh_mul = ns::gelu_tanh_mul;            \
    static constexpr auto softmax = ns::softmax;                        \
    static constexpr auto argmax = ns::argmax;                          \
    static constexpr auto attn_scores = ns::attn_scores;                \
    static constexpr auto attn_weighted_sum = ns::attn_weighted_sum;    \
    static constexpr auto paged_attn_decode = ns::paged_attn_decode;    \
    static constexpr auto paged_attn_scores = ns::paged_attn_scores;    \
    static constexpr auto paged_attn_probs = ns::paged_attn_probs;      \
    static constexpr auto paged_attn_wsum = ns::paged_attn_wsum;        \
    static constexpr auto peak_probe = ns::peak_probe;                  \
    static constexpr auto quantize_q8 = ns::quantize_q8;                \
    static constexpr auto gemm_q4 = ns::gemm_q4;                        \
    static constexpr auto gemm_f8 = ns::gemm_f8;                        \
    static constexpr int64_t kPeakFlopsPerIter = ns::kPeakFlopsPerIter; \
  };
KVANT_ISA_FUNCS(ref)
KVANT_ISA_FUNCS(avx2)
KVANT_ISA_FUNCS(avx512)
#undef KVANT_ISA_FUNCS

KernelTable make(Isa isa) {
  KernelTable t;
  t.isa = isa;
  switch (isa) {
    case Isa::Scalar:
      fill<ref_funcs>(t);
      break;
    case Isa::Avx2:
      fill<avx2_funcs>(t);
      t.attn_scores_multi = avx2::attn_scores_multi;
      t.attn_weighted_sum_multi = avx2::attn_weighted_sum_multi;
      break;
    case Isa::Avx512:
      fill<avx512_funcs>(t);
      t.attn_scores_multi = avx512::attn_scores_multi;
      t.attn_weighted_sum_multi = avx512::attn_weighted_sum_multi;
      if (cpu_features().avx512_vnni) t.gemm_q4 = avx512vnni::gemm_q4;
      break;
    case Isa::Avx512Bf16:
      fill<avx512_funcs>(t);
      t.attn_scores_multi = avx512::attn_scores_multi;
      t.attn_weighted_sum_multi = avx512::attn_weighted_sum_multi;
      t.gemm_bf16 = avx512bf16::gemm_bf16;
      t.gemm_bf16_packed = avx512bf16::gemm_bf16_packed;
      t.gemm_q4 = avx512vnni::gemm_q4;  // Avx512Bf16 implies VNNI
      if (cpu_features().avx512_vbmi) t.gemm_f8 = avx512bf16::gemm_f8;
      t.peak_probe = avx512bf16::peak_probe;
      t.peak_flops_per_iter = avx512bf16::kPeakFlopsPerIter;
      break;
  }
  return t;
}

bool supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.has_avx2_set() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return f.has_avx2_set();
    case Isa::Avx512:
      return avx512;
    case Isa::Avx512Bf16:
      return avx512 && f.has_avx512_set();
  }
  return false;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512Bf16:
      return "avx512bf16";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

const KernelTable* table_for(Isa isa) {
  static const KernelTable tables[] = {make(Isa::Scalar), make(Isa::Avx2), make(Isa::Avx512),
                                       make(Isa::Avx512Bf16)};
  if (!supported(isa)) return nullptr;
  return &tables[int(isa)];
}

int q4_variants(Q4Variant* out, int max) {
  int n = 0;
  auto add = [&](const char* name, decltype(KernelTable::gemm_q4) fn) {
    if (n < max) out[n++] = {name, fn};
  };
  add("scalar", ref::gemm_q4);
  if (supported(Isa::Avx2)) add("avx2", avx2::gemm_q4);
  if (supported(Isa::Avx512)) add("avx512bw", avx512::gemm_q4);
  if (supported(Isa::Avx512) && cpu_features().avx512_vnni) add("avx512vnni", avx512vnni::gemm_q4);
  return n;
}

namespace {
// FLOP/s of a table's peak probe, best of five short runs (the first may
// run before the core's wide units are powered up).
double probe_rate(const KernelTable& t) {
  constexpr int64_t kIters = 20000;
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = t.peak_probe(kIters);
    (void)sink;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, double(t.peak_flops_per_iter * kIters) / s);
  }
  return best;
}

// Whether the VDPBF16PS GEMM beats widening BF16 to FP32 for FMA. Not on
// every CPU that has the instruction: on the Intel Xeons measured (Sapphire
// Rapids class) it does half the FLOPs per second of FP32 FMA, and prefill
// ran 1.4x faster on the FMA kernels. The BF16 kernel skips the widening,
// so it is chosen when its instruction is at least as fast in FLOPs.
bool dpbf16_pays() {
  const KernelTable* bf = table_for(Isa::Avx512Bf16);
  const KernelTable* fma = table_for(Isa::Avx512);
  if (!bf || !fma) return false;
  const double r_fma = probe_rate(*fma), r_bf = probe_rate(*bf);
  return r_bf >= r_fma;
}
// Seconds for `passes` passes of multiply-adds over 256 copies of v.
double fp_pass_seconds(float v, int passes) {
  float x[256];
  for (float& e : x) e = v;
  volatile float c = 0.5f;
  const float cc = c;
  float acc[4] = {0, 0, 0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < passes; ++p)
    for (int i = 0; i < 256; i += 4)
      for (int j = 0; j < 4; ++j) acc[j] += x[i + j] * cc;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float sink = acc[0] + acc[1] + acc[2] + acc[3];
  (void)sink;
  return s;
}

std::atomic<int> g_subnormal_forced{-1};
}  // namespace

void set_f8_subnormal_decode(int forced) { g_subnormal_forced.store(forced); }

bool f8_subnormal_decode(float share, int64_t m) {
  if (share <= 0.f) return false;
  int forced = g_subnormal_forced.load();
  if (forced < 0) {
    static const int env = [] {
      const char* e = std::getenv("KVANT_F8_DENORMAL_DECODE");
      return e && *e ? (std::atoi(e) != 0 ? 1 : 0) : -1;
    }();
    forced = env;
  }
  if (forced >= 0) return forced != 0;
  return f8_denormals_slow() && double(share) * double(std::min<int64_t>(m, 12)) >= 1.0 / 1024;
}

bool f8_denormals_slow() {
  static const bool slow = [] {
    // Normal (1e-30) against denormal (1e-40) operands and products; best
    // of three. Intel cores measured 20x and more slower; AMD Zen about even.
    double normal = 1e9, denormal = 1e9;
    for (int r = 0; r < 3; ++r) {
      normal = std::min(normal, fp_pass_seconds(1e-30f, 200));
      denormal = std::min(denormal, fp_pass_seconds(1e-40f, 200));
    }
    return denormal > 3 * normal;
  }();
  return slow;
}

const KernelTable& active() {
  static const KernelTable* t = [] {
    const char* env = std::getenv("KVANT_ISA");
    const bool any = !env || !*env;
    const Isa order[] = {Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2, Isa::Scalar};
    for (Isa isa : order) {
      if (!any && std::strcmp(env, isa_name(isa)) != 0) continue;
      auto* p = table_for(isa);
      // Left to choose, the BF16 dot-product table must also be the faster one.
      if (p && any && isa == Isa::Avx512Bf16 && !dpbf16_pays()) continue;
      if (p) return p;
    }
    return table_for(Isa::Scalar);
  }();
  return *t;
}

}  // namespace kvant::kernels
