// safetensors header parsing and validation. Layout of a file:
//   [0, 8)         u64 little-endian N, the header length
//   [8, 8+N)       JSON object: {"name": {"dtype", "shape", "data_offsets"}, ...,
//                  optional "__metadata__": {string: string}}
//   [8+N, end)     the data section; data_offsets are relative to its start
// Every number from the header is checked before it is used as a size or an
// offset, so a hostile file can make us fail but never read out of bounds.
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "io/json_text.h"

namespace kvant {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxRank = 16;

std::string str(uint64_t v) { return std::to_string(v); }

// One tensor entry of the header. Errors name the file, tensor and field.
Result<SafetensorsTensor> parse_entry(const std::string& file, const std::string& key,
                                      const Json& e, uint64_t data_offset, uint64_t data_size) {
  const std::string what = file + ": tensor \"" + key + "\"";
  if (!e.is_object()) return make_error(what + ": header entry is not a JSON object");
  SafetensorsTensor t;
  t.name = key;

  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string())
    return make_error(what + ": field dtype missing or not a string");
  t.dtype = dtype_from_safetensors(dt->get<std::string>());
  if (t.dtype == DType::Unknown)
    return make_error(what + ": field dtype has unknown value \"" + dt->get<std::string>() + "\"");

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array())
    return make_error(what + ": field shape missing or not an array");
  if (sh->size() > kMaxRank)
    return make_error(what + ": field shape has " + str(sh->size()) + " dimensions");
  const uint64_t elem = dtype_info(t.dtype).block_bytes;
  // Keeps numel * elem far from overflow; no real tensor comes near 2^56 bytes.
  const uint64_t max_numel = (1ull << 56) / elem;
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned())
      return make_error(what + ": field shape has an entry that is not a non-negative integer");
    const uint64_t v = d.get<uint64_t>();
    if (v != 0 && numel > max_numel / v)
      return make_error(what + ": field shape has too many elements");
    numel *= v;
    t.shape.push_back(int64_t(v));
  }

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return make_error(what + ": field data_offsets must be two non-negative integers");
  const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  if (begin > end)
    return make_error(what + ": data_offsets [" + str(begin) + ", " + str(end) +
                      ") end before they begin");
  if (end > data_size)
    return make_error(what + ": data [" + str(data_offset + begin) + ", " + str(data_offset + end) +
                      ") runs past the end of the file at offset " + str(data_offset + data_size) +
                      "; the file is truncated");
  t.nbytes = end - begin;
  if (numel * elem != t.nbytes)
    return make_error(what + ": shape holds " + str(numel) + " " + dtype_name(t.dtype) +
                      " values (" + str(numel * elem) + " bytes) but data_offsets [" + str(begin) +
                      ", " + str(end) + ") span " + str(t.nbytes) + " bytes, at offset " +
                      str(data_offset + begin));
  t.offset = data_offset + begin;
  return t;
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto m = MappedFile::open(path);
  if (!m) return m.error();
  auto r = parse(m->bytes(), path);
  if (!r) return r.error();
  r->file_ = std::move(*m);
  return r;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const uint8_t> bytes,
                                               const std::string& name) {
  SafetensorsFile f;
  f.bytes_ = bytes;
  f.name_ = name;
  if (bytes.size() < 8)
    return make_error(name + ": file is " + str(bytes.size()) +
                      " bytes, too short for the 8-byte header length at offset 0");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8)
    return make_error(name + ": header length " + str(n) +
                      " at offset 0 runs past the end of the file (" + str(bytes.size()) +
                      " bytes)");
  if (n > kMaxSafetensorsHeader)
    return make_error(name + ": header length " + str(n) + " at offset 0 exceeds the " +
                      str(kMaxSafetensorsHeader) + "-byte limit");
  if (n < 2 || bytes[8] != '{')
    return make_error(name + ": header at offset 8 does not start with a JSON object");
  f.data_offset_ = 8 + n;
  const uint64_t data_size = bytes.size() - f.data_offset_;

  auto parsed =
      parse_json_text(std::string_view(reinterpret_cast<const char*>(bytes.data() + 8), size_t(n)),
                      name + ": header", 8);
  if (!parsed) return parsed.error();
  const Json& h = *parsed;
  if (!h.is_object()) return make_error(name + ": header at offset 8 is not a JSON object");

  f.tensors_.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return make_error(name + ": field __metadata__ is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return make_error(name + ": field __metadata__." + m.key() + " is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    auto t = parse_entry(name, it.key(), *it, f.data_offset_, data_size);
    if (!t) return t.error();
    f.tensors_.push_back(std::move(*t));
  }
  // nlohmann keeps object keys sorted, so restore file order: tensors sorted
  // by offset read the mapping front to back.
  std::stable_sort(f.tensors_.begin(), f.tensors_.end(),
                   [](const auto& a, const auto& b) { return a.offset < b.offset; });
  const SafetensorsTensor* prev = nullptr;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    const auto& t = f.tensors_[i];
    f.index_[t.name] = i;
    if (t.nbytes == 0) continue;
    if (prev && t.offset < prev->offset + prev->nbytes)
      return make_error(name + ": tensors \"" + prev->name + "\" [" + str(prev->offset) + ", " +
                        str(prev->offset + prev->nbytes) + ") and \"" + t.name + "\" [" +
                        str(t.offset) + ", " + str(t.offset + t.nbytes) + ") overlap at offset " +
                        str(t.offset));
    prev = &t;
  }
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& n) const {
  auto it = index_.find(n);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, const std::string& name) {
  auto parsed = parse_json_text(text, name);
  if (!parsed) return parsed.error();
  const Json& j = *parsed;
  if (!j.is_object()) return make_error(name + ": not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    return make_error(name + ": field weight_map missing or not an object");
  SafetensorsIndex idx;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      return make_error(name + ": weight_map entry for tensor \"" + it.key() +
                        "\" is not a string");
    std::string shard = it->get<std::string>();
    // Shards are plain file names beside the index; anything else could
    // reach outside the model directory.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
      return make_error(name + ": weight_map entry for tensor \"" + it.key() + "\" names shard \"" +
                        shard + "\", which is not a plain file name");
    idx.weight_map.emplace(it.key(), std::move(shard));
  }
  return idx;
}

}  // namespace kvant
