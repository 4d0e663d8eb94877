// Layout: magic, version 3, tensor count 0, kv count, then each key (u64
// length + bytes), its u32 type and value; arrays are element type, u64
// count, elements. Numeric array elements come back from GgufValue as
// doubles and are narrowed to their recorded element type.
#include "io/gguf_writer.h"

#include <cstring>
#include <fstream>

namespace kvant {
namespace {

struct Out {
  std::string b;
  template <class T>
  void put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put(uint64_t(s.size()));
    b += s;
  }
};

bool put_scalar(Out& o, GgufType t, double num, const GgufValue* v) {
  // `v` gives exact integers for scalars; arrays pass only `num`.
  const int64_t i = v ? v->i : int64_t(num);
  const uint64_t u = v ? v->u : uint64_t(num);
  const double f = v ? v->f : num;
  switch (t) {
    case GgufType::U8: o.put(uint8_t(v ? (v->u ? v->u : uint64_t(i)) : u)); return true;
    case GgufType::I8: o.put(int8_t(i)); return true;
    case GgufType::U16: o.put(uint16_t(v ? (v->u ? v->u : uint64_t(i)) : u)); return true;
    case GgufType::I16: o.put(int16_t(i)); return true;
    case GgufType::U32: o.put(uint32_t(v ? (v->u ? v->u : uint64_t(i)) : u)); return true;
    case GgufType::I32: o.put(int32_t(i)); return true;
    case GgufType::U64: o.put(uint64_t(v ? (v->u ? v->u : uint64_t(i)) : u)); return true;
    case GgufType::I64: o.put(int64_t(i)); return true;
    case GgufType::F32: o.put(float(f)); return true;
    case GgufType::F64: o.put(double(f)); return true;
    case GgufType::Bool: o.put(uint8_t(v ? v->b : num != 0)); return true;
    default: return false;
  }
}

}  // namespace

Result<void> write_gguf_metadata(const std::string& path,
                                 const std::vector<std::pair<std::string, GgufValue>>& kv) {
  Out o;
  o.put(uint32_t(0x46554747));  // "GGUF"
  o.put(uint32_t(3));
  o.put(uint64_t(0));           // tensors
  o.put(uint64_t(kv.size()));
  for (const auto& [key, v] : kv) {
    o.str(key);
    o.put(uint32_t(v.type));
    if (v.type == GgufType::String) {
      o.str(v.s);
    } else if (v.type == GgufType::Array) {
      o.put(uint32_t(v.elem_type));
      if (v.elem_type == GgufType::String) {
        o.put(uint64_t(v.strs.size()));
        for (const auto& s : v.strs) o.str(s);
      } else {
        o.put(uint64_t(v.nums.size()));
        for (double x : v.nums)
          if (!put_scalar(o, v.elem_type, x, nullptr))
            return make_error(path + ": metadata " + key + " has an array element type kvant cannot write");
      }
    } else if (!put_scalar(o, v.type, 0, &v)) {
      return make_error(path + ": metadata " + key + " has a type kvant cannot write");
    }
  }
  std::ofstream f(path, std::ios::binary);
  f.write(o.b.data(), std::streamsize(o.b.size()));
  f.close();
  if (!f) return make_error(path + ": write failed");
  return {};
}

}  // namespace kvant
