// Backend operation tests, in the spirit of llama.cpp's test-backend-ops:
// every operation of every backend (backend::available_backends(); a new
// backend joins with no change here) against the reference backend (the CPU
// backend over the scalar kernel table, one thread), over awkward shapes:
// one row, odd widths, row strides wider than the rows, positions across
// page boundaries, pages of 3 tokens, windows starting inside a page.
//
// Tolerances, stated per test as max |got - want| <= tol * max(1, max |want|):
//  - exact (0): copies, page writes and reads (the BF16/FP8 encoders are
//    bitwise the same on every ISA), MoE permutation and combination, the
//    sparse choice, rope tables;
//  - 1e-5: row operations whose SIMD forms sum lanes in another order or use
//    another exp (rmsnorm, activations, RoPE and softcap are elementwise but
//    share that bound);
//  - 1e-4: linear products (BF16 pairs summed by VDPBF16PS, or int8 blocks
//    in another order) and attention (scores, softmax, weighted sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "kvcache/kv_codec.h"
#include "kvcache/kv_layout.h"
#include "kvcache/kv_view.h"
#include "numerics/bf16.h"

namespace kvant::backend {
namespace {

// A host matrix with a row stride wider than its rows.
struct Mat {
  std::vector<float> v;
  int64_t rows = 0, cols = 0, ld = 0;
  Mat(int64_t r, int64_t c, int64_t pad = 3) : v(size_t(r * (c + pad)), 0.f), rows(r), cols(c), ld(c + pad) {}
  F32 view() { return {v.data(), rows, cols, ld}; }
  float at(int64_t r, int64_t c) const { return v[size_t(r * ld + c)]; }
};

Mat random_mat(int64_t r, int64_t c, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  Mat m(r, c);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : m.v) x = d(rng);
  return m;
}

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_close(const Mat& got, const Mat& want, double tol, const std::string& what) {
  double mx = 1.0, worst = 0.0;
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.cols; ++c) mx = std::max(mx, double(std::fabs(want.at(r, c))));
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.cols; ++c) {
      const double d = std::fabs(double(got.at(r, c)) - double(want.at(r, c)));
      if (!(d <= worst)) worst = d;  // NaN propagates
    }
  EXPECT_LE(worst, tol * mx) << what << ": max |diff| " << worst << " (scale " << mx << ")";
}

class BackendOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    be_ = make_backend(GetParam());
    ref_ = make_backend("cpu-scalar");
    ASSERT_TRUE(be_ && ref_);
  }
  // Runs fn on both backends with a copy of `m` each; returns (got, want).
  template <class Fn>
  std::pair<Mat, Mat> both(const Mat& m, Fn&& fn) {
    Mat a = m, b = m;
    fn(*be_, a);
    fn(*ref_, b);
    return {a, b};
  }
  std::unique_ptr<Backend> be_, ref_;
};

TEST_P(BackendOps, RowOperations) {
  for (int64_t rows : {1, 3, 17})
    for (int64_t cols : {1, 7, 64, 130}) {
      const std::string at = std::to_string(rows) + "x" + std::to_string(cols);
      const Mat x = random_mat(rows, cols, uint32_t(rows * 131 + cols));
      const auto w = random_vec(size_t(cols), 5), b = random_vec(size_t(cols), 6);
      {
        auto [g, r] = both(x, [&](Backend& B, Mat& m) { B.rmsnorm(m.view(), w.data(), 1e-5f, m.view()); });
        expect_close(g, r, 1e-5, "rmsnorm " + at);
      }
      {
        auto [g, r] = both(x, [&](Backend& B, Mat& m) { B.layernorm(m.view(), w.data(), b.data(), 1e-6); });
        expect_close(g, r, 1e-5, "layernorm " + at);
      }
      {
        const Mat y = random_mat(rows, cols, 77);
        Mat yy = y;
        auto [g, r] = both(x, [&](Backend& B, Mat& m) { B.add(m.view(), yy.view()); });
        expect_close(g, r, 0, "add " + at);
        auto [g2, r2] = both(x, [&](Backend& B, Mat& m) { B.add_bias(m.view(), b.data()); });
        expect_close(g2, r2, 0, "add_bias " + at);
      }
      {
        auto [g, r] = both(x, [&](Backend& B, Mat& m) { B.softcap(m.view(), 1.5f); });
        expect_close(g, r, 1e-5, "softcap " + at);
      }
      for (GateAct act : {GateAct::kSilu, GateAct::kGeluTanh}) {
        const Mat gu = random_mat(rows, 2 * cols, 9, -6.f, 6.f);
        Mat gg = gu;
        auto [g, r] = both(Mat(rows, cols), [&](Backend& B, Mat& m) { B.gated_act(act, gg.view(), m.view()); });
        expect_close(g, r, 1e-5, std::string(act == GateAct::kSilu ? "silu" : "gelu") + " " + at);
      }
      if (cols % 8 == 0 || cols == 1) {
        const int64_t hd = cols == 1 ? 1 : 8;
        auto [g, r] = both(x, [&](Backend& B, Mat& m) {
          B.rmsnorm_heads(m.view(), cols / hd, hd, w.data(), 1e-6f);
        });
        expect_close(g, r, 1e-5, "rmsnorm_heads " + at);
      }
      {
        // Rows gathered and scattered by index, other rows untouched.
        std::vector<int64_t> src(static_cast<size_t>(rows)), dst(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) src[size_t(i)] = rows - 1 - i, dst[size_t(i)] = (i * 7) % rows;
        Mat xx = x;
        auto [g, r] = both(Mat(rows, cols), [&](Backend& B, Mat& m) {
          B.copy_rows(xx.view(), src.data(), m.view(), nullptr, rows / 2 + 1);
        });
        expect_close(g, r, 0, "copy_rows " + at);
        EXPECT_EQ(g.at(0, 0), x.at(rows - 1, 0));
      }
    }
}

TEST_P(BackendOps, EmbedReadsPreparedRows) {
  const int64_t vocab = 37, hidden = 19;
  std::vector<uint16_t> table(size_t(vocab * hidden));
  const auto f = random_vec(table.size(), 3, -3.f, 3.f);
  for (size_t i = 0; i < f.size(); ++i) table[i] = f32_to_bf16(f[i]);
  const Matrix wa = be_->prepare_bf16(table.data(), vocab, hidden);
  const Matrix wb = ref_->prepare_bf16(table.data(), vocab, hidden);
  const std::vector<int32_t> tok = {0, 36, 5, 5, 17};
  Mat a(5, hidden), b(5, hidden);
  be_->embed(wa, 0, tok.data(), 0.5f, a.view());
  ref_->embed(wb, 0, tok.data(), 0.5f, b.view());
  expect_close(a, b, 0, "embed");
  for (size_t i = 0; i < tok.size(); ++i)
    EXPECT_EQ(b.at(int64_t(i), 4), bf16_to_f32(table[size_t(tok[i] * hidden + 4)]) * 0.5f);
}

// A vocabulary slice: ids [10, 30) from rows 10..29 of the table; the rest
// are zero rows.
TEST_P(BackendOps, EmbedSliceZeroesOtherIds) {
  const int64_t vocab = 37, hidden = 19, row0 = 10, rows = 20;
  std::vector<uint16_t> table(size_t(vocab * hidden));
  const auto f = random_vec(table.size(), 4, -3.f, 3.f);
  for (size_t i = 0; i < f.size(); ++i) table[i] = f32_to_bf16(f[i]);
  const Matrix part = be_->prepare_bf16(table.data() + row0 * hidden, rows, hidden);
  const std::vector<int32_t> tok = {0, 9, 10, 29, 30, 36, 17};
  Mat a(int64_t(tok.size()), hidden);
  be_->embed(part, row0, tok.data(), 1.f, a.view());
  for (size_t i = 0; i < tok.size(); ++i)
    for (int64_t c = 0; c < hidden; ++c) {
      const bool in = tok[i] >= row0 && tok[i] < row0 + rows;
      EXPECT_EQ(a.at(int64_t(i), c), in ? bf16_to_f32(table[size_t(tok[i] * hidden + c)]) : 0.f)
          << "token " << tok[i];
    }
}

TEST_P(BackendOps, LinearBf16) {
  for (int64_t m : {1, 5, 67})
    for (int64_t n : {1, 17, 100})
      for (int64_t k : {2, 63, 130}) {
        std::vector<uint16_t> w(size_t(n * k));
        const auto f = random_vec(w.size(), uint32_t(n * 7 + k), -1.f, 1.f);
        for (size_t i = 0; i < f.size(); ++i) w[i] = f32_to_bf16(f[i]);
        const Matrix wa = be_->prepare_bf16(w.data(), n, k), wb = ref_->prepare_bf16(w.data(), n, k);
        Mat x = random_mat(m, k, uint32_t(m + k)), a(m, n), b(m, n);
        be_->linear(x.view(), {&wa, nullptr}, a.view());
        ref_->linear(x.view(), {&wb, nullptr}, b.view());
        expect_close(a, b, 1e-4,
                     "linear bf16 " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
      }
}

TEST_P(BackendOps, LinearInt4) {
  struct Shape {
    int64_t n, k, group;
    bool zero;
  };
  for (Shape s : {Shape{1, 32, 32, false}, Shape{17, 96, 64, true}, Shape{40, 160, 32, false},
                  Shape{16, 576, 128, true}})
    for (int64_t m : {1, 3, 70}) {
      const int64_t G = (s.k + s.group - 1) / s.group;
      std::mt19937 rng(uint32_t(s.n * s.k + m));
      std::uniform_int_distribution<int> q(-8, 7);
      std::vector<int8_t> qv(size_t(s.n * s.k)), zv(size_t(s.n * G));
      for (auto& v : qv) v = int8_t(q(rng));
      for (auto& v : zv) v = int8_t(q(rng));
      const auto sc = random_vec(size_t(s.n * G), 4, 0.01f, 0.1f);
      const int8_t* z = s.zero ? zv.data() : nullptr;
      QMatrix wa, wb;
      wa.q4 = be_->prepare_int4(qv.data(), sc.data(), z, s.n, s.k, s.group);
      wb.q4 = ref_->prepare_int4(qv.data(), sc.data(), z, s.n, s.k, s.group);
      Mat x = random_mat(m, s.k, uint32_t(m)), a(m, s.n), b(m, s.n);
      be_->linear(x.view(), {nullptr, &wa}, a.view());
      ref_->linear(x.view(), {nullptr, &wb}, b.view());
      expect_close(a, b, 1e-4, "linear int4 n" + std::to_string(s.n) + " k" + std::to_string(s.k) + " m" + std::to_string(m));
    }
}

TEST_P(BackendOps, LinearFp8) {
  struct Shape {
    int64_t n, k, group;
  };
  // 128-column blocks (one short), one group per row, small groups.
  for (Shape s : {Shape{1, 32, 128}, Shape{17, 200, 128}, Shape{40, 160, 32}, Shape{16, 576, 576}})
    for (int64_t m : {1, 3, 70}) {
      const int64_t G = (s.k + s.group - 1) / s.group;
      std::mt19937 rng(uint32_t(s.n * s.k + m));
      std::vector<uint8_t> codes(size_t(s.n * s.k));
      for (auto& c : codes) {
        c = uint8_t(rng());
        if ((c & 0x7f) == 0x7f) c = 0;
      }
      const auto sc = random_vec(size_t(s.n * G), 4, 0.001f, 0.01f);
      QMatrix wa, wb;
      wa.f8 = be_->prepare_fp8(codes.data(), sc.data(), s.n, s.k, s.group);
      wb.f8 = ref_->prepare_fp8(codes.data(), sc.data(), s.n, s.k, s.group);
      Mat x = random_mat(m, s.k, uint32_t(m)), a(m, s.n), b(m, s.n);
      be_->linear(x.view(), {nullptr, &wa}, a.view());
      ref_->linear(x.view(), {nullptr, &wb}, b.view());
      expect_close(a, b, 1e-4, "linear fp8 n" + std::to_string(s.n) + " k" + std::to_string(s.k) + " m" + std::to_string(m));
    }
}

// ---- KV pages and step plans -------------------------------------------

struct Pages {
  KvLayout layout;
  KvFormat fmt;
  std::vector<uint8_t> arena;
  std::vector<uint8_t*> ptrs;
  KvSpan span;
  Pages(const KvGeometry& g, int64_t n_pages, std::vector<float> sk = {}, std::vector<float> sv = {}) {
    auto l = make_kv_layout(g);
    EXPECT_TRUE(l.ok());
    layout = *l;
    fmt = kv_format(layout, std::move(sk), std::move(sv));
    arena.assign(size_t(n_pages * layout.page_bytes), 0);
    for (int64_t p = 0; p < n_pages; ++p) ptrs.push_back(arena.data() + p * layout.page_bytes);
    span = {&fmt, ptrs.data(), n_pages};
  }
  Pages(const Pages& o) : layout(o.layout), fmt(o.fmt), arena(o.arena) {
    for (size_t p = 0; p < o.ptrs.size(); ++p) ptrs.push_back(arena.data() + p * size_t(layout.page_bytes));
    span = {&fmt, ptrs.data(), int64_t(ptrs.size())};
  }
};

struct ChunkSpec {
  int64_t pos0, n;
  bool decode;
  int64_t gather_j0 = 0;
};

StepPlan make_plan(const std::vector<const KvSpan*>& spans, const std::vector<ChunkSpec>& cs) {
  StepPlan p;
  int64_t t = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    StepChunk c{spans[i], cs[i].pos0, cs[i].n, t};
    p.max_ctx = std::max(p.max_ctx, cs[i].pos0 + cs[i].n);
    p.max_pages = std::max(p.max_pages, spans[i]->n_pages);
    if (cs[i].decode) {
      p.decode_chunks.push_back(int64_t(i));
      p.decode_rows.push_back(t);
    } else {
      c.gather_off = p.gather_rows;
      c.gather_j0 = cs[i].gather_j0;
      p.gather_rows += cs[i].pos0 + cs[i].n - c.gather_j0;
      p.any_prefill = true;
    }
    for (int64_t j = 0; j < cs[i].n; ++j) p.tokens.push_back({int32_t(i), cs[i].pos0 + j});
    p.chunks.push_back(c);
    t += cs[i].n;
  }
  return p;
}

struct KvCase {
  KvDType dtype;
  KvScaleMode mode;
  int64_t kv_heads, head_dim, page_tokens;
  bool shared;
  std::string name() const {
    return std::string(kv_dtype_name(dtype)) + "/" + kv_scale_mode_name(mode) + "/h" +
           std::to_string(kv_heads) + "x" + std::to_string(head_dim) + "/p" + std::to_string(page_tokens) +
           (shared ? "/shared" : "");
  }
};

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> v;
  for (auto [d, m] : {std::pair{KvDType::kBf16, KvScaleMode::kNone},
                      std::pair{KvDType::kFp8E4m3, KvScaleMode::kStatic},
                      std::pair{KvDType::kFp8E4m3, KvScaleMode::kDynamic},
                      std::pair{KvDType::kFp8E5m2, KvScaleMode::kDynamic}})
    for (int64_t pt : {16, 3}) {
      v.push_back({d, m, 2, 24, pt, false});
      v.push_back({d, m, 1, 40, pt, true});
    }
  return v;
}

constexpr int64_t kLayers = 2;

Pages make_pages(const KvCase& k, int64_t n_pages, int64_t index_dim = 0) {
  KvGeometry g{kLayers, k.kv_heads, k.head_dim, k.dtype, k.page_tokens, k.mode, k.shared, index_dim};
  std::vector<float> sk, sv;
  if (k.mode == KvScaleMode::kStatic)
    for (int64_t i = 0; i < kLayers * k.kv_heads; ++i) sk.push_back(0.01f + 0.003f * float(i)), sv.push_back(0.02f);
  return Pages(g, n_pages, sk, sv);
}

// Writes K/V rows for positions [0, n) of layer `l` through the reference.
void fill_history(Backend& ref, Pages& p, int64_t n, int64_t l, uint32_t seed) {
  const int64_t kvd = p.fmt.kv_heads * p.fmt.head_dim;
  StepPlan plan = make_plan({&p.span}, {{0, n, false}});
  Mat k = random_mat(n, kvd, seed, -4.f, 4.f), v = random_mat(n, kvd, seed + 1, -4.f, 4.f);
  ref.begin_step(plan);
  ref.kv_store(plan, l, k.view(), p.fmt.shared_kv() ? CF32{} : CF32(v.view()));
}

TEST_P(BackendOps, KvStoreWritesTheCodecsBytes) {
  for (const KvCase& kc : kv_cases()) {
    Pages pa = make_pages(kc, 4), pb = pa;
    const int64_t kvd = kc.kv_heads * kc.head_dim, n = 3 * kc.page_tokens + 1;
    // Two chunks at once: one of several tokens crossing pages, one decoding.
    StepPlan plan_a = make_plan({&pa.span, &pa.span}, {{2, n - 3, false}, {n - 1, 1, true}});
    StepPlan plan_b = make_plan({&pb.span, &pb.span}, {{2, n - 3, false}, {n - 1, 1, true}});
    Mat k = random_mat(n - 2, kvd, 11, -50.f, 50.f), v = random_mat(n - 2, kvd, 12, -1.f, 1.f);
    k.v[3] = 0.f;
    be_->begin_step(plan_a);
    ref_->begin_step(plan_b);
    const CF32 vv = kc.shared ? CF32{} : CF32(v.view());
    be_->kv_store(plan_a, 1, k.view(), vv);
    ref_->kv_store(plan_b, 1, k.view(), vv);
    ASSERT_EQ(pa.arena, pb.arena) << kc.name();
    // Against the codec directly: row t of the step sits at position t + 2.
    for (int64_t t = 0; t < n - 2; ++t) {
      const int64_t pos = t + 2, slot = pos % kc.page_tokens;
      const uint8_t* page = pa.ptrs[size_t(pos / kc.page_tokens)] + 1 * pa.layout.layer_bytes;
      for (int64_t h = 0; h < kc.kv_heads; ++h) {
        const float* x = k.v.data() + t * k.ld + h * kc.head_dim;
        float s = 1.f;
        if (kc.mode == KvScaleMode::kDynamic) {
          s = kv_dynamic_scale(kc.dtype, x, kc.head_dim);
          const uint16_t stored = reinterpret_cast<const uint16_t*>(page + pa.layout.k_scale_offset)[slot * kc.kv_heads + h];
          ASSERT_EQ(stored, f32_to_bf16(s)) << kc.name() << " pos " << pos;
        } else if (kc.mode == KvScaleMode::kStatic) {
          s = pa.fmt.static_k[size_t(1 * kc.kv_heads + h)];
        }
        std::vector<uint8_t> want(size_t(kc.head_dim * 2));
        kv_encode_row(kc.dtype, x, kc.head_dim, s, want.data());
        const int64_t eb = kv_dtype_bytes(kc.dtype);
        ASSERT_EQ(0, std::memcmp(want.data(), page + pa.layout.k_offset + slot * kvd * eb + h * kc.head_dim * eb,
                                 size_t(kc.head_dim * eb)))
            << kc.name() << " pos " << pos << " head " << h;
      }
    }
  }
}

TEST_P(BackendOps, KvStoreIndexAndGather) {
  for (const KvCase& kc : kv_cases()) {
    Pages pa = make_pages(kc, 5, kc.shared ? 8 : 0);
    fill_history(*ref_, pa, 5 * kc.page_tokens, 0, 21);
    Pages pb = pa;
    const int64_t kvd = kc.kv_heads * kc.head_dim;
    // Prefill chunks starting mid-page over earlier positions, one windowed.
    const int64_t p0 = kc.page_tokens + 1, n0 = kc.page_tokens + 2, p1 = 2 * kc.page_tokens - 1;
    const std::vector<ChunkSpec> cs = {{p0, n0, false}, {p1, 2, false, 1}};
    StepPlan plan_a = make_plan({&pa.span, &pa.span}, cs), plan_b = make_plan({&pb.span, &pb.span}, cs);
    const int64_t T = n0 + 2;
    Mat k = random_mat(T, kvd, 31), v = random_mat(T, kvd, 32);
    std::vector<uint16_t> ga(size_t(plan_a.gather_rows * kvd) * 2, 0), gb = ga;
    BF16 gka{ga.data(), plan_a.gather_rows, kvd, kvd}, gva{ga.data() + plan_a.gather_rows * kvd, plan_a.gather_rows, kvd, kvd};
    BF16 gkb{gb.data(), plan_b.gather_rows, kvd, kvd}, gvb{gb.data() + plan_b.gather_rows * kvd, plan_b.gather_rows, kvd, kvd};
    const CF32 vv = kc.shared ? CF32{} : CF32(v.view());
    be_->begin_step(plan_a);
    ref_->begin_step(plan_b);
    be_->kv_gather(plan_a, 0, k.view(), vv, gka, gva);
    ref_->kv_gather(plan_b, 0, k.view(), vv, gkb, gvb);
    EXPECT_EQ(ga, gb) << "kv_gather " << kc.name();
    // The chunk's own rows come from the fresh FP32 rows, rounded to BF16.
    EXPECT_EQ(ga[size_t((p0) * kvd)], f32_to_bf16(k.at(0, 0))) << kc.name();
    if (kc.shared) {
      Mat ik = random_mat(T, 8, 33);
      be_->kv_store_index(plan_a, 1, ik.view());
      ref_->kv_store_index(plan_b, 1, ik.view());
      EXPECT_EQ(pa.arena, pb.arena) << "kv_store_index " << kc.name();
    }
  }
}

TEST_P(BackendOps, DecodeAttention) {
  for (const KvCase& kc : kv_cases()) {
    const int64_t ctx = 4 * kc.page_tokens + 2;
    Pages pa = make_pages(kc, 5);
    fill_history(*ref_, pa, ctx, 1, 41);
    Pages pb = pa;
    const int64_t heads = kc.shared ? 7 : 4, group = heads / kc.kv_heads, hd = kc.head_dim;
    // Contexts of 1 token, one full page, and one past several pages.
    const std::vector<ChunkSpec> cs = {{0, 1, true}, {kc.page_tokens - 1, 1, true}, {ctx - 1, 1, true}};
    for (int64_t window : {int64_t(0), kc.page_tokens + 1}) {
      for (bool sparse : {false, true}) {
        if (sparse && !kc.shared) continue;
        StepPlan plan_a = make_plan({&pa.span, &pa.span, &pa.span}, cs);
        StepPlan plan_b = make_plan({&pb.span, &pb.span, &pb.span}, cs);
        Mat q = random_mat(3, heads * hd, 43);
        std::vector<int32_t> sel = {0, 1, 2, 0, 2, 4, 1, 5, int32_t(ctx - 1)};
        std::vector<uint8_t> sp = {0, 1, 1};
        auto run = [&](Backend& B, StepPlan& plan) {
          Mat out(3, heads * hd);
          DecodeAttn d;
          d.layer = 1;
          d.q = q.view();
          d.out = out.view();
          d.heads = heads;
          d.kv_heads = kc.kv_heads;
          d.head_dim = hd;
          d.head_block = kc.shared ? 3 : group;
          d.scale = 0.3f;
          d.window = sparse ? 0 : window;
          if (sparse) d.sel = sel.data(), d.sparse = sp.data(), d.topk = 3;
          B.begin_step(plan);
          B.attention_decode(plan, d);
          return out;
        };
        Mat a = run(*be_, plan_a), b = run(*ref_, plan_b);
        expect_close(a, b, 1e-4, "decode " + kc.name() + " window " + std::to_string(window) + (sparse ? " sparse" : ""));
        // One token of context: every head of its KV head gets that token's
        // V row, decoded (probability 1).
        const uint8_t* page = pb.ptrs[0] + 1 * pb.layout.layer_bytes;
        float vs = 1.f;
        if (kc.mode == KvScaleMode::kStatic)
          vs = (kc.shared ? pb.fmt.static_k : pb.fmt.static_v)[size_t(1 * kc.kv_heads)];
        if (kc.mode == KvScaleMode::kDynamic)
          vs = bf16_to_f32(reinterpret_cast<const uint16_t*>(page + pb.layout.v_scale_offset)[0]);
        std::vector<float> v0(static_cast<size_t>(hd));
        kv_decode_row(kc.dtype, page + pb.layout.v_offset, hd, vs, v0.data());
        for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(b.at(0, d), v0[size_t(d)], 1e-6 * std::fabs(v0[size_t(d)]));
      }
    }
  }
}

// Splitting one long context's decode attention over threads (scores by page
// ranges, weighted sums whole or by head_dim ranges) gives the unsplit bits: with
// one sequence or several of different lengths, every KV format.
TEST_P(BackendOps, DecodeAttentionSplitIsBitwiseUnsplit) {
  auto* cpu = dynamic_cast<CpuBackend*>(be_.get());
  if (!cpu) GTEST_SKIP() << "not a CPU backend";
  for (const KvCase& kc : kv_cases()) {
    const int64_t ctx = 11 * kc.page_tokens + 2;  // 12 pages
    Pages pg = make_pages(kc, 12);
    fill_history(*ref_, pg, ctx, 1, 61);
    const int64_t heads = kc.shared ? 6 : 4, group = heads / kc.kv_heads, hd = kc.head_dim;
    for (const std::vector<ChunkSpec>& cs :
         {std::vector<ChunkSpec>{{ctx - 1, 1, true}},
          std::vector<ChunkSpec>{{ctx - 1, 1, true}, {2, 1, true}, {kc.page_tokens * 4, 1, true}}}) {
      const int64_t rows = int64_t(cs.size());
      std::vector<const KvSpan*> spans(cs.size(), &pg.span);
      Mat q = random_mat(rows, heads * hd, 67);
      auto run = [&](bool split, int64_t block, int64_t plan_threads) {
        StepPlan plan = make_plan(spans, cs);
        Mat out(rows, heads * hd);
        DecodeAttn d;
        d.layer = 1;
        d.q = q.view();
        d.out = out.view();
        d.heads = heads;
        d.kv_heads = kc.kv_heads;
        d.head_dim = hd;
        d.head_block = block;
        d.scale = 0.3f;
        cpu->tune_decode_split(split ? 1 : 0, kc.page_tokens * 2, split, plan_threads);
        cpu->begin_step(plan);
        cpu->attention_decode(plan, d);
        return out;
      };
      // Weighted sums planned for 1, 3 and 4 threads: all tasks whole, some
      // whole and the rest by head_dim ranges, or none whole (this machine's
      // threads run them either way).
      for (int64_t block : {group, int64_t(1)})
        for (int64_t pnt : {1, 3, 4}) {
          const Mat want = run(false, block, 0), got = run(true, block, pnt);
          ASSERT_EQ(0, std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4))
              << kc.name() << " sequences " << rows << " head block " << block
              << " planned threads " << pnt;
        }
    }
  }
  cpu->tune_decode_split(CpuBackend::kDecodeSplitMinCtx, CpuBackend::kDecodeSplitMinPart, false);
}

TEST_P(BackendOps, PrefillAttention) {
  const int64_t heads = 4, kvh = 2, hd = 24, dv = 16;
  for (float softcap : {0.f, 30.f})
    for (int64_t window : {0, 5})
      for (bool sparse : {false, true}) {
        // Two chunks: 1 token at position 6 and 9 tokens from position 3.
        KvCase kc{KvDType::kBf16, KvScaleMode::kNone, kvh, hd, 4, false};
        Pages pg = make_pages(kc, 4);
        if (sparse && window > 0) continue;  // sparse attention has no window
        StepPlan plan = make_plan({&pg.span, &pg.span}, {{6, 1, false}, {3, 9, false}});
        const int64_t T = 10, rows = plan.gather_rows;
        Mat q = random_mat(T, heads * hd, 51);
        std::vector<uint16_t> k(size_t(rows * kvh * hd)), v(size_t(rows * kvh * dv));
        const auto fk = random_vec(k.size(), 52, -2.f, 2.f), fv = random_vec(v.size(), 53);
        for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_bf16(fk[i]);
        for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_bf16(fv[i]);
        std::vector<int32_t> sel(size_t(T * 2));
        std::vector<uint8_t> sp(size_t(T), 0);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t pos = plan.tokens[size_t(t)].pos;
          sel[size_t(2 * t)] = 0, sel[size_t(2 * t + 1)] = int32_t(pos);
          sp[size_t(t)] = pos >= 2;
        }
        auto run = [&](Backend& B) {
          Mat out(T, heads * dv);
          PrefillAttn p;
          p.q = q.view();
          p.k = {k.data(), rows, kvh * hd, kvh * hd};
          p.v = {v.data(), rows, kvh * dv, kvh * dv};
          p.out = out.view();
          p.heads = heads;
          p.group = heads / kvh;
          p.head_dim = hd;
          p.v_dim = dv;
          p.q_head_stride = p.k_head_stride = hd;
          p.v_head_stride = dv;
          p.scale = 0.2f;
          p.softcap = softcap;
          p.window = window;
          if (sparse) p.sel = sel.data(), p.sparse = sp.data(), p.topk = 2;
          B.begin_step(plan);
          B.attention_prefill(plan, p);
          return out;
        };
        Mat a = run(*be_), b = run(*ref_);
        expect_close(a, b, 1e-4, "prefill softcap " + std::to_string(softcap) + " window " +
                                     std::to_string(window) + (sparse ? " sparse" : ""));
        // The first token (position 6, its own chunk) with a sparse choice of
        // positions 0 and 6 only: a blend of those two V rows.
        if (sparse && window == 0) {
          const float v0 = bf16_to_f32(v[0]), v6 = bf16_to_f32(v[size_t(6 * kvh * dv)]);
          EXPECT_GE(b.at(0, 0), std::min(v0, v6) - 1e-6f);
          EXPECT_LE(b.at(0, 0), std::max(v0, v6) + 1e-6f);
        }
      }
}

TEST_P(BackendOps, RopeTableAndRotation) {
  KvCase kc{KvDType::kBf16, KvScaleMode::kNone, 1, 8, 16, false};
  Pages pg = make_pages(kc, 70);
  StepPlan plan = make_plan({&pg.span, &pg.span}, {{0, 3, false}, {1000, 1, true}});
  const int64_t T = 4, n = 6, ld = 8;
  std::vector<float> inv(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) inv[size_t(j)] = std::pow(10000.f, -float(2 * j) / 12.f);
  Mat ca(T, n, ld - n), sa(T, n, ld - n), cb = ca, sb = sa;
  be_->rope_table(plan, inv.data(), n, 1.25f, ca.view(), sa.view());
  ref_->rope_table(plan, inv.data(), n, 1.25f, cb.view(), sb.view());
  expect_close(ca, cb, 0, "rope_table cos");
  expect_close(sa, sb, 0, "rope_table sin");
  EXPECT_FLOAT_EQ(cb.at(3, 0), std::cos(1000.f) * 1.25f);
  for (bool il : {false, true})
    for (int64_t dim : {12, 4}) {
      const Mat x = random_mat(T, 3 * 14, 61);
      auto [g, r] = both(x, [&](Backend& B, Mat& m) {
        B.rope(m.view().sub_cols(1, 3 * 14 - 1), 3, 14, dim, cb.view(), sb.view(), il);
      });
      expect_close(g, r, 1e-5, std::string("rope ") + (il ? "interleaved" : "halves") + " dim " + std::to_string(dim));
      EXPECT_EQ(g.at(2, 0), x.at(2, 0));        // before the first slice: untouched
      EXPECT_EQ(g.at(2, 1 + dim), x.at(2, 1 + dim));  // past the rotated width: untouched
    }
}

TEST_P(BackendOps, MoeRoutePermuteCombine) {
  const int64_t T = 5, E = 8, k = 3, H = 6;
  for (RouterConfig rc : {RouterConfig{RouterScoring::kSoftmax, int(E), int(k), 1, 1, true, 1.f},
                          RouterConfig{RouterScoring::kSigmoid, int(E), int(k), 4, 2, true, 2.5f}}) {
    Mat logits(T, E, 0);  // the router reads dense rows
    const auto lv = random_vec(size_t(T * E), 71, -3.f, 3.f);
    std::copy(lv.begin(), lv.end(), logits.v.begin());
    const auto bias = random_vec(size_t(E), 72, -0.5f, 0.5f);
    std::vector<int32_t> ia(size_t(T * k)), ib = ia;
    std::vector<float> wa(size_t(T * k)), wb = wa;
    be_->moe_route(rc, logits.view(), bias.data(), ia.data(), wa.data());
    ref_->moe_route(rc, logits.view(), bias.data(), ib.data(), wb.data());
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(wa, wb);
    for (int64_t t = 0; t < T; ++t)
      EXPECT_TRUE(std::is_sorted(ia.begin() + t * k, ia.begin() + (t + 1) * k));
    Mat x = random_mat(T, H, 73);
    std::vector<int64_t> off_a(static_cast<size_t>(E + 1)), off_b = off_a,
        slot_a(static_cast<size_t>(T * k)), slot_b = slot_a, fill(static_cast<size_t>(E));
    Mat xa(T * k, H), xb(T * k, H);
    be_->moe_permute(ia.data(), k, E, x.view(), xa.view(), {off_a.data(), slot_a.data(), fill.data()});
    ref_->moe_permute(ib.data(), k, E, x.view(), xb.view(), {off_b.data(), slot_b.data(), fill.data()});
    EXPECT_EQ(off_a, off_b);
    EXPECT_EQ(slot_a, slot_b);
    expect_close(xa, xb, 0, "moe_permute");
    for (int64_t i = 0; i < T * k; ++i) {
      EXPECT_EQ(xb.at(slot_b[size_t(i)], 2), x.at(i / k, 2));
      EXPECT_GE(slot_b[size_t(i)], off_b[size_t(ib[size_t(i)])]);
      EXPECT_LT(slot_b[size_t(i)], off_b[size_t(ib[size_t(i)] + 1)]);
    }
    Mat ya = random_mat(T * k, H, 74), oa(T, H), ob(T, H);
    be_->moe_combine(ya.view(), wa.data(), slot_a.data(), k, oa.view());
    ref_->moe_combine(ya.view(), wb.data(), slot_b.data(), k, ob.view());
    expect_close(oa, ob, 0, "moe_combine");
  }
}

TEST_P(BackendOps, MlaExpandAndDsaSelect) {
  const int64_t H = 3, nope = 8, dr = 4, dv = 6, R = 32, D = R + dr, rows = 300;  // > one expansion block
  std::vector<uint16_t> lat(size_t(rows * D));
  const auto fl = random_vec(lat.size(), 81);
  for (size_t i = 0; i < lat.size(); ++i) lat[i] = f32_to_bf16(fl[i]);
  std::vector<uint16_t> w(size_t(H * (nope + dv) * R));
  const auto fw = random_vec(w.size(), 82, -0.3f, 0.3f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(fw[i]);
  const Matrix wa = be_->prepare_bf16(w.data(), H * (nope + dv), R);
  const Matrix wb = ref_->prepare_bf16(w.data(), H * (nope + dv), R);
  auto run = [&](Backend& B, const Matrix& W) {
    std::vector<uint16_t> k(size_t(rows * H * (nope + dr))), v(size_t(rows * H * dv));
    B.mla_expand({{lat.data(), rows, D, D}, &W, H, nope, dr, dv, R,
                  dense(k.data(), rows, H * (nope + dr)), dense(v.data(), rows, H * dv)});
    std::vector<float> out;
    for (uint16_t x : k) out.push_back(bf16_to_f32(x));
    for (uint16_t x : v) out.push_back(bf16_to_f32(x));
    return out;
  };
  const auto a = run(*be_, wa), b = run(*ref_, wb);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, mx = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, double(std::fabs(a[i] - b[i])));
    mx = std::max(mx, double(std::fabs(b[i])));
  }
  EXPECT_LE(worst, mx / 128) << "mla_expand: at most one BF16 ulp of the largest value";
  // The RoPE key is copied into every head unchanged.
  EXPECT_EQ(b[size_t(5 * H * (nope + dr) + 2 * (nope + dr) + nope + 1)], bf16_to_f32(lat[size_t(5 * D + R + 1)]));

  // DSA: keys in the index blocks, a choice of 4 for tokens with more context.
  KvCase kc{KvDType::kBf16, KvScaleMode::kNone, 1, D, 3, true};
  Pages pa = make_pages(kc, 4, 8);
  StepPlan fill = make_plan({&pa.span}, {{0, 11, false}});
  Mat keys = random_mat(11, 8, 83);
  ref_->begin_step(fill);
  ref_->kv_store_index(fill, 0, keys.view());
  Pages pb = pa;
  const std::vector<ChunkSpec> cs = {{0, 6, false}, {10, 1, true}};
  StepPlan plan_a = make_plan({&pa.span, &pa.span}, cs), plan_b = make_plan({&pb.span, &pb.span}, cs);
  Mat q = random_mat(7, 2 * 8, 84), hw = random_mat(7, 2, 85, 0.f, 1.f);
  std::vector<int32_t> sa(7 * 4, -1), sb = sa;
  std::vector<uint8_t> spa(7, 9), spb = spa;
  be_->begin_step(plan_a);
  ref_->begin_step(plan_b);
  be_->dsa_select(plan_a, 0, q.view(), hw.view(), 2, 8, 4, sa.data(), spa.data());
  ref_->dsa_select(plan_b, 0, q.view(), hw.view(), 2, 8, 4, sb.data(), spb.data());
  EXPECT_EQ(spa, spb);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(spb, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1}));
  for (int64_t t = 4; t < 7; ++t) EXPECT_TRUE(std::is_sorted(sb.begin() + t * 4, sb.begin() + t * 4 + 4));
}

TEST_P(BackendOps, NothingToDoLeavesOutputsAlone) {
  // A step with no decoding chunk, and one with no prefill chunk.
  KvCase kc{KvDType::kBf16, KvScaleMode::kNone, 1, 8, 4, false};
  Pages pg = make_pages(kc, 2);
  StepPlan prefill_only = make_plan({&pg.span}, {{0, 2, false}});
  StepPlan decode_only = make_plan({&pg.span}, {{0, 1, true}});
  Mat q = random_mat(2, 8, 91), out(2, 8);
  std::fill(out.v.begin(), out.v.end(), 7.f);
  DecodeAttn d;
  d.q = q.view();
  d.out = out.view();
  d.heads = d.kv_heads = 1;
  d.head_dim = 8;
  d.head_block = 1;
  be_->begin_step(prefill_only);
  be_->attention_decode(prefill_only, d);
  PrefillAttn p;
  p.q = q.view();
  p.out = out.view();
  p.heads = 1;
  be_->begin_step(decode_only);
  be_->attention_prefill(decode_only, p);
  for (float x : out.v) EXPECT_EQ(x, 7.f);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::ValuesIn(available_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvant::backend
