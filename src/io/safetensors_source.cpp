// TensorSource over one or more safetensors files, and the shard-index
// loader. FP8 block scales follow the DeepSeek-V3 convention: an F8_E4M3
// weight [..., R, C] with a sibling `<name>_scale_inv` of shape
// [..., ceil(R/128), ceil(C/128)] (F32 or BF16) decodes as
// w[r][c] = fp8(w[r][c]) * scale_inv[r/128][c/128]; despite its name the
// "inverse" scale multiplies. Scales are validated when the source is made,
// so a read can only fail on its own arguments.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "io/dequant.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {
namespace {

constexpr int64_t kScaleBlock = TensorSource::kFp8ScaleBlock;
constexpr const char* kScaleSuffix = "_scale_inv";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

class SafetensorsSource final : public TensorSource {
 public:
  static Result<std::unique_ptr<TensorSource>> make(std::vector<SafetensorsFile> shards,
                                                    std::string path) {
    std::unique_ptr<SafetensorsSource> s(new SafetensorsSource());
    s->path_ = std::move(path);
    s->shards_ = std::move(shards);
    for (size_t si = 0; si < s->shards_.size(); ++si) {
      const auto& f = s->shards_[si];
      for (const auto& t : f.tensors()) {
        auto [it, fresh] = s->index_.emplace(t.name, s->refs_.size());
        if (!fresh)
          return make_error(s->path_ + ": tensor \"" + t.name + "\" is in both " +
                            s->shards_[s->entries_[it->second].shard].path() + " and " + f.path());
        s->refs_.push_back(TensorRef{t.name, t.shape, t.dtype, f.tensor_bytes(t)});
        s->entries_.push_back(Entry{si, -1});
      }
    }
    for (size_t i = 0; i < s->refs_.size(); ++i) KV_TRY(s->attach_scale(i));
    return std::unique_ptr<TensorSource>(std::move(s));
  }

  const std::string& path() const override { return path_; }
  const std::vector<TensorRef>& tensors() const override { return refs_; }
  const TensorRef* find(const std::string& name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &refs_[it->second];
  }

  Result<void> read_f32_rows(const TensorRef& t, int64_t begin, int64_t end,
                             std::span<float> out) const override {
    const TensorRef* own = find(t.name);
    if (!own) return make_error(path_ + ": no tensor \"" + t.name + "\"");
    const size_t i = size_t(own - refs_.data());
    const std::string what = shards_[entries_[i].shard].path() + ": tensor \"" + t.name + "\"";
    const int64_t rows = num_rows(*own), len = row_length(*own);
    if (begin < 0 || end < begin || end > rows)
      return make_error(what + ": row range [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") outside its " + std::to_string(rows) + " rows");
    if (out.size() != uint64_t((end - begin) * len))
      return make_error(what + ": output holds " + std::to_string(out.size()) + " values, " +
                        std::to_string((end - begin) * len) + " needed");
    if (entries_[i].scale < 0)
      return dequantize_range(own->dtype, own->data, begin * len, end * len, out, what);
    read_block_scaled(*own, refs_[size_t(entries_[i].scale)], entries_[i].block_rows,
                      entries_[i].block_cols, begin, end, out.data());
    return {};
  }

  std::optional<Fp8Scales> fp8_scales(const TensorRef& t) const override {
    const TensorRef* own = find(t.name);
    if (!own || own->dtype != DType::F8_E4M3 || own->shape.size() != 2) return std::nullopt;
    const Entry& e = entries_[size_t(own - refs_.data())];
    if (e.scale < 0) return Fp8Scales{nullptr, own->shape[0], own->shape[1]};
    return Fp8Scales{&refs_[size_t(e.scale)], e.block_rows, e.block_cols};
  }

 private:
  struct Entry {
    size_t shard;
    int64_t scale = -1;  // index in refs_ of this FP8 weight's scales, or -1
    int64_t block_rows = 0, block_cols = 0;  // rows and columns one scale covers
  };
  SafetensorsSource() = default;

  // An FP8 weight's scales: `<name>_scale_inv` (DeepSeek-V3) or
  // `<name>_scale` (compressed-tensors float-quantized), F32 or BF16, one per
  // 128x128 block ([ceil(R/128), ceil(C/128)]), per row ([R, 1]) or per
  // tensor ([1] or [1, 1]); leading dimensions as the weight's.
  Result<void> attach_scale(size_t i) {
    const TensorRef& w = refs_[i];
    if (w.dtype != DType::F8_E4M3) return {};
    auto it = index_.find(w.name + kScaleSuffix);
    if (it == index_.end()) it = index_.find(w.name + "_scale");
    if (it == index_.end()) return {};
    const TensorRef& s = refs_[it->second];
    const std::string what =
        shards_[entries_[it->second].shard].path() + ": tensor \"" + s.name + "\"";
    if (s.dtype != DType::F32 && s.dtype != DType::BF16)
      return make_error(what + ": block scales must be F32 or BF16, not " + dtype_name(s.dtype));
    const size_t r = w.shape.size();
    std::vector<int64_t> want = w.shape;
    if (r >= 2) {
      want[r - 2] = (w.shape[r - 2] + kScaleBlock - 1) / kScaleBlock;
      want[r - 1] = (w.shape[r - 1] + kScaleBlock - 1) / kScaleBlock;
    }
    std::vector<int64_t> got = s.shape;
    if (r == 2 && got.size() == 1 && got[0] == 1) got = {1, 1};  // one per tensor
    bool ok = r >= 2 && got.size() == r &&
              std::equal(got.begin(), got.end() - 2, w.shape.begin());
    int64_t br = 0, bc = 0;
    if (ok) {
      const int64_t R = w.shape[r - 2], C = w.shape[r - 1], SR = got[r - 2], SC = got[r - 1];
      br = SR == want[r - 2] ? kScaleBlock : SR == R ? 1 : SR == 1 ? R : 0;
      bc = SC == want[r - 1] ? kScaleBlock : SC == 1 ? C : 0;
      ok = br > 0 && bc > 0;
    }
    if (!ok)
      return make_error(what + ": shape " + shape_str(s.shape) +
                        " does not give one scale per 128x128 block, per row or per tensor of \"" +
                        w.name + "\" " + shape_str(w.shape) +
                        (r < 2 ? "" : " (expected " + shape_str(want) + ")"));
    entries_[i].scale = int64_t(it->second);
    entries_[i].block_rows = br;
    entries_[i].block_cols = bc;
    return {};
  }

  // Rows [begin, end) of an FP8 weight [..., R, C] times its scales, one per
  // br x bc tile.
  static void read_block_scaled(const TensorRef& w, const TensorRef& s, int64_t br, int64_t bc,
                                int64_t begin, int64_t end, float* out) {
    const size_t r = w.shape.size();
    const int64_t R = w.shape[r - 2], C = w.shape[r - 1];
    const int64_t SR = (R + br - 1) / br, SC = (C + bc - 1) / bc;
    const float* fp8 = fp8_e4m3_table();
    const bool bf16 = s.dtype == DType::BF16;
    auto scale_at = [&](int64_t k) {
      if (bf16) {
        uint16_t h;
        std::memcpy(&h, s.data.data() + 2 * k, 2);
        return bf16_to_f32(h);
      }
      float f;
      std::memcpy(&f, s.data.data() + 4 * k, 4);
      return f;
    };
    for (int64_t g = begin; g < end; ++g, out += C) {
      const int64_t srow = (g / R) * SR + (g % R) / br;
      const uint8_t* src = w.data.data() + g * C;
      for (int64_t cb = 0; cb < SC; ++cb) {
        const float sc = scale_at(srow * SC + cb);
        const int64_t c1 = std::min(C, (cb + 1) * bc);
        for (int64_t c = cb * bc; c < c1; ++c) out[c] = fp8[src[c]] * sc;
      }
    }
  }

  std::string path_;
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorRef> refs_;
  std::vector<Entry> entries_;  // parallel to refs_
  std::map<std::string, size_t> index_;
};

Result<std::unique_ptr<TensorSource>> open_single(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (!f) return f.error();
  std::vector<SafetensorsFile> shards;
  shards.push_back(std::move(*f));
  return make_safetensors_source(std::move(shards), path);
}

Result<std::unique_ptr<TensorSource>> open_index(const std::string& index_path) {
  auto m = MappedFile::open(index_path);
  if (!m) return m.error();
  const auto b = m->bytes();
  auto idx = parse_safetensors_index(
      std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), index_path);
  if (!idx) return idx.error();
  if (idx->weight_map.empty()) return make_error(index_path + ": weight_map is empty");
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  // One shard per file name, remembering a tensor it should hold for the error message.
  std::map<std::string, std::string> shard_names;
  for (const auto& [tensor, shard] : idx->weight_map) shard_names.emplace(shard, tensor);
  std::vector<SafetensorsFile> shards;
  std::map<std::string, size_t> shard_pos;
  for (const auto& [shard, tensor] : shard_names) {
    auto f = SafetensorsFile::open((dir / shard).string());
    if (!f)
      return make_error(index_path + ": shard \"" + shard + "\" (holding tensor \"" + tensor +
                        "\") cannot be read: " + f.error().message);
    shard_pos[shard] = shards.size();
    shards.push_back(std::move(*f));
  }
  for (const auto& [tensor, shard] : idx->weight_map)
    if (!shards[shard_pos[shard]].find(tensor))
      return make_error(index_path + ": weight_map puts tensor \"" + tensor + "\" in shard \"" +
                        shard + "\", which has no such tensor");
  return make_safetensors_source(std::move(shards), index_path);
}

}  // namespace

Result<std::unique_ptr<TensorSource>> make_safetensors_source(std::vector<SafetensorsFile> shards,
                                                              std::string path) {
  return SafetensorsSource::make(std::move(shards), std::move(path));
}

Result<std::unique_ptr<TensorSource>> open_safetensors_source(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors.index.json", ec))
      return open_index((dir / "model.safetensors.index.json").string());
    if (fs::exists(dir / "model.safetensors", ec))
      return open_single((dir / "model.safetensors").string());
    return make_error(path +
                      ": directory has neither model.safetensors nor model.safetensors.index.json");
  }
  if (path.ends_with(".json")) return open_index(path);
  return open_single(path);
}

}  // namespace kvant
