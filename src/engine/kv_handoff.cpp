// KvHandoff helpers (kv_handoff.h): the layout digest and its explanation.
#include "engine/kv_handoff.h"

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 with the widest vectors the CPU has, chosen at run time
#endif

#include <cstring>

namespace kvant {

namespace {
struct Hasher {
  XXH3_state_t* st = XXH3_createState();
  Hasher() { XXH3_64bits_reset_withSeed(st, 0x6b765f6c61796f75ull); }
  ~Hasher() { XXH3_freeState(st); }
  void add(const void* p, size_t n) { XXH3_64bits_update(st, p, n); }
  void i64(int64_t v) { add(&v, sizeof v); }
  uint64_t done() { return XXH3_64bits_digest(st); }
};
}  // namespace

uint64_t kv_layout_hash(const PagePool& pool) {
  const KvLayout& l = pool.layout();
  const KvGeometry& g = l.geometry;
  Hasher h;
  const char tag[] = "kvant.kv_layout.v1";
  h.add(tag, sizeof tag);
  for (int64_t v : {g.layers, g.kv_heads, g.head_dim, int64_t(g.dtype), g.page_tokens,
                    int64_t(g.scale_mode), int64_t(g.shared_kv), g.index_dim, l.elem_bytes,
                    l.row_elems, l.data_block_bytes, l.scale_block_bytes, l.k_offset, l.v_offset,
                    l.k_scale_offset, l.v_scale_offset, l.index_offset, l.index_block_bytes,
                    l.layer_bytes, l.page_bytes})
    h.i64(v);
  if (g.scale_mode == KvScaleMode::kStatic) {
    for (int64_t layer = 0; layer < g.layers; ++layer) {
      h.add(pool.static_k_scales(layer), size_t(g.kv_heads) * sizeof(float));
      h.add(pool.static_v_scales(layer), size_t(g.kv_heads) * sizeof(float));
    }
  }
  return h.done();
}

std::string kv_layout_difference(const KvLayout& a, const KvLayout& b) {
  const KvGeometry &x = a.geometry, &y = b.geometry;
  auto num = [](const char* what, int64_t u, int64_t v) {
    return std::string(what) + " " + std::to_string(u) + " vs " + std::to_string(v);
  };
  if (x.layers != y.layers) return num("layers", x.layers, y.layers);
  if (x.kv_heads != y.kv_heads) return num("KV heads", x.kv_heads, y.kv_heads);
  if (x.head_dim != y.head_dim) return num("head width", x.head_dim, y.head_dim);
  if (x.dtype != y.dtype)
    return std::string("KV dtype ") + kv_dtype_name(x.dtype) + " vs " + kv_dtype_name(y.dtype);
  if (x.page_tokens != y.page_tokens) return num("page tokens", x.page_tokens, y.page_tokens);
  if (x.scale_mode != y.scale_mode)
    return std::string("FP8 scale mode ") + kv_scale_mode_name(x.scale_mode) + " vs " +
           kv_scale_mode_name(y.scale_mode);
  if (x.shared_kv != y.shared_kv) return num("shared K/V (MLA)", x.shared_kv, y.shared_kv);
  if (x.index_dim != y.index_dim) return num("indexer key width", x.index_dim, y.index_dim);
  if (a.page_bytes != b.page_bytes) return num("page bytes", a.page_bytes, b.page_bytes);
  return "static FP8 scales (different calibration files)";
}

uint64_t kv_page_checksum(const uint8_t* bytes, int64_t n) { return XXH3_64bits(bytes, size_t(n)); }

}  // namespace kvant
