// CPU kernel table: one entry per kernel, filled once at start-up with the best
// ISA the machine has (AVX-512 with BF16 dot products, AVX-512 without them,
// AVX2+FMA, or scalar). Kernels are pure functions over raw spans: no
// allocation, no logging, no threads of their own (callers split work, see
// core/threads.h). Every entry has a scalar reference in ref/ and a test
// against it for each compiled ISA. This header owns the contracts and the
// packed-weight layout; it does not own dispatch policy (dispatch.cpp).
#pragma once

#include <cstdint>

#include "numerics/kv_dtype.h"

namespace kvant::kernels {

// Avx512 needs AVX-512 F/BW/VL/DQ (Skylake-SP, Ice Lake, Zen 4): BF16 products
// are widened to FP32 and summed with FMA. Avx512Bf16 adds AVX512_BF16 and
// VNNI (Zen 4, Sapphire Rapids): the GEMM uses VDPBF16PS; other entries are
// the Avx512 ones.
enum class Isa { Scalar, Avx2, Avx512, Avx512Bf16 };
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16};
const char* isa_name(Isa isa);

// Packed weights for gemm_bf16_packed ("P16 pairs", the VDPBF16PS operand
// layout). W [n, k] BF16 row-major is cut into panels of 16 rows; panel p holds
// rows j = 16p .. 16p+15. Inside a panel k is taken in pairs q = 0 .. kp-1
// (kp = ceil(k/2)) and for each pair the 16 rows' (w[j, 2q], w[j, 2q+1]) sit
// next to each other, so one pair of one panel is one 64-byte vector:
//   wp[((p * kp) + q) * 32 + 2 * r + e] = w[16p + r, 2q + e]
// with zeros where 16p + r >= n or 2q + e >= k. Panel p starts at element
// p * kp * 32. Buffers should be 64-byte aligned (kernels tolerate less).
inline constexpr int64_t kPackRows = 16;
constexpr int64_t gemm_bf16_packed_size(int64_t n, int64_t k) {
  return (n + kPackRows - 1) / kPackRows * kPackRows * ((k + 1) / 2 * 2);
}

// INT4 weights for gemm_q4 ("Q4 P16", built at load by pack_q4 from the
// logical W4A16 values). W [n, k] with k a multiple of kQ4Block (32) and a
// group size g that is a multiple of 32 (the last group of a row may be
// shorter, see q4_groups). Logical weight:
//   w[j, c] = (u[j, c] - o[j, c / g]) * s[j, c / g],  u in [0, 15]
// where u = q + 8 for a signed nibble q in [-8, 7], o = 8 + zero (8 when
// symmetric) and s the group's scale (BF16). Rows go in panels of 16; panel p
// holds k / 32 blocks of 256 bytes; block b is 4 chunks of 64 bytes; in chunk
// c byte 4r + i (r = row in panel, i = 0..3) holds
//   low nibble  u[16p + r, 32b + 8c + i]
//   high nibble u[16p + r, 32b + 8c + 4 + i]
// so one 64-byte load feeds two 4-byte dot products for all 16 rows (the
// VPDPBUSD operand shape). Panel p starts at byte p * k * 8. Rows past n are
// zero bytes with scale 0. Scales: BF16 bits, [panel][group][16]; offsets
// o: uint8 [panel][group][16], or nullptr when every o is 8.
inline constexpr int64_t kQ4Block = 32;
struct Q4Weights {
  const uint8_t* w = nullptr;        // n_panels * k * 8 bytes
  const uint16_t* scales = nullptr;  // n_panels * q4_groups(k, group) * 16
  const uint8_t* offs = nullptr;     // same count, or nullptr (symmetric)
  int64_t n = 0, k = 0, group = 0;
};
constexpr int64_t q4_panels(int64_t n) { return (n + 15) / 16; }
// Groups per row: the last one may be short (k = 576 with g = 128 has four
// groups of 128 and one of 64), as compressed-tensors writes them.
constexpr int64_t q4_groups(int64_t k, int64_t group) { return (k + group - 1) / group; }

// Activations as gemm_q4 reads them: each row of x (k FP32 values) cut into
// blocks of 32, each block b stored as 32 int8 values a, a scale sa and the
// sum of its a's: x[32b + i] ~= a[i] * sa. Row i's values start at q + i *
// ldq, its scales and sums at s + i * lds, sum + i * lds.
struct Q8Rows {
  const int8_t* q = nullptr;
  const float* s = nullptr;
  const int32_t* sum = nullptr;
  int64_t ldq = 0, lds = 0;
};

// Packs logical W4A16 values into Q4 P16 (load time; any ISA). q: [n, k]
// int8 in [-8, 7]; scale: [n, G] FP32 (rounded to BF16), G = q4_groups(k,
// group); zero: [n, G] in [-8, 7] or nullptr. Outputs: w[q4_panels(n) * k * 8],
// scales[q4_panels(n) * G * 16], offs (same count; written only when zero !=
// nullptr).
void pack_q4(const int8_t* q, const float* scale, const int8_t* zero, int64_t n, int64_t k,
             int64_t group, uint8_t* w, uint16_t* scales, uint8_t* offs);
// Logical value of one weight of a packed matrix (tests, debugging).
float q4_weight(const Q4Weights& W, int64_t row, int64_t col);


// FP8 e4m3 weights for gemm_f8 ("F8 Q16", built at load by pack_f8 from the
// checkpoint's codes and scales, or from codes quantized at load). W [n, k],
// k >= 1; logical weight w[j, c] = e4m3(code[j, c]) * s[j, c / group]: one
// FP32 scale per row and per group of `group` columns (the last group may be
// shorter). A 128x128 block-scaled checkpoint gives every row of a 128-row
// block the block's scale; per-channel and per-tensor scales are one group
// of k columns. group is even and either at most kF8MaxGroup or >= k (one
// group). Codes go in panels of 16 rows; inside a panel the columns are
// taken in quads, each scale group starting a new quad (a group whose size
// is not a multiple of 4 ends in zero codes; every group but the last has gq
// = f8_group_quads(k, group) quads), and one quad of one panel is 64 bytes,
// a 32-bit word per row holding the row's four codes:
//   wp[((p * kq) + g * gq + q) * 64 + 4 * r + t] = code[16p + r, g * group + 4q + t]
// (kq = f8_quads(k, group) a row; zero where the row is >= n or the column
// is past its group or k). Scales: FP32 [panel][group][16], 0 past n.
inline constexpr int64_t kF8MaxGroup = 256;
struct F8Weights {
  const uint8_t* w = nullptr;     // f8_packed_bytes(n, k, group) bytes
  const float* scales = nullptr;  // q4_panels(n) * f8_groups(k, group) * 16
  int64_t n = 0, k = 0, group = 0;
  bool nan_codes = false;  // some code is a NaN (0x7f / 0xff): kernels check for it
  // The share of codes that are subnormal (exponent 0, mantissa not 0). The
  // SIMD kernels decode codes to FP32 e4m3 * 2^-120, where those are FP32
  // denormals, and on some CPUs (Intel's) an FMA with a denormal operand
  // takes a microcode assist (about 70 cycles measured). Where that costs
  // more than decoding at 2^-104 instead, every value a normal FP32 with the
  // same bits (three more instructions a vector), the kernels do that:
  // f8_subnormal_decode.
  float subnormal_share = 0.f;
};
// The share of n codes that are subnormal e4m3 (F8Weights::subnormal_share).
float f8_subnormal_share(const uint8_t* codes, int64_t n);
// Whether FP32 arithmetic on a denormal operand is much slower than on a
// normal one on this CPU (timed once, at first use).
bool f8_denormals_slow();
// Whether gemm_f8 over m rows of x decodes W at 2^-104: on a CPU where
// denormals are slow, when share * min(m, 12) >= 1/1024 (each decoded
// vector feeds up to 12 rows' FMAs; real checkpoints have about 1e-4, so
// decode keeps the cheaper decode and prefill takes this one).
// KVANT_F8_DENORMAL_DECODE=0 / 1, or set_f8_subnormal_decode(0 / 1), forces
// it off / on (on wherever the share is not 0); -1 restores the rule.
bool f8_subnormal_decode(float share, int64_t m);
void set_f8_subnormal_decode(int forced);
constexpr int64_t f8_groups(int64_t k, int64_t group) { return (k + group - 1) / group; }
// Column quads of a whole group, and of a row (the last group may be shorter).
constexpr int64_t f8_group_quads(int64_t k, int64_t group) {
  return ((group < k ? group : k) + 3) / 4;
}
constexpr int64_t f8_quads(int64_t k, int64_t group) {
  const int64_t ng = f8_groups(k, group), last = k - (ng - 1) * group;
  return (ng - 1) * f8_group_quads(k, group) + (last + 3) / 4;
}
constexpr int64_t f8_packed_bytes(int64_t n, int64_t k, int64_t group) {
  return (n + 15) / 16 * f8_quads(k, group) * 64;
}

// Packs FP8 codes [n, k] (row-major) with scales [n, f8_groups(k, group)]
// into F8 Q16 (load time; any ISA). Returns whether a NaN code was seen.
bool pack_f8(const uint8_t* codes, const float* scale, int64_t n, int64_t k, int64_t group,
             uint8_t* w, float* scales);
// Logical value of one weight of a packed matrix (tests, export).
float f8_weight(const F8Weights& W, int64_t row, int64_t col);


// One KV head's cached rows for one layer, spread over pages (plain pointers:
// kernels know nothing of the page pool). Token t lives in page pg = t /
// page_tokens at slot i = t % page_tokens; its K row (head_dim elements) starts
// at k_pages[pg] + i * token_stride bytes, its V row likewise in v_pages
// (v_pages may equal k_pages: MLA caches one latent row serving as K and V).
// FP8 rows read as decode(code) * s, with s = bf16(k_scales[pg][i *
// scale_stride]) (dynamic, per token: BF16 bits, as pages store them) when
// k_scales is set, else the static k_scale; V the same with v_scales /
// v_scale. BF16 rows ignore every scale.
struct PagedKv {
  const uint8_t* const* k_pages = nullptr;    // [n_pages]
  const uint8_t* const* v_pages = nullptr;    // [n_pages]
  int64_t token_stride = 0;                   // bytes between consecutive slots' rows
  const uint16_t* const* k_scales = nullptr;  // [n_pages] BF16 scales, or nullptr (static)
  const uint16_t* const* v_scales = nullptr;
  int64_t scale_stride = 1;  // scales between consecutive slots' scales
  float k_scale = 1.f, v_scale = 1.f;
  int64_t page_tokens = 16;
  int64_t n_tokens = 0;
  KvDType elem = KvDType::kBf16;
};

struct KernelTable {
  Isa isa = Isa::Scalar;

  // y[i, j] = sum_k x[i, k] * w[j, k] for i in [0, m), j in [n0, n1).
  // x: BF16 activations, row stride ldx; w: BF16 weights [n, k] row-major;
  // y: FP32, row stride ldy. Any k > 0. Accumulates in FP32.
  // Reduction order: every (i, j) is summed sequentially over k, one FP32
  // accumulator per (i, j), in k pairs (2q, 2q+1), whatever m, n0, n1 or the
  // tile an element lands in; so y[i, j] is bitwise the same alone or batched.
  // (Scalar and FP32-FMA ISAs add 2q then 2q+1, which equals the plain
  // sequential sum since BF16 x BF16 products are exact in FP32; Avx512Bf16
  // does what VDPBF16PS does per pair.)
  void (*gemm_bf16)(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y,
                    int64_t ldy, int64_t m, int64_t n0, int64_t n1) = nullptr;

  // The same product with W pre-packed by pack_bf16 (layout above); bitwise
  // equal to gemm_bf16 of the same ISA. Saves the per-call repacking: use it
  // for weights that are read many times (all of them, in a model).
  void (*gemm_bf16_packed)(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                           int64_t ldy, int64_t m, int64_t n0, int64_t n1) = nullptr;

  // wp[gemm_bf16_packed_size(n, k)] = packed W [n, k]. Load-time only.
  void (*pack_bf16)(const uint16_t* w, int64_t n, int64_t k, uint16_t* wp) = nullptr;

  // dst[i] = bf16(src[i]), round to nearest even, NaN stays a (quiet) NaN.
  // Bitwise equal to numerics/bf16.h on every ISA.
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  // dst[i] = float(src[i]) (exact).
  void (*bf16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;

  // One row: y = x * rsqrt(mean(x^2) + eps) * (w + w_offset); w_offset is 0,
  // or 1 for Gemma's (1 + w) norms. y may alias x.
  void (*rmsnorm)(const float* x, const float* w, float w_offset, float eps, float* y,
                  int64_t n) = nullptr;

  // out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). out may alias either input.
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  // out = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
  void (*gelu_tanh_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;

  // In place: x = exp(x - max(x)) / sum. -inf entries (masked) become exactly
  // 0; a row with no finite entry becomes all zeros. Values below
  // exp(-87.3) (FLT_MIN) relative to the max may flush to 0.
  void (*softmax)(float* x, int64_t n) = nullptr;

  // Greedy sampling: the index the scalar loop `best = 0; for i in 1..n-1:
  // if x[i] > x[best]: best = i` returns, on every ISA: the first index of
  // the largest value, NaN entries passed over (a NaN x[0] gives 0, as that
  // loop does); 0 for n <= 0.
  int64_t (*argmax)(const float* x, int64_t n) = nullptr;

  // Attention helpers for one head; K and V rows are BF16 (what prefill holds
  // and what FP8 pages dequantize to), q, p and results FP32, FP32 sums.
  // scores[t] = scale * dot(q[0:d], K[t * ldk + 0:d]) for t in [0, n), d = head_dim.
  // One row's value does not depend on n or t.
  void (*attn_scores)(const float* q, const uint16_t* k, int64_t ldk, int64_t n, int64_t head_dim,
                      float scale, float* scores) = nullptr;
  // out[d] = sum_t p[t] * V[t * ldv + d], summed sequentially over t = 0 .. n-1
  // with one fused multiply-add per term (so every ISA gives the same bits).
  void (*attn_weighted_sum)(const float* p, const uint16_t* v, int64_t ldv, int64_t n,
                            int64_t head_dim, float* out) = nullptr;

  // Several queries against the same rows, for prefill (optional: nullptr
  // where an ISA has no faster form; callers then loop over the one-query
  // kernels). Each result is bitwise what the one-query kernel of the same
  // ISA gives for that query alone; K and V rows are read once for all m.
  // scores[i * lds + t] = attn_scores(q + i * ldq, k, ldk, n, ...)[t], t < n.
  void (*attn_scores_multi)(const float* q, int64_t ldq, int64_t m, const uint16_t* k, int64_t ldk,
                            int64_t n, int64_t head_dim, float scale, float* scores,
                            int64_t lds) = nullptr;
  // out + i * ldo = attn_weighted_sum(p + i * ldp, v, ldv, n[i], ...).
  void (*attn_weighted_sum_multi)(const float* p, int64_t ldp, const int64_t* n, int64_t m,
                                  const uint16_t* v, int64_t ldv, int64_t head_dim, float* out,
                                  int64_t ldo) = nullptr;

  // Decode attention of the `group` query heads that share one KV head, read
  // straight from KV pages (FP8 decoded in registers, never staged as BF16).
  // q, out: [group, head_dim] FP32; scratch: [group, n_tokens] FP32, left
  // holding the (scaled) probabilities. For each head h:
  //   s[h, t] = dot(q[h], decode(K_t)) * c_t, c_t = scale (BF16) or scale * ks_t
  //   p[h]    = softmax(s[h]) (this ISA's softmax)
  //   out[h, d] = sum over t = 0 .. n-1, sequentially, of fma(w[h, t], decode(V_t)[d], acc)
  //               with w = p (BF16) or p * vs_t (FP8, one FP32 product)
  // i.e. the per-token scales multiply scores and probabilities, not each
  // element (dequant(x) = decode(x) * s up to that reassociation). With BF16
  // pages the dot product follows attn_scores of the same ISA, so the result
  // is bitwise equal to attn_scores + softmax + attn_weighted_sum of the same
  // ISA. With FP8 pages an ISA may sum a dot product's elements in another
  // order (AVX-512 takes 64 codes per load and permutes q to match), so FP8
  // scores equal the reference's up to FP32 rounding, not bitwise across
  // ISAs; a token's score still never depends on n, t or other tokens. The
  // weighted sum is bitwise equal across ISAs for every element type. Every K
  // and V row is read once per call for all heads of the group (SIMD ISAs:
  // of up to 4 or 8 heads). A head's result does not depend on `group` or on
  // the heads beside it, so callers may split a group across calls.
  // n_tokens == 0 gives out = 0. FP8 NaN codes decode to NaN.
  void (*paged_attn_decode)(const float* q, int64_t group, int64_t head_dim, float scale,
                            const PagedKv& kv, float* scratch, float* out) = nullptr;
  // paged_attn_decode's three passes, for callers that split one group's
  // long context over threads (scratch rows lds floats apart, lds >= n):
  //   paged_attn_scores(q, group, hd, scale, kv, s, lds);
  //   paged_attn_probs(s, lds, group, kv);        // softmax; FP8: times vs_t
  //   paged_attn_wsum(s, lds, group, hd, kv, 0, hd, out);
  // gives paged_attn_decode's bits. A token's score does not depend on which
  // page-aligned part of the context `kv` describes (so scores may be taken
  // part by part), and each output element is one sequential FMA chain over
  // t, so wsum over [d0, d1) (d0 a multiple of 32, d1 one or head_dim) gives
  // those elements' bits. paged_attn_probs leaves this ISA's own scaled
  // probabilities (a power of two folded in), meant for its wsum only.
  void (*paged_attn_scores)(const float* q, int64_t group, int64_t head_dim, float scale,
                            const PagedKv& kv, float* s, int64_t lds) = nullptr;
  void (*paged_attn_probs)(float* s, int64_t lds, int64_t group, const PagedKv& kv) = nullptr;
  void (*paged_attn_wsum)(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                          const PagedKv& kv, int64_t d0, int64_t d1, float* out) = nullptr;

  // INT4 weights x int8-quantized activations (W4A16 checkpoints, computed
  // W4A8 as on every CPU engine: activations are quantized per 32-block,
  // symmetric, at run time).
  // quantize_q8: one row, k a multiple of 32: per block amax = max |x|; sa =
  // amax / 127, a[i] = round-half-even(x[i] * (127 / amax)) (0 when amax is
  // 0); sum = sum of a. Bitwise equal on every ISA.
  void (*quantize_q8)(const float* x, int64_t k, int8_t* q, float* s, int32_t* sum) = nullptr;
  // y[i, j] for i in [0, m), j in [n0, n1), n0 a multiple of 16:
  //   for each group g (in order): acc = 0; for each block b of g (in order):
  //     acc = fma(float(sum_c u[j,c] a[i,c] - o[j,g] * sum[i,b]), sa[i,b], acc)
  //   y = fma(acc, s[j,g], y), from y = 0
  // Integer sums are exact, so every ISA gives the same bits.
  void (*gemm_q4)(const Q8Rows& x, const Q4Weights& w, float* y, int64_t ldy, int64_t m,
                  int64_t n0, int64_t n1) = nullptr;

  // FP8 weights x BF16 activations (x as gemm_bf16 reads it), for
  // i in [0, m), j in [n0, n1), n0 a multiple of 16:
  //   y = 0; for each group g (in order): e = o = 0;
  //     for each column c of g (in order): (c even ? e : o) += x[i, c] * e4m3(code[j, c])
  //     y = fma(e + o, s[j, g], y)
  // Products are exact in FP32 (8-bit by 4-bit significands), so every ISA
  // gives the reference bits. Batch invariant. NaN codes decode to NaN
  // (W.nan_codes must be set when any is present), subnormal codes exactly.
  // SIMD ISAs hold a row per lane: a code c at byte t of its row's word
  // becomes the FP32 with bits ((int32(word << (24 - 8t)) >> 4) & 0x87f00000),
  // e4m3(c) * 2^-120 exactly (subnormal codes as FP32 subnormals), and x's
  // row is taken as x * 2^K with K = min(120, 125 - E), E the exponent of
  // the row's largest |x|, so each product is x * w * 2^(K - 120) and e + o
  // is multiplied back by 2^(120 - K) (exact) before the scale's FMA: the
  // reference bits unless a product or partial sum of the row is nonzero
  // below 2^(-6 - K) in magnitude or overflows (for rows with max |x| < 64,
  // K = 120 and the arithmetic is the reference's). Avx512Bf16 on a CPU
  // with AVX512_VBMI instead looks the codes up as BF16 (VPERMI2B) and sums
  // BF16 pairs with VDPBF16PS (avx512bf16/gemm_f8_dpbf16.h): per row, two
  // lanes of pair sums (columns 4q, 4q+1 and 4q+2, 4q+3 of each quad, odd
  // column first, denormals flushed) added at each group's end, so within
  // the bound of two summation orders of the reference's terms, still batch
  // invariant; without VBMI it takes the Avx512 kernel.
  void (*gemm_f8)(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy,
                  int64_t m, int64_t n0, int64_t n1) = nullptr;

  // Benchmark aid, not a model kernel: runs `iters` iterations of the GEMM's
  // inner FP32-FMA (or VDPBF16PS) instruction on independent accumulators,
  // peak_flops_per_iter flops each, and returns a value that depends on them.
  float (*peak_probe)(int64_t iters) = nullptr;
  int64_t peak_flops_per_iter = 0;
};

// Every gemm_q4 this CPU can run, by name ("scalar", "avx2", "avx512bw",
// "avx512vnni"), for tests and benchmarks; the tables pick the best of them.
struct Q4Variant {
  const char* name;
  decltype(KernelTable::gemm_q4) fn;
};
int q4_variants(Q4Variant* out, int max);

// The table for this machine; KVANT_ISA=scalar|avx2|avx512|avx512bf16 narrows the choice.
// Unset, a CPU with AVX512_BF16 gets avx512bf16 only where VDPBF16PS does at
// least the FLOPs per second of FP32 FMA (timed once at first use), else avx512.
const KernelTable& active();
// The table for one ISA, or nullptr when this CPU cannot run it (for tests).
const KernelTable* table_for(Isa isa);

}  // namespace kvant::kernels
