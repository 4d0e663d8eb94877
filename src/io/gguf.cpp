// GGUF parsing with a bounds-checked cursor: every read checks the remaining
// length first, counts are checked against what the file could possibly hold
// before anything is reserved, so a hostile header cannot make us allocate.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvant {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxDims = 8;
constexpr uint64_t kMaxStringLen = 1ull << 30;
constexpr int kMaxArrayNesting = 1;  // arrays of arrays are not used by any model

struct Cursor {
  std::span<const uint8_t> b;
  size_t pos = 0;
  const std::string& file;
  std::string err;

  bool fail(const std::string& what) {
    if (err.empty()) err = file + ": " + what + " at offset " + std::to_string(pos);
    return false;
  }
  size_t left() const { return b.size() - pos; }
  template <class T>
  bool read(T& v, const char* what) {
    if (left() < sizeof(T)) return fail(std::string("truncated reading ") + what);
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
  bool read_string(std::string& s, const char* what) {
    uint64_t n;
    if (!read(n, what)) return false;
    if (n > kMaxStringLen || n > left())
      return fail(std::string("string length ") + std::to_string(n) + " out of range in " + what);
    s.assign(reinterpret_cast<const char*>(b.data() + pos), size_t(n));
    pos += size_t(n);
    return true;
  }
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

bool read_scalar(Cursor& c, GgufType t, GgufValue& v, const std::string& key) {
  const char* w = key.c_str();
  switch (t) {
    case GgufType::U8: {
      uint8_t x;
      if (!c.read(x, w)) return false;
      v.u = x;
      v.i = x;
      return true;
    }
    case GgufType::I8: {
      int8_t x;
      if (!c.read(x, w)) return false;
      v.i = x;
      return true;
    }
    case GgufType::U16: {
      uint16_t x;
      if (!c.read(x, w)) return false;
      v.u = x;
      v.i = x;
      return true;
    }
    case GgufType::I16: {
      int16_t x;
      if (!c.read(x, w)) return false;
      v.i = x;
      return true;
    }
    case GgufType::U32: {
      uint32_t x;
      if (!c.read(x, w)) return false;
      v.u = x;
      v.i = x;
      return true;
    }
    case GgufType::I32: {
      int32_t x;
      if (!c.read(x, w)) return false;
      v.i = x;
      return true;
    }
    case GgufType::U64: {
      uint64_t x;
      if (!c.read(x, w)) return false;
      v.u = x;
      v.i = x > uint64_t(std::numeric_limits<int64_t>::max()) ? 0 : int64_t(x);
      return true;
    }
    case GgufType::I64: {
      int64_t x;
      if (!c.read(x, w)) return false;
      v.i = x;
      return true;
    }
    case GgufType::F32: {
      float x;
      if (!c.read(x, w)) return false;
      v.f = x;
      return true;
    }
    case GgufType::F64: {
      double x;
      if (!c.read(x, w)) return false;
      v.f = x;
      return true;
    }
    case GgufType::Bool: {
      uint8_t x;
      if (!c.read(x, w)) return false;
      if (x > 1) return c.fail("bool value " + std::to_string(x) + " in " + key);
      v.b = x;
      v.i = x;
      return true;
    }
    case GgufType::String:
      return c.read_string(v.s, w);
    default:
      return c.fail("unknown value type " + std::to_string(uint32_t(t)) + " in " + key);
  }
}

double scalar_as_double(const GgufValue& v) {
  switch (v.type) {
    case GgufType::F32:
    case GgufType::F64:
      return v.f;
    case GgufType::U64:
      return double(v.u);
    default:
      return double(v.i);
  }
}

bool read_value(Cursor& c, GgufType t, GgufValue& v, const std::string& key, int depth) {
  v.type = t;
  if (t != GgufType::Array) return read_scalar(c, t, v, key);
  if (depth >= kMaxArrayNesting) return c.fail("nested array in " + key);
  uint32_t et;
  uint64_t n;
  if (!c.read(et, key.c_str()) || !c.read(n, key.c_str())) return false;
  v.elem_type = GgufType(et);
  if (v.elem_type == GgufType::String) {
    if (n > c.left() / 8)
      return c.fail("array length " + std::to_string(n) + " too large in " + key);
    v.strs.resize(size_t(n));
    for (auto& s : v.strs)
      if (!c.read_string(s, key.c_str())) return false;
    return true;
  }
  size_t es = scalar_size(v.elem_type);
  if (es == 0) return c.fail("unsupported array element type " + std::to_string(et) + " in " + key);
  if (n > c.left() / es)
    return c.fail("array length " + std::to_string(n) + " too large in " + key);
  v.nums.resize(size_t(n));
  GgufValue tmp;
  tmp.type = v.elem_type;
  for (auto& x : v.nums) {
    if (!read_scalar(c, v.elem_type, tmp, key)) return false;
    x = scalar_as_double(tmp);
  }
  return true;
}

}  // namespace

bool GgufValue::is_number() const {
  return type != GgufType::String && type != GgufType::Array && scalar_size(type) != 0;
}
double GgufValue::as_double() const { return scalar_as_double(*this); }

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  auto m = MappedFile::open(path);
  if (!m) return m.error();
  auto r = parse(m->bytes(), path);
  if (!r) return r.error();
  r->file_ = std::move(*m);
  ++opened_;
  return r;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  GgufFile g;
  g.bytes_ = bytes;
  g.name_ = name;
  Cursor c{bytes, 0, name, {}};
  uint32_t magic;
  if (!c.read(magic, "magic")) return make_error(c.err);
  if (magic != kMagic) return make_error(name + ": not a GGUF file (bad magic) at offset 0");
  if (!c.read(g.version_, "version")) return make_error(c.err);
  if (g.version_ < 2 || g.version_ > 3)
    return make_error(name + ": unsupported GGUF version " + std::to_string(g.version_) +
                      " at offset 4 (kvant reads v2 and v3)");
  uint64_t n_tensors, n_kv;
  if (!c.read(n_tensors, "tensor count") || !c.read(n_kv, "metadata count"))
    return make_error(c.err);
  // Each metadata entry needs >= 12 bytes, each tensor entry >= 24.
  if (n_kv > c.left() / 12)
    return make_error(name + ": metadata count " + std::to_string(n_kv) +
                      " exceeds file size at offset 16");
  if (n_tensors > c.left() / 24)
    return make_error(name + ": tensor count " + std::to_string(n_tensors) +
                      " exceeds file size at offset 8");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    if (!c.read_string(key, "metadata key")) return make_error(c.err);
    uint32_t t;
    if (!c.read(t, key.c_str())) return make_error(c.err);
    GgufValue v;
    if (!read_value(c, GgufType(t), v, key, 0)) return make_error(c.err);
    if (g.kv_.count(key))
      return make_error(name + ": duplicate metadata key " + key + " at offset " +
                        std::to_string(c.pos));
    g.kv_.emplace(std::move(key), std::move(v));
  }

  uint64_t alignment = 32;
  if (auto a = g.find("general.alignment")) {
    if (!a->is_number() || a->i <= 0 || (a->i & (a->i - 1)) != 0)
      return make_error(name + ": general.alignment must be a power of two");
    alignment = uint64_t(a->i);
  }

  g.tensors_.resize(static_cast<size_t>(n_tensors));
  std::vector<uint64_t> rel_offsets(static_cast<size_t>(n_tensors));
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    auto& t = g.tensors_[size_t(ti)];
    const std::string entry_at = " (directory entry at offset " + std::to_string(c.pos) + ")";
    if (!c.read_string(t.name, "tensor name")) return make_error(c.err);
    uint32_t nd;
    if (!c.read(nd, t.name.c_str())) return make_error(c.err);
    if (nd == 0 || nd > kMaxDims)
      return make_error(name + ": tensor " + t.name + " has " + std::to_string(nd) +
                        " dimensions at offset " + std::to_string(c.pos));
    std::vector<uint64_t> ne(static_cast<size_t>(nd));
    uint64_t numel = 1;
    for (auto& d : ne) {
      if (!c.read(d, t.name.c_str())) return make_error(c.err);
      if (d == 0 || d > (1ull << 40) || numel > (1ull << 48) / d)
        return make_error(name + ": tensor " + t.name + " has an invalid dimension " +
                          std::to_string(d) + " at offset " + std::to_string(c.pos - 8));
      numel *= d;
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    if (!c.read(t.ggml_type, t.name.c_str())) return make_error(c.err);
    t.dtype = dtype_from_ggml(t.ggml_type);
    if (t.dtype == DType::Unknown)
      return make_error(name + ": tensor " + t.name + " has unsupported ggml type " +
                        std::to_string(t.ggml_type) + " at offset " + std::to_string(c.pos - 4));
    const auto& info = dtype_info(t.dtype);
    if (ne[0] % info.block_elems != 0)
      return make_error(name + ": tensor " + t.name + " row length " + std::to_string(ne[0]) +
                        " is not a multiple of the " + info.name + " block (" +
                        std::to_string(info.block_elems) + ")" + entry_at);
    t.nbytes = dtype_bytes(t.dtype, numel);
    if (!c.read(rel_offsets[size_t(ti)], t.name.c_str())) return make_error(c.err);
    if (rel_offsets[size_t(ti)] % alignment != 0)
      return make_error(name + ": tensor " + t.name + " data offset " +
                        std::to_string(rel_offsets[size_t(ti)]) + " is not aligned to " +
                        std::to_string(alignment) + entry_at);
    if (g.tensor_index_.count(t.name))
      return make_error(name + ": duplicate tensor " + t.name + entry_at);
    g.tensor_index_[t.name] = size_t(ti);
  }
  uint64_t data_start = (c.pos + alignment - 1) / alignment * alignment;
  for (size_t ti = 0; ti < g.tensors_.size(); ++ti) {
    auto& t = g.tensors_[ti];
    uint64_t rel = rel_offsets[ti];
    if (rel > bytes.size() || data_start > bytes.size() - rel ||
        t.nbytes > bytes.size() - data_start - rel)
      return make_error(name + ": tensor " + t.name + " data [" + std::to_string(data_start + rel) +
                        ", +" + std::to_string(t.nbytes) + ") lies beyond the end of the file (" +
                        std::to_string(bytes.size()) + " bytes); the file is truncated");
    t.offset = data_start + rel;
  }
  // Two tensors sharing bytes means a corrupt directory (writers lay tensors
  // out one after another), so it is an error, as in a safetensors header.
  std::vector<size_t> order(g.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return g.tensors_[a].offset < g.tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const auto& p = g.tensors_[order[k - 1]];
    const auto& t = g.tensors_[order[k]];
    if (t.offset < p.offset + p.nbytes)
      return make_error(name + ": tensor " + t.name + " data at offset " +
                        std::to_string(t.offset) + " overlaps tensor " + p.name + " [" +
                        std::to_string(p.offset) + ", " + std::to_string(p.offset + p.nbytes) +
                        ")");
  }
  return g;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}
const GgufTensor* GgufFile::find_tensor(const std::string& n) const {
  auto it = tensor_index_.find(n);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  auto v = find(key);
  if (!v || !v->is_string()) return std::nullopt;
  return v->s;
}
std::optional<double> GgufFile::get_number(const std::string& key) const {
  auto v = find(key);
  if (!v || !v->is_number()) return std::nullopt;
  return v->as_double();
}
std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  auto v = find(key);
  if (!v || !v->is_number()) return std::nullopt;
  switch (v->type) {
    case GgufType::U64:  // v->i is 0 for values past INT64_MAX
      if (v->u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return int64_t(v->u);
    case GgufType::F32:
    case GgufType::F64: {
      // Converting a float outside int64's range (or NaN) is undefined; such
      // a value is no integer, so it reads as absent.
      const double d = v->f;
      if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return std::nullopt;
      return int64_t(d);
    }
    default:
      return v->i;
  }
}
const std::vector<std::string>* GgufFile::get_strings(const std::string& key) const {
  auto v = find(key);
  if (!v || !v->is_array() || v->elem_type != GgufType::String) return nullptr;
  return &v->strs;
}
const std::vector<double>* GgufFile::get_numbers(const std::string& key) const {
  auto v = find(key);
  if (!v || !v->is_array() || v->elem_type == GgufType::String) return nullptr;
  return &v->nums;
}

}  // namespace kvant
