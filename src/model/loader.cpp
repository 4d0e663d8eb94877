// Name mapping and load-time transforms:
//  - GGUF Llama files store q/k rows permuted for interleaved RoPE (the
//    family's gguf_qk_permuted); we undo it so every architecture uses the
//    half-split (NeoX) rotation.
//  - INT4 (compressed-tensors) linears load as Q4 P16 matrices; a BF16 set
//    from an INT4 checkpoint dequantizes them, an INT4 set from a BF16 one
//    quantizes at load (RTN). Parts of a fused product (q|k|v, gate|up) are
//    concatenated by rows either way.
//  - Hugging Face Gemma norms hold w with the forward computing x*(1+w) (the
//    family's hf_norm_plus_one); GGUF files already store 1+w. We store 1+w,
//    so the forward is x*w for all.
#include "model/loader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <tuple>

#include "backend/backend.h"
#include "core/threads.h"
#include "io/compressed_tensors.h"
#include "io/gguf.h"
#include "io/model_files.h"
#include "io/tensor_source.h"
#include "model/archs/arch.h"
#include "model/archs/tensor_names.h"
#include "numerics/bf16.h"
#include "numerics/fp8_block.h"
#include "numerics/int4_rtn.h"

namespace kvant {
namespace {

using archs::Naming;

// Rows or columns of a checkpoint tensor this process holds (tensor
// parallelism): [begin, end); end < 0: to the end.
struct Keep {
  int64_t begin = 0, end = -1;
  int64_t stop(int64_t n) const { return end < 0 ? n : end; }
  int64_t size(int64_t n) const { return stop(n) - begin; }
  bool all(int64_t n) const { return begin == 0 && stop(n) == n; }
};
Keep keep(const dist::Range& r, int64_t unit = 1) { return {r.begin * unit, r.end * unit}; }

// One checkpoint tensor of a product: its name, its rows in the file, and
// the rows kept.
struct Part {
  std::string name;
  int64_t rows = 0;
  Keep rows_kept = {};
};

std::vector<float> slice_f32(std::vector<float> v, int64_t rows, int64_t cols, Keep r, Keep c) {
  if (r.all(rows) && c.all(cols)) return v;
  const int64_t nr = r.size(rows), nc = c.size(cols);
  std::vector<float> out(size_t(nr * nc));
  for (int64_t i = 0; i < nr; ++i)
    std::copy_n(v.data() + (r.begin + i) * cols + c.begin, nc, out.data() + i * nc);
  return out;
}

// Rows and columns of a quantized tensor; columns only at group boundaries
// (the end may be the tensor's own, after a short last group).
Result<Int4Weight> slice_int4(Int4Weight w, Keep r, Keep c, const std::string& what) {
  if (r.all(w.rows) && c.all(w.cols)) return w;
  const int64_t c1 = c.stop(w.cols), g = w.group;
  if (c.begin % g != 0 || (c1 != w.cols && c1 % g != 0))
    return make_error(what + ": columns [" + std::to_string(c.begin) + ", " + std::to_string(c1) +
                      ") of this rank split its INT4 groups of " + std::to_string(g));
  const int64_t ng = (w.cols + g - 1) / g, g0 = c.begin / g, g1 = (c1 + g - 1) / g;
  Int4Weight o;
  o.rows = r.size(w.rows), o.cols = c1 - c.begin, o.group = g;
  o.q.resize(size_t(o.rows * o.cols));
  o.scale.resize(size_t(o.rows * (g1 - g0)));
  if (!w.zero.empty()) o.zero.resize(o.scale.size());
  for (int64_t i = 0; i < o.rows; ++i) {
    const int64_t src = r.begin + i;
    std::copy_n(w.q.data() + src * w.cols + c.begin, o.cols, o.q.data() + i * o.cols);
    std::copy_n(w.scale.data() + src * ng + g0, g1 - g0, o.scale.data() + i * (g1 - g0));
    if (!w.zero.empty())
      std::copy_n(w.zero.data() + src * ng + g0, g1 - g0, o.zero.data() + i * (g1 - g0));
  }
  return o;
}

// Tensor names by role, from the shared table (model/archs/tensor_names.h).
struct Names {
  Naming naming;
  const archs::ArchSpec* arch;
  std::string global(const char* role) const { return archs::global_tensor(naming, role); }
  std::string layer(int64_t i, const std::string& role) const {
    return archs::layer_tensor(naming, *arch, i, role);
  }
};

class Loader {
 public:
  // prec: the set's resolved precision (bf16, int4 or fp8; never native).
  Loader(const TensorSource& src, const ModelConfig& cfg, Naming naming, WeightPrecision prec,
         const WeightSetOptions& opts, const backend::Backend& be, const dist::ShardPlan& plan)
      : src_(src), cfg_(cfg), names_{naming, cfg.arch}, quant_(prec != WeightPrecision::kBf16),
        fp8_(prec == WeightPrecision::kFp8), opts_(opts), be_(be) {
    if (plan.tp > 1 || plan.ep > 1) sp_ = &plan;
  }
  // An INT4 checkpoint loaded as it is (native precision): linears it stores
  // in BF16 (its quantization_config ignore list, e.g. `kvant quantize
  // --keep`) stay BF16 instead of being quantized at load.
  void keep_stored_bf16(bool on) { keep_bf16_ = on; }

  // What this rank keeps of each sliced dimension (everything without a plan).
  Keep q_rows(int64_t per_head) const { return sp_ ? keep(sp_->q_heads, per_head) : Keep{}; }
  Keep kv_rows() const { return sp_ ? keep(sp_->kv_heads, cfg_.head_dim) : Keep{}; }
  Keep ffn_keep() const { return sp_ ? keep(sp_->ffn) : Keep{}; }
  Keep shared_keep() const { return sp_ ? keep(sp_->shared_ffn) : Keep{}; }
  Keep moe_keep() const { return sp_ ? keep(sp_->moe_ffn) : Keep{}; }
  Keep vocab_rows() const { return sp_ ? keep(sp_->vocab) : Keep{}; }
  bool owns_expert(int64_t e) const {
    return !sp_ || (e >= sp_->experts.begin && e < sp_->experts.end);
  }

  Result<std::vector<float>> f32(const std::string& name, std::vector<int64_t> shape) {
    const TensorRef* t = src_.find(name);
    if (!t) return make_error(src_.path() + ": missing tensor " + name);
    if (t->shape != shape) return make_error(src_.path() + ": tensor " + name + " has shape " + fmt(t->shape) + ", expected " + fmt(shape));
    std::vector<float> out(size_t(t->numel()));
    KV_TRY(src_.read_f32(*t, out));
    return out;
  }
  bool has(const std::string& name) const { return !name.empty() && src_.find(name) != nullptr; }

  // Rows `r` of a [rows, cols] tensor as FP32, read from the file alone (a
  // rank under tensor parallelism never holds the other ranks' rows, even
  // for a moment: the vocabulary's embedding rows are the largest).
  Result<std::vector<float>> f32_rows(const std::string& name, int64_t rows, int64_t cols, Keep r) {
    const TensorRef* t = src_.find(name);
    if (!t) return make_error(src_.path() + ": missing tensor " + name);
    if (t->shape != std::vector<int64_t>{rows, cols})
      return make_error(src_.path() + ": tensor " + name + " has shape " + fmt(t->shape) +
                        ", expected " + fmt({rows, cols}));
    if (r.begin < 0 || r.stop(rows) > rows || r.begin > r.stop(rows))
      return make_error(src_.path() + ": tensor " + name + ": rows [" + std::to_string(r.begin) +
                        ", " + std::to_string(r.stop(rows)) + ") out of range");
    std::vector<float> out(size_t(r.size(rows) * cols));
    KV_TRY(src_.read_f32_rows(*t, r.begin, r.stop(rows), out));
    return out;
  }
  // A part's kept rows and then its kept columns, as FP32 [kept rows, kept
  // columns]. `transform` (which permutes whole tensors' rows) and INT4
  // parts (dequantized whole) read everything first.
  Result<std::vector<float>> part_kept(size_t i, const Part& part, int64_t cols, Keep cols_kept,
                                       const std::function<void(size_t, std::vector<float>&)>& transform) {
    if (!transform && !part_is_int4(part.name)) {
      auto v = f32_rows(part.name, part.rows, cols, part.rows_kept);
      if (!v) return v.error();
      const int64_t kr = part.rows_kept.size(part.rows);
      return slice_f32(std::move(*v), kr, cols, Keep{}, cols_kept);
    }
    auto v = part_f32(part.name, part.rows, cols);
    if (!v) return v.error();
    if (transform) transform(i, *v);
    return slice_f32(std::move(*v), part.rows, cols, part.rows_kept, cols_kept);
  }

  static std::string base_of(const std::string& name) {
    const std::string suffix = ".weight";
    return name.size() > suffix.size() && name.ends_with(suffix)
               ? name.substr(0, name.size() - suffix.size())
               : name;
  }
  bool part_is_int4(const std::string& name) const { return has_int4_weight(src_, base_of(name)); }

  // One part as FP32 [rows, cols]: a plain tensor, or an INT4 one dequantized.
  Result<std::vector<float>> part_f32(const std::string& name, int64_t rows, int64_t cols) {
    if (!part_is_int4(name)) return f32(name, {rows, cols});
    auto q = read_int4_weight(src_, base_of(name));
    if (!q) return q.error();
    if (q->rows != rows || q->cols != cols)
      return make_error(src_.path() + ": tensor " + base_of(name) + " is [" +
                        std::to_string(q->rows) + ", " + std::to_string(q->cols) + "], expected " +
                        fmt({rows, cols}));
    std::vector<float> out(size_t(rows * cols));
    dequantize(*q, out.data());
    return out;
  }

  // Several [rows_i, cols] parts stacked into one product: fills m (BF16)
  // or mq (INT4 or FP8) as the set asks. INT4: INT4 parts are taken as
  // stored; FP32 ones are quantized with RTN (a short last group where the
  // group size does not divide the input size), except that a product with
  // no INT4 part stays BF16 under keep_stored_bf16; a product whose input size
  // is not a multiple of 32 stays BF16. FP8: see product_fp8; an odd input
  // size stays BF16.
  //
  // Under tensor parallelism each part keeps its rows_kept and the product
  // the columns `cols_kept` (a stored INT4 tensor is sliced at its group
  // boundaries; an FP32 one is sliced, then quantized).
  Result<void> product(const std::vector<Part>& parts, int64_t cols, Matrix& m, QMatrix& mq,
                       bool quantize,
                       const std::function<void(size_t, std::vector<float>&)>& transform = {},
                       Keep cols_kept = {}) {
    bool stored_int4 = true, any_int4 = false;
    for (auto& p : parts) {
      const bool q4 = part_is_int4(p.name);
      stored_int4 = stored_int4 && q4;
      any_int4 = any_int4 || q4;
    }
    if (keep_bf16_ && !fp8_ && !any_int4) quantize = false;
    const int64_t kc = cols_kept.size(cols);
    // (A stored INT4 product whose input size the kernels cannot take is
    // dequantized to BF16.)
    if (!quantize || kc % (fp8_ ? 2 : kInt4Block) != 0) {
      auto r = matrix(parts, cols, transform, cols_kept);
      if (!r) return r.error();
      m = std::move(*r);
      return {};
    }
    if (fp8_) return product_fp8(parts, cols, mq, transform, cols_kept);
    Int4Weight all;
    all.cols = kc;
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string& name = parts[i].name;
      const int64_t rows = parts[i].rows;
      Int4Weight w;
      if (stored_int4) {
        auto r = read_int4_weight(src_, base_of(name));
        if (!r) return r.error();
        if (r->rows != rows || r->cols != cols)
          return make_error(src_.path() + ": tensor " + base_of(name) + " is [" +
                            std::to_string(r->rows) + ", " + std::to_string(r->cols) +
                            "], expected " + fmt({rows, cols}));
        if (transform) return make_error(src_.path() + ": " + base_of(name) + ": INT4 rows cannot be permuted");
        auto s = slice_int4(std::move(*r), parts[i].rows_kept, cols_kept,
                            src_.path() + ": " + base_of(name));
        if (!s) return s.error();
        w = std::move(*s);
      } else {
        auto k = part_kept(i, parts[i], cols, cols_kept, transform);
        if (!k) return k.error();
        w = rtn_quantize(k->data(), parts[i].rows_kept.size(rows), kc, opts_.int4_group, false);
      }
      if (i == 0) {
        all.group = w.group;
      } else if (w.group != all.group || w.zero.empty() != all.zero.empty()) {
        return make_error(src_.path() + ": " + base_of(name) + " is quantized unlike " +
                          base_of(parts[0].name) + " (group " + std::to_string(w.group) + " vs " +
                          std::to_string(all.group) + "); they are fused into one product");
      }
      all.rows += w.rows;
      all.q.insert(all.q.end(), w.q.begin(), w.q.end());
      all.scale.insert(all.scale.end(), w.scale.begin(), w.scale.end());
      all.zero.insert(all.zero.end(), w.zero.begin(), w.zero.end());
    }
    if (all.group % kInt4Block != 0 || all.cols % kInt4Block != 0)
      return make_error(src_.path() + ": " + base_of(parts[0].name) + ": INT4 group size " +
                        std::to_string(all.group) + " and input size " + std::to_string(all.cols) +
                        " must be multiples of 32 for the INT4 kernels");
    mq.q4 = be_.prepare_int4(all.q.data(), all.scale.data(),
                          all.zero.empty() ? nullptr : all.zero.data(), all.rows, all.cols,
                          all.group);
    return {};
  }

  // An FP8 product. When every part is stored as F8_E4M3 with the same
  // column blocking (128-column blocks, or one scale across a row: per
  // channel or per tensor), the codes and scales are kept as they are (under
  // tensor parallelism rows and columns are sliced anywhere even);
  // otherwise (BF16, GGUF or INT4 parts, permuted rows, mixed blocking) every
  // part is read as FP32 and quantized with 128x128 block amax scales
  // (numerics/fp8_block.h). Scales become per row and per column group, as
  // the kernels read them; a group never straddles two blocks.
  Result<void> product_fp8(const std::vector<Part>& parts, int64_t cols, QMatrix& mq,
                           const std::function<void(size_t, std::vector<float>&)>& transform,
                           Keep cols_kept) {
    constexpr int64_t B = kFp8WeightBlock;
    const int64_t kc = cols_kept.size(cols);
    std::vector<TensorSource::Fp8Scales> stored;
    for (const Part& part : parts) {
      const TensorRef* t = src_.find(part.name);
      auto sc = t && !transform && t->shape == std::vector<int64_t>{part.rows, cols}
                    ? src_.fp8_scales(*t)
                    : std::nullopt;
      if (!sc || (sc->block_cols < cols && (sc->block_cols != B || cols_kept.begin % 2 != 0)) ||
          (!stored.empty() && std::min(sc->block_cols, cols) != std::min(stored[0].block_cols, cols))) {
        stored.clear();
        break;
      }
      stored.push_back(*sc);
    }
    // Kept columns that start inside a 128-column block (tensor parallelism
    // in blocks smaller than 128) take groups of gcd(128, offset): every
    // group then lies inside one stored block.
    const int64_t off = cols_kept.begin % B;
    const int64_t group = !stored.empty() && stored[0].block_cols >= cols ? kc
                          : off == 0                                       ? B
                                                                           : std::gcd(B, off);
    const int64_t ng = (kc + group - 1) / group;
    int64_t rows = 0;
    for (auto& p : parts) rows += p.rows_kept.size(p.rows);
    std::vector<uint8_t> codes(size_t(rows * kc));
    std::vector<float> scales(size_t(rows * ng));
    int64_t row = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& part = parts[i];
      const int64_t kr = part.rows_kept.size(part.rows);
      if (!stored.empty()) {
        const TensorRef& t = *src_.find(part.name);
        const auto& sc = stored[i];
        std::vector<float> sv(sc.scales ? size_t(sc.scales->numel()) : 1, 1.f);
        if (sc.scales) KV_TRY(src_.read_f32(*sc.scales, sv));
        const int64_t scols = (cols + sc.block_cols - 1) / sc.block_cols;
        for (int64_t r = 0; r < kr; ++r) {
          const int64_t src_row = part.rows_kept.begin + r;
          std::memcpy(codes.data() + (row + r) * kc, t.data.data() + src_row * cols + cols_kept.begin,
                      size_t(kc));
          const int64_t srow = sc.scales ? src_row / sc.block_rows : 0;
          for (int64_t g = 0; g < ng; ++g)
            scales[size_t((row + r) * ng + g)] =
                sc.scales ? sv[size_t(srow * scols + (scols == 1 ? 0 : (cols_kept.begin + g * group) / B))]
                          : 1.f;
        }
      } else {
        // Quantized in the part's own 128x128 blocks (whole blocks read,
        // then the kept rows and columns taken), so that a rank's slice
        // holds the codes and scales one process would.
        const int64_t rb = part.rows_kept.begin, r0 = rb / B * B;
        const int64_t r1 = std::min(part.rows, (part.rows_kept.stop(part.rows) + B - 1) / B * B);
        const int64_t c0 = cols_kept.begin / B * B;
        const int64_t c1 = std::min(cols, (cols_kept.stop(cols) + B - 1) / B * B);
        Part whole = part;
        whole.rows_kept = {r0, r1};
        auto k = part_kept(i, whole, cols, Keep{c0, c1}, transform);
        if (!k) return k.error();
        const int64_t er = r1 - r0, ec = c1 - c0, ebc = (ec + B - 1) / B;
        std::vector<uint8_t> ecodes(size_t(er * ec));
        std::vector<float> ps(size_t((er + B - 1) / B * ebc));
        fp8_block_quantize(k->data(), er, ec, B, ecodes.data(), ps.data());
        for (int64_t r = 0; r < kr; ++r) {
          const int64_t er_row = rb - r0 + r;
          std::memcpy(codes.data() + (row + r) * kc, ecodes.data() + er_row * ec + (cols_kept.begin - c0),
                      size_t(kc));
          for (int64_t g = 0; g < ng; ++g)
            scales[size_t((row + r) * ng + g)] =
                ps[size_t((er_row / B) * ebc + (cols_kept.begin + g * group - c0) / B)];
        }
      }
      row += kr;
    }
    mq.f8 = be_.prepare_fp8(codes.data(), scales.data(), rows, kc, group);
    return {};
  }

  // A routed MLP: the router (BF16 always) and each expert's gate|up and
  // down products, in the set's precision. Hugging Face names only.
  Result<void> moe(int64_t i, LayerWeights& L) {
    const auto& c = cfg_;
    if (names_.naming != Naming::Hf)
      return make_error(src_.path() + ": mixture-of-experts layers load from Hugging Face "
                                      "checkpoints only");
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    auto r = matrix({{p + "gate.weight", c.n_experts}}, c.hidden);
    if (!r) return r.error();
    L.router = std::move(*r);
    if (has(p + "gate.e_score_correction_bias")) {
      auto b = f32(p + "gate.e_score_correction_bias", {c.n_experts});
      if (!b) return b.error();
      L.router_bias = std::move(*b);
    } else if (c.moe_sigmoid) {
      return make_error(src_.path() + ": missing tensor " + p + "gate.e_score_correction_bias");
    }
    if (c.moe_shared_ffn > 0) {
      const std::string x = p + "shared_experts.";
      const Keep sk = shared_keep();
      KV_TRY(product({{x + "gate_proj.weight", c.moe_shared_ffn, sk},
                      {x + "up_proj.weight", c.moe_shared_ffn, sk}},
                     c.hidden, L.shared.gate_up, L.shared.gate_up_q, quant_));
      KV_TRY(product({{x + "down_proj.weight", c.hidden}}, c.moe_shared_ffn, L.shared.down,
                     L.shared.down_q, quant_, {}, sk));
    }
    // Every expert's slot; under expert parallelism only the owned ones
    // hold weights.
    L.experts.resize(size_t(c.n_experts));
    const Keep mk = moe_keep();
    for (int64_t e = 0; e < c.n_experts; ++e) {
      if (!owns_expert(e)) continue;
      const std::string x = p + "experts." + std::to_string(e) + ".";
      ExpertWeights& E = L.experts[size_t(e)];
      KV_TRY(product({{x + "gate_proj.weight", c.moe_ffn, mk}, {x + "up_proj.weight", c.moe_ffn, mk}},
                     c.hidden, E.gate_up, E.gate_up_q, quant_));
      KV_TRY(product({{x + "down_proj.weight", c.hidden}}, c.moe_ffn, E.down, E.down_q, quant_, {},
                     mk));
    }
    return {};
  }

  // Multi-head latent attention of layer i (Hugging Face names): the
  // products that read the normed input fused ([q_a or q ; kv_a]), q_b, the
  // output, the two latent norms, and kv_b both whole (prefill expands K and
  // V with it) and split per head for the absorbed decode path.
  Result<void> mla(int64_t i, LayerWeights& L) {
    const auto& c = cfg_;
    if (names_.naming != Naming::Hf)
      return make_error(src_.path() + ": multi-head latent attention loads from Hugging Face "
                                      "checkpoints only");
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    const int64_t H = c.heads, qk = c.head_dim, R = c.kv_lora_rank, nope = c.qk_nope_dim,
                  dv = c.v_head_dim;
    std::vector<Part> first;
    if (c.q_lora_rank > 0)
      first.push_back({p + "q_a_proj.weight", c.q_lora_rank});
    else
      first.push_back({p + "q_proj.weight", H * qk, q_rows(qk)});
    first.push_back({p + "kv_a_proj_with_mqa.weight", R + c.qk_rope_dim});
    const bool indexer = c.index_topk > 0 && c.index_full[size_t(i)];
    if (indexer) {
      first.push_back({p + "indexer.wk.weight", c.index_head_dim});
      first.push_back({p + "indexer.weights_proj.weight", c.index_heads});
    }
    KV_TRY(product(first, c.hidden, L.wqkv, L.wqkv_q, quant_));
    if (indexer) {
      auto r = matrix({{p + "indexer.wq_b.weight", c.index_heads * c.index_head_dim}}, c.q_lora_rank);
      if (!r) return r.error();
      L.idx_wq_b = std::move(*r);
      auto kw = f32(p + "indexer.k_norm.weight", {c.index_head_dim});
      if (!kw) return kw.error();
      auto kb = f32(p + "indexer.k_norm.bias", {c.index_head_dim});
      if (!kb) return kb.error();
      L.idx_k_norm = std::move(*kw);
      L.idx_k_bias = std::move(*kb);
    }
    if (c.q_lora_rank > 0) {
      auto n = f32(p + "q_a_layernorm.weight", {c.q_lora_rank});
      if (!n) return n.error();
      L.q_a_norm = std::move(*n);
      KV_TRY(product({{p + "q_b_proj.weight", H * qk, q_rows(qk)}}, c.q_lora_rank, L.wq_b, L.wq_b_q,
                     quant_));
    }
    auto kn = f32(p + "kv_a_layernorm.weight", {R});
    if (!kn) return kn.error();
    L.kv_a_norm = std::move(*kn);
    // This rank's heads only.
    const Keep hk = q_rows(nope + dv);
    auto kvb_kept = part_kept(0, {p + "kv_b_proj.weight", H * (nope + dv), hk}, R, {}, {});
    if (!kvb_kept) return kvb_kept.error();
    const std::vector<float>& kvb = *kvb_kept;
    const int64_t Hl = hk.size(H * (nope + dv)) / (nope + dv);
    L.wkv_b = pack(kvb.data(), Hl * (nope + dv), R);
    std::vector<float> uk(size_t(R * nope)), uv(size_t(dv * R));
    for (int64_t h = 0; h < Hl; ++h) {
      const float* base = kvb.data() + h * (nope + dv) * R;
      for (int64_t r = 0; r < nope; ++r)
        for (int64_t k = 0; k < R; ++k) uk[size_t(k * nope + r)] = base[r * R + k];
      std::copy(base + nope * R, base + (nope + dv) * R, uv.begin());
      L.w_uk_t.push_back(pack(uk.data(), R, nope));
      L.w_uv.push_back(pack(uv.data(), dv, R));
    }
    KV_TRY(product({{p + "o_proj.weight", c.hidden}}, H * dv, L.wo, L.wo_q, quant_, {}, q_rows(dv)));
    return {};
  }

  // FP32 [rows, cols] values as a BF16 matrix in the kernels' layout.
  Matrix pack(const float* v, int64_t rows, int64_t cols) const {
    AlignedBuffer<uint16_t> rowmajor(size_t(rows * cols));
    for (int64_t k = 0; k < rows * cols; ++k) rowmajor[size_t(k)] = f32_to_bf16(v[k]);
    return be_.prepare_bf16(rowmajor.data(), rows, cols);
  }

  // Loads several [rows_i, cols] tensors stacked into one BF16 matrix.
  // (Each part's rows_kept, the columns cols_kept.)
  Result<Matrix> matrix(const std::vector<Part>& parts, int64_t cols,
                        const std::function<void(size_t, std::vector<float>&)>& transform = {},
                        Keep cols_kept = {}) {
    int64_t rows = 0;
    for (auto& p : parts) rows += p.rows_kept.size(p.rows);
    const int64_t kc = cols_kept.size(cols);
    AlignedBuffer<uint16_t> rowmajor(size_t(rows * kc));
    int64_t row = 0;
    std::vector<float> chunk;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& part = parts[i];
      const int64_t kr = part.rows_kept.size(part.rows);
      uint16_t* dst = rowmajor.data() + row * kc;
      auto to_bf16 = [&](const float* s, int64_t n, uint16_t* d) {
        parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
          for (int64_t x = b; x < e; ++x) d[x] = f32_to_bf16(s[x]);
        });
      };
      if (!transform && !part_is_int4(part.name)) {
        // Plain tensors in blocks of rows, so that no FP32 copy of a whole
        // (vocabulary-sized) tensor is ever held.
        KV_TRY(f32_rows(part.name, part.rows, cols, {0, 0}));  // name and shape checks
        const TensorRef& t = *src_.find(part.name);
        const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, cols));
        for (int64_t r0 = 0; r0 < kr; r0 += block) {
          const int64_t n = std::min(block, kr - r0);
          chunk.resize(size_t(n * cols));
          const int64_t src_row = part.rows_kept.begin + r0;
          KV_TRY(src_.read_f32_rows(t, src_row, src_row + n, chunk));
          for (int64_t j = 0; j < n; ++j)
            to_bf16(chunk.data() + j * cols + cols_kept.begin, kc, dst + (r0 + j) * kc);
        }
      } else {
        auto kept = part_kept(i, part, cols, cols_kept, transform);
        if (!kept) return kept.error();
        to_bf16(kept->data(), int64_t(kept->size()), dst);
      }
      row += kr;
    }
    return be_.prepare_bf16(rowmajor.data(), rows, kc);
  }

  Result<ModelWeights> load() {
    ModelWeights w;
    const auto& c = cfg_;
    const float norm_add = (names_.naming == Naming::Hf && c.arch->hf_norm_plus_one) ? 1.f : 0.f;
    auto norm = [&](const std::string& name, int64_t n) -> Result<std::vector<float>> {
      auto v = f32(name, {n});
      if (!v) return v.error();
      for (auto& x : *v) x += norm_add;
      return v;
    };
    const Keep vk = vocab_rows();
    auto em = matrix({{names_.global("embed"), c.vocab, vk}}, c.hidden);
    if (!em) return em.error();
    w.embed = std::move(*em);
    if (!c.tie_embeddings || has(names_.global("output")) || part_is_int4(names_.global("output"))) {
      const std::string out = names_.global("output");
      if (has(out) || part_is_int4(out)) {
        const bool q = quant_ && !fp8_ && (part_is_int4(out) || opts_.int4_lm_head);
        KV_TRY(product({{out, c.vocab, vk}}, c.hidden, w.output, w.output_q, q));
      } else if (!c.tie_embeddings) {
        return make_error(src_.path() + ": missing tensor " + names_.global("output"));
      }
    }
    if (quant_ && !fp8_ && opts_.int4_lm_head && w.output.rows == 0 && w.output_q.empty())
      KV_TRY(product({{names_.global("embed"), c.vocab, vk}}, c.hidden, w.output, w.output_q, true));
    auto on = norm(names_.global("out_norm"), c.hidden);
    if (!on) return on.error();
    w.out_norm = std::move(*on);
    if (has(names_.global("rope_freqs"))) {
      auto rf = f32(names_.global("rope_freqs"), {c.head_dim / 2});
      if (!rf) return rf.error();
      w.rope_freq_factors = std::move(*rf);
    }
    for (int64_t i = 0; i < c.kv_layers(); ++i) {
      LayerWeights L;
      KV_TRY(layer(i, L, norm));
      w.layers.push_back(std::move(L));
    }
    for (int64_t k = 0; k < c.mtp_layers; ++k) {
      // The MTP layer's own parts, under its decoder layer's prefix.
      const std::string p = "model.layers." + std::to_string(c.layers + k) + ".";
      MtpWeights M;
      for (auto [name, dst] : {std::pair{"enorm", &M.enorm}, {"hnorm", &M.hnorm},
                               {"shared_head.norm", &M.head_norm}}) {
        auto v = norm(p + name + ".weight", c.hidden);
        if (!v) return v.error();
        *dst = std::move(*v);
      }
      auto eh = matrix({{p + "eh_proj.weight", c.hidden}}, 2 * c.hidden);
      if (!eh) return eh.error();
      M.eh_proj = std::move(*eh);
      w.mtp.push_back(std::move(M));
    }
    return w;
  }

  // Decoder layer i: attention (GQA or latent), the MLP or the routed
  // experts, the norms.
  template <class Norm>
  Result<void> layer(int64_t i, LayerWeights& L, Norm& norm) {
    const auto& c = cfg_;
    const bool unpermute = names_.naming == Naming::Gguf && c.arch->gguf_qk_permuted;
    auto N = [&](const char* role) { return names_.layer(i, role); };
    auto an = norm(N("attn_norm"), c.hidden); if (!an) return an.error();
    L.attn_norm = std::move(*an);
    if (c.mla()) {
      KV_TRY(mla(i, L));
    } else {
      std::function<void(size_t, std::vector<float>&)> perm;
      if (unpermute)
        perm = [&](size_t part, std::vector<float>& v) {
          if (part < 2) unpermute_rows(v, part == 0 ? c.heads : c.kv_heads, c.head_dim, c.hidden);
        };
      const Keep qr = q_rows(c.head_dim), kr = kv_rows();
      KV_TRY(product({{N("wq"), c.q_dim(), qr}, {N("wk"), c.kv_dim(), kr}, {N("wv"), c.kv_dim(), kr}},
                     c.hidden, L.wqkv, L.wqkv_q, quant_, perm));
      if (c.qkv_bias) {
        for (auto [role, n, k] : {std::tuple{"bq", c.q_dim(), qr}, {"bk", c.kv_dim(), kr},
                                  {"bv", c.kv_dim(), kr}}) {
          auto b = f32(N(role), {n});
          if (!b) return b.error();
          const std::vector<float> s = slice_f32(std::move(*b), n, 1, k, {});
          L.bqkv.insert(L.bqkv.end(), s.begin(), s.end());
        }
      }
      if (c.qk_norm) {
        auto qn = norm(N("q_norm"), c.head_dim); if (!qn) return qn.error();
        auto kn = norm(N("k_norm"), c.head_dim); if (!kn) return kn.error();
        L.q_norm = std::move(*qn);
        L.k_norm = std::move(*kn);
      }
      KV_TRY(product({{N("wo"), c.hidden}}, c.q_dim(), L.wo, L.wo_q, quant_, {}, qr));
    }
    auto fnm = norm(N("ffn_norm"), c.hidden); if (!fnm) return fnm.error();
    L.ffn_norm = std::move(*fnm);
    if (!c.moe_layer.empty() && c.moe_layer[size_t(i)]) {
      KV_TRY(moe(i, L));
    } else {
      const Keep fk = ffn_keep();
      KV_TRY(product({{N("w_gate"), c.ffn, fk}, {N("w_up"), c.ffn, fk}}, c.hidden, L.w_gate_up,
                     L.w_gate_up_q, quant_));
      KV_TRY(product({{N("w_down"), c.hidden}}, c.ffn, L.w_down, L.w_down_q, quant_, {}, fk));
    }
    if (c.post_norms) {
      auto pa = norm(N("post_attn_norm"), c.hidden); if (!pa) return pa.error();
      auto pf = norm(N("post_ffn_norm"), c.hidden); if (!pf) return pf.error();
      L.post_attn_norm = std::move(*pa);
      L.post_ffn_norm = std::move(*pf);
    }
    return {};
  }

 private:
  // Inverse of the GGUF converter's permutation: rows of each head were
  // reordered from [2, d/2] (halves) to [d/2, 2] (interleaved pairs).
  static void unpermute_rows(std::vector<float>& v, int64_t heads, int64_t hd, int64_t cols) {
    std::vector<float> tmp(size_t(hd * cols));
    for (int64_t h = 0; h < heads; ++h) {
      float* base = v.data() + h * hd * cols;
      for (int64_t r = 0; r < hd; ++r) {
        // GGUF row r = 2*i + j holds HF row j*(hd/2) + i.
        const int64_t i = r / 2, j = r % 2;
        const int64_t hf_row = j * (hd / 2) + i;
        std::copy(base + r * cols, base + (r + 1) * cols, tmp.begin() + hf_row * cols);
      }
      std::copy(tmp.begin(), tmp.end(), base);
    }
  }
  static std::string fmt(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

  const TensorSource& src_;
  const ModelConfig& cfg_;
  Names names_;
  bool quant_ = false;  // the set's products take INT4 or FP8 where they can
  bool keep_bf16_ = false;
  bool fp8_ = false;    // ... and it is FP8
  WeightSetOptions opts_;
  const backend::Backend& be_;
  const dist::ShardPlan* sp_ = nullptr;  // null: the whole model
};

}  // namespace

const char* weight_precision_name(WeightPrecision p) {
  switch (p) {
    case WeightPrecision::kBf16: return "bf16";
    case WeightPrecision::kInt4: return "int4";
    case WeightPrecision::kFp8: return "fp8";
    default: return "native";
  }
}

bool checkpoint_is_int4(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return false;
  std::ifstream f(fs::path(path) / "config.json");
  if (!f) return false;
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return false;
  auto s = parse_quantization_config(j);
  return s && s->has_value();
}

Result<LoadedModel> load_model(const std::string& path, const WeightSetOptions& opts) {
  auto f = ModelFiles::open(path);
  if (!f) return f.error();
  return load_model(**f, opts);
}

namespace {
// The MTP layer when asked for: the checkpoint's first one, its decoder
// layer after the main ones (per-layer switches extended to it: its MLP is
// routed when the last main layer's is; under sparse attention it runs an
// indexer of its own).
Result<void> apply_mtp_option(const ModelFiles& files, Naming naming, const WeightSetOptions& opts,
                              ModelConfig& c) {
  if (!opts.mtp) {
    c.mtp_layers = 0;
    return {};
  }
  const std::string why = files.path() + ": multi-token prediction (--mtp): ";
  if (naming != Naming::Hf || c.nextn_layers <= 0)
    return make_error(why + "the checkpoint has no MTP layer (a Hugging Face config.json with "
                            "num_nextn_predict_layers, as DeepSeek-V3 and GLM-4.5 have)");
  c.mtp_layers = 1;
  if (!c.moe_layer.empty()) c.moe_layer.push_back(c.moe_layer.back());
  if (!c.sliding.empty()) c.sliding.push_back(0);
  if (!c.index_full.empty()) c.index_full.push_back(1);  // DSA: an indexer of its own
  return {};
}
}  // namespace

Result<LoadedModel> load_model(const ModelFiles& files, const WeightSetOptions& opts) {
  namespace fs = std::filesystem;
  LoadedModel m;
  Naming naming;
  if (files.is_directory()) {
    auto c = config_from_hf(*files.hf_config(),
                            (fs::path(files.path()) / "config.json").string());
    if (!c) return c.error();
    m.config = std::move(*c);
    naming = Naming::Hf;
  } else {
    auto c = config_from_gguf(*files.gguf());
    if (!c) return c.error();
    m.config = std::move(*c);
    naming = Naming::Gguf;
  }
  KV_TRY(apply_mtp_option(files, naming, opts, m.config));
  WeightPrecision prec = opts.precision;
  if (prec == WeightPrecision::kNative)
    prec = files.int4() ? WeightPrecision::kInt4
           : files.fp8() ? WeightPrecision::kFp8
                         : WeightPrecision::kBf16;
  auto plan = dist::make_shard_plan(m.config, opts.tp, opts.tp_rank, opts.ep, opts.ep_rank,
                                    opts.shard_align);
  if (!plan && opts.shard_align_fallback > 0)
    plan = dist::make_shard_plan(m.config, opts.tp, opts.tp_rank, opts.ep, opts.ep_rank,
                                 opts.shard_align_fallback);
  if (!plan) return make_error(files.path() + ": " + plan.error().message);
  m.shard = *plan;
  std::unique_ptr<backend::Backend> own;
  if (!opts.backend) own = backend::make_cpu_backend();
  Loader l(files.tensors(), m.config, naming, prec, opts, opts.backend ? *opts.backend : *own,
           m.shard);
  l.keep_stored_bf16(files.int4() &&
                     (opts.keep_stored_bf16 || opts.precision == WeightPrecision::kNative));
  auto w = l.load();
  if (!w) return w.error();
  m.weights = std::move(*w);
  return m;
}

}  // namespace kvant
