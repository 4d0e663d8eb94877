// Static FP8 KV scales (engine.h): calibration over a model run, and the
// JSON file they are kept in.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "kvcache/kv_layout.h"
#include "model/seq_kv.h"

namespace kvant {

std::string default_kv_scales_path(const std::string& model_path) {
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p + ".kv_scales.json";
}

Result<StaticKvScales> static_kv_scales(const KvScales& s, const std::string& path, int64_t layers,
                                        int64_t model_heads, int64_t held_begin, int64_t held_end,
                                        KvDType dtype) {
  if (s.layers != layers || s.kv_heads != model_heads)
    return make_error(path + " has scales for " + std::to_string(s.layers) + " layers x " +
                      std::to_string(s.kv_heads) + " KV heads; the model has " +
                      std::to_string(layers) + " x " + std::to_string(model_heads));
  KV_CHECK(0 <= held_begin && held_begin <= held_end && held_end <= model_heads);
  const float mf = kv_dtype_max_finite(dtype);
  StaticKvScales out;
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = held_begin; h < held_end; ++h) {
      const size_t i = size_t(l * model_heads + h);
      out.k.push_back(s.k_amax[i] > 0 ? s.k_amax[i] / mf : 1.f);
      out.v.push_back(s.v_amax[i] > 0 ? s.v_amax[i] / mf : 1.f);
    }
  return out;
}

Result<KvScales> calibrate_kv_scales(ModelRunner& model, std::span<const int32_t> tokens,
                                     int64_t chunk) {
  const ModelConfig& c = model.config();
  if (tokens.empty()) return make_error("calibrate-kv: no calibration tokens");
  if (chunk <= 0) return make_error("calibrate-kv: chunk must be positive");
  KvScales s;
  s.layers = c.layers;
  // MLA caches one latent row per token (K and V at once): one "head".
  const int64_t kvh = c.cache_heads();
  s.kv_heads = kvh;
  s.k_amax.assign(size_t(c.layers * kvh), 0.f);
  s.v_amax.assign(size_t(c.layers * kvh), 0.f);
  std::vector<float> logits(size_t(c.vocab));
  const int64_t hd = c.cache_dim();
  for (size_t p = 0; p < tokens.size(); p += size_t(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(tokens.size() - p));
    SeqKv kv(c, n);
    KV_TRY(model.forward(RunChunk{&kv, 0, tokens.subspan(p, size_t(n)), false}, logits));
    const KvFormat& f = *kv.format;
    for (int64_t l = 0; l < c.layers; ++l)
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t* page = kv.pages[t / f.page_tokens] + l * f.layer_bytes;
        const auto* kr = reinterpret_cast<const uint16_t*>(page + f.k_offset +
                                                           (t % f.page_tokens) * f.row_bytes());
        const auto* vr = reinterpret_cast<const uint16_t*>(page + f.v_offset +
                                                           (t % f.page_tokens) * f.row_bytes());
        for (int64_t h = 0; h < kvh; ++h) {
          float& ka = s.k_amax[size_t(l * kvh + h)];
          float& va = s.v_amax[size_t(l * kvh + h)];
          for (int64_t d = 0; d < hd; ++d) {
            uint32_t kb = uint32_t(kr[h * hd + d]) << 16, vb = uint32_t(vr[h * hd + d]) << 16;
            float kf, vf;
            std::memcpy(&kf, &kb, 4);
            std::memcpy(&vf, &vb, 4);
            if (std::isfinite(kf)) ka = std::max(ka, std::fabs(kf));
            if (std::isfinite(vf)) va = std::max(va, std::fabs(vf));
          }
        }
      }
    s.tokens += n;
  }
  return s;
}

Result<void> save_kv_scales(const KvScales& s, const std::string& path) {
  nlohmann::json j;
  j["format"] = "kvant.kv_scales.v1";
  j["layers"] = s.layers;
  j["kv_heads"] = s.kv_heads;
  j["tokens"] = s.tokens;
  j["source"] = s.source;
  j["k_amax"] = s.k_amax;
  j["v_amax"] = s.v_amax;
  std::ofstream f(path);
  if (!f) return make_error("cannot write " + path);
  f << j.dump(1) << "\n";
  if (!f) return make_error("cannot write " + path);
  return {};
}

Result<KvScales> load_kv_scales(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error("cannot open KV scales file " + path);
  auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != "kvant.kv_scales.v1")
    return make_error(path + ": not a kvant KV scales file (format kvant.kv_scales.v1)");
  KvScales s;
  try {
    s.layers = j.at("layers").get<int64_t>();
    s.kv_heads = j.at("kv_heads").get<int64_t>();
    s.tokens = j.value("tokens", int64_t(0));
    s.source = j.value("source", "");
    s.k_amax = j.at("k_amax").get<std::vector<float>>();
    s.v_amax = j.at("v_amax").get<std::vector<float>>();
  } catch (const std::exception& e) {
    return make_error(path + ": " + e.what());
  }
  const size_t want = size_t(s.layers * s.kv_heads);
  if (s.layers <= 0 || s.kv_heads <= 0 || s.k_amax.size() != want || s.v_amax.size() != want)
    return make_error(path + ": expected " + std::to_string(want) + " K and V scales");
  for (size_t i = 0; i < want; ++i)
    if (!std::isfinite(s.k_amax[i]) || !std::isfinite(s.v_amax[i]) || s.k_amax[i] < 0 ||
        s.v_amax[i] < 0)
      return make_error(path + ": scale " + std::to_string(i) + " is negative or not finite");
  return s;
}

}  // namespace kvant
