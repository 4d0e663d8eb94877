// PagePool bookkeeping, page memory accessors and the write/read reference
// (see page_pool.h). Checksums and the invariant checker are in
// page_pool_check.cpp.
#include "kvcache/page_pool.h"

#include <cmath>
#include <string>

#include "core/check.h"
#include "kvcache/kv_codec.h"
#include "numerics/bf16.h"

namespace kvant {
namespace {

// Expands [layers] or [layers, kv_heads] scales to [layers, kv_heads].
Result<std::vector<float>> expand_scales(const std::vector<float>& s, const KvGeometry& g,
                                         const char* which) {
  const size_t per_layer = size_t(g.layers), per_head = size_t(g.layers * g.kv_heads);
  if (s.size() != per_layer && s.size() != per_head)
    return make_error(std::string("kv pool: static ") + which + " scales: expected " +
                      std::to_string(per_layer) + " (per layer) or " + std::to_string(per_head) +
                      " (per layer and head) values, got " + std::to_string(s.size()));
  for (size_t i = 0; i < s.size(); ++i)
    if (!std::isfinite(s[i]) || !(s[i] > 0.0f))
      return make_error(std::string("kv pool: static ") + which + " scale " + std::to_string(i) +
                        " is " + std::to_string(s[i]) + "; scales must be finite and > 0");
  if (s.size() == per_head) return s;
  std::vector<float> out(per_head);
  for (int64_t l = 0; l < g.layers; ++l)
    for (int64_t h = 0; h < g.kv_heads; ++h) out[size_t(l * g.kv_heads + h)] = s[size_t(l)];
  return out;
}

}  // namespace

Result<std::unique_ptr<PagePool>> PagePool::create(const PagePoolOptions& o) {
  auto layout = make_kv_layout(o.geometry);
  if (!layout) return layout.error();
  const KvGeometry& g = o.geometry;
  int64_t pages = o.num_pages;
  if (pages < 0) return make_error("kv pool: negative page count");
  if (pages == 0) {
    pages = kv_pages_for_budget(*layout, o.memory_bytes);
    if (pages == 0)
      return make_error("kv pool: a budget of " + std::to_string(o.memory_bytes) +
                        " bytes holds no page of " + std::to_string(layout->page_bytes) + " bytes");
  }
  if (pages > kMaxPages)
    return make_error("kv pool: " + std::to_string(pages) + " pages exceed the limit of 2^31");

  std::vector<float> ks, vs;
  if (g.scale_mode == KvScaleMode::kStatic) {
    auto k = expand_scales(o.static_k_scales, g, "K");
    if (!k) return k.error();
    ks = std::move(*k);
    if (g.shared_kv) {
      if (!o.static_v_scales.empty())
        return make_error("kv pool: shared_kv pages take no V scales (the K scale serves both)");
    } else {
      auto v = expand_scales(o.static_v_scales, g, "V");
      if (!v) return v.error();
      vs = std::move(*v);
    }
  } else if (!o.static_k_scales.empty() || !o.static_v_scales.empty()) {
    return make_error(std::string("kv pool: static scales given with scale mode ") +
                      kv_scale_mode_name(g.scale_mode));
  }

  std::unique_ptr<PagePool> pool(new PagePool(*layout, uint32_t(pages), o.arena));
  pool->static_k_ = std::move(ks);
  pool->static_v_ = std::move(vs);
  return pool;
}

PagePool::PagePool(const KvLayout& layout, uint32_t num_pages,
                   const std::function<std::shared_ptr<uint8_t>(size_t)>& arena)
    : layout_(layout),
      num_pages_(num_pages),
      arena_(arena ? 0 : size_t(num_pages) * size_t(layout.page_bytes)),
      ext_arena_(arena ? arena(size_t(num_pages) * size_t(layout.page_bytes)) : nullptr),
      base_(arena ? ext_arena_.get() : arena_.data()),
      generations_(num_pages, kFreeGeneration),
      refcounts_(num_pages, 0),
      checksums_(num_pages, 0),
      sealed_(num_pages, 0) {
  // Reserved once so releasing never reallocates (decode must not allocate).
  free_list_.reserve(num_pages);
  // Pushed in reverse so allocation hands out low page ids first.
  for (uint32_t p = num_pages; p > 0; --p) free_list_.push_back(p - 1);
}

std::optional<PageRef> PagePool::allocate() {
  if (free_list_.empty()) return std::nullopt;
  const uint32_t p = free_list_.back();
  free_list_.pop_back();
  const uint32_t gen = next_generation_;
  // Skips 0 on wrap-around: 0 marks a free page and never verifies.
  next_generation_ = next_generation_ == UINT32_MAX ? 1 : next_generation_ + 1;
  generations_[p] = gen;
  refcounts_[p] = 1;
  ++stats_.allocations;
  return PageRef{p, gen};
}

Result<void> PagePool::check_ref(PageRef ref, const char* what) const {
  if (ref.page >= num_pages_)
    return make_error(std::string(what) + ": page " + std::to_string(ref.page) +
                      " out of range (pool has " + std::to_string(num_pages_) + " pages)");
  const uint32_t cur = generations_[ref.page];
  if (cur == kFreeGeneration)
    return make_error(std::string(what) + ": page " + std::to_string(ref.page) +
                      " is free (double free or use after free; reference generation " +
                      std::to_string(ref.generation) + ")");
  if (cur != ref.generation)
    return make_error(std::string(what) + ": stale reference to page " + std::to_string(ref.page) +
                      ": expected generation " + std::to_string(ref.generation) + ", page has " +
                      std::to_string(cur));
  return {};
}

Result<void> PagePool::retain(PageRef ref) {
  KV_TRY(check_ref(ref, "retain"));
  if (refcounts_[ref.page] == UINT32_MAX)
    return make_error("retain: page " + std::to_string(ref.page) + " refcount overflow");
  ++refcounts_[ref.page];
  return {};
}

Result<void> PagePool::release(PageRef ref) {
  auto r = check_ref(ref, "release");
  if (!r) {
    ++stats_.release_errors;
    return r;
  }
  ++stats_.releases;
  if (--refcounts_[ref.page] == 0) free_page(ref.page);
  return {};
}

void PagePool::free_page(uint32_t page) {
  generations_[page] = kFreeGeneration;
  refcounts_[page] = 0;
  sealed_[page] = 0;
  free_list_.push_back(page);
}

void PagePool::force_free(uint32_t page) {
  KV_CHECK_LT(page, num_pages_);
  if (generations_[page] == kFreeGeneration) return;
  free_page(page);
}

uint32_t PagePool::generation(uint32_t page) const {
  KV_CHECK_LT(page, num_pages_);
  return generations_[page];
}

uint32_t PagePool::refcount(uint32_t page) const {
  KV_CHECK_LT(page, num_pages_);
  return refcounts_[page];
}

int64_t PagePool::block_offset(uint32_t page, int64_t layer) const {
  KV_CHECK_LT(page, num_pages_);
  KV_CHECK(layer >= 0 && layer < layout_.geometry.layers);
  return int64_t(page) * layout_.page_bytes + layer * layout_.layer_bytes;
}

uint8_t* PagePool::page_data(uint32_t page) {
  KV_CHECK_LT(page, num_pages_);
  return base_ + int64_t(page) * layout_.page_bytes;
}
const uint8_t* PagePool::page_data(uint32_t page) const {
  KV_CHECK_LT(page, num_pages_);
  return base_ + int64_t(page) * layout_.page_bytes;
}

void* PagePool::k_data(uint32_t page, int64_t layer) {
  return base_ + block_offset(page, layer) + layout_.k_offset;
}
void* PagePool::v_data(uint32_t page, int64_t layer) {
  return base_ + block_offset(page, layer) + layout_.v_offset;
}
const void* PagePool::k_data(uint32_t page, int64_t layer) const {
  return base_ + block_offset(page, layer) + layout_.k_offset;
}
const void* PagePool::v_data(uint32_t page, int64_t layer) const {
  return base_ + block_offset(page, layer) + layout_.v_offset;
}

uint16_t* PagePool::k_scales(uint32_t page, int64_t layer) {
  if (layout_.scale_block_bytes == 0) return nullptr;
  return reinterpret_cast<uint16_t*>(base_ + block_offset(page, layer) +
                                  layout_.k_scale_offset);
}
uint16_t* PagePool::v_scales(uint32_t page, int64_t layer) {
  if (layout_.scale_block_bytes == 0) return nullptr;
  return reinterpret_cast<uint16_t*>(base_ + block_offset(page, layer) +
                                  layout_.v_scale_offset);
}
const uint16_t* PagePool::k_scales(uint32_t page, int64_t layer) const {
  return const_cast<PagePool*>(this)->k_scales(page, layer);
}
const uint16_t* PagePool::v_scales(uint32_t page, int64_t layer) const {
  return const_cast<PagePool*>(this)->v_scales(page, layer);
}

const float* PagePool::static_k_scales(int64_t layer) const {
  if (static_k_.empty()) return nullptr;
  KV_CHECK(layer >= 0 && layer < layout_.geometry.layers);
  return static_k_.data() + layer * layout_.geometry.kv_heads;
}
const float* PagePool::static_v_scales(int64_t layer) const {
  if (static_k_.empty()) return nullptr;
  KV_CHECK(layer >= 0 && layer < layout_.geometry.layers);
  const auto& v = layout_.geometry.shared_kv ? static_k_ : static_v_;
  return v.data() + layer * layout_.geometry.kv_heads;
}

void PagePool::write_token(uint32_t page, int64_t slot, int64_t layer, const float* k,
                           const float* v) {
  const KvGeometry& g = layout_.geometry;
  KV_CHECK_LT(page, num_pages_);
  KV_CHECK(slot >= 0 && slot < g.page_tokens);
  KV_CHECK_NE(generations_[page], kFreeGeneration);
  KV_CHECK_EQ(int(sealed_[page]), 0);
  KV_CHECK(k != nullptr);
  KV_CHECK_EQ(v == nullptr, g.shared_kv);
  const int64_t row_bytes = layout_.row_elems * layout_.elem_bytes;
  const int64_t head_bytes = g.head_dim * layout_.elem_bytes;
  for (int s = 0; s < (g.shared_kv ? 1 : 2); ++s) {
    const float* x = s == 0 ? k : v;
    auto* dst = static_cast<uint8_t*>(s == 0 ? k_data(page, layer) : v_data(page, layer)) +
                slot * row_bytes;
    uint16_t* dyn = s == 0 ? k_scales(page, layer) : v_scales(page, layer);
    const float* fixed = s == 0 ? static_k_scales(layer) : static_v_scales(layer);
    for (int64_t h = 0; h < g.kv_heads; ++h) {
      const float* xh = x + h * g.head_dim;
      float scale = 1.0f;
      if (g.scale_mode == KvScaleMode::kDynamic) {
        scale = kv_dynamic_scale(g.dtype, xh, g.head_dim);
        dyn[slot * g.kv_heads + h] = f32_to_bf16(scale);  // exact: the scale is a BF16 value
      } else if (g.scale_mode == KvScaleMode::kStatic) {
        scale = fixed[h];
      }
      kv_encode_row(g.dtype, xh, g.head_dim, scale, dst + h * head_bytes);
    }
  }
}

void PagePool::read_token(uint32_t page, int64_t slot, int64_t layer, float* k, float* v) const {
  const KvGeometry& g = layout_.geometry;
  KV_CHECK_LT(page, num_pages_);
  KV_CHECK(slot >= 0 && slot < g.page_tokens);
  const int64_t row_bytes = layout_.row_elems * layout_.elem_bytes;
  const int64_t head_bytes = g.head_dim * layout_.elem_bytes;
  for (int s = 0; s < 2; ++s) {
    float* out = s == 0 ? k : v;
    if (out == nullptr) continue;
    const auto* src =
        static_cast<const uint8_t*>(s == 0 ? k_data(page, layer) : v_data(page, layer)) +
        slot * row_bytes;
    const uint16_t* dyn = s == 0 ? k_scales(page, layer) : v_scales(page, layer);
    const float* fixed = s == 0 ? static_k_scales(layer) : static_v_scales(layer);
    for (int64_t h = 0; h < g.kv_heads; ++h) {
      float scale = 1.0f;
      if (g.scale_mode == KvScaleMode::kDynamic)
        scale = bf16_to_f32(dyn[slot * g.kv_heads + h]);
      else if (g.scale_mode == KvScaleMode::kStatic)
        scale = fixed[h];
      kv_decode_row(g.dtype, src + h * head_bytes, g.head_dim, scale, out + h * g.head_dim);
    }
  }
}

}  // namespace kvant
