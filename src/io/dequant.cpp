// Scalar decoders for every storage type kvant reads. Each block is copied
// into its packed struct with memcpy first: model bytes come from an mmap at
// arbitrary offsets (safetensors headers have any length), and a copy keeps
// the loads aligned and free of aliasing questions at negligible cost.
// Products are formed exactly as the GGUF reference forms them (the scale
// times the sub-block scale first, then times q, then minus the min term), and
// the baseline ISA has no FMA to contract them, so results are bit-exact.
#include "io/dequant.h"

#include <cstring>
#include <limits>

#include "io/quant_blocks.h"
#include "numerics/bf16.h"
#include "numerics/fp16.h"
#include "numerics/fp8.h"

namespace kvant {
namespace {

template <class Block>
Block load_block(const uint8_t* src, int64_t i) {
  Block b;
  std::memcpy(&b, src + i * int64_t(sizeof(Block)), sizeof(Block));
  return b;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void dequant_q4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkSmall) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int l = 0; l < 16; ++l) {
      y[l] = d * float(int(b.qs[l] & 15) - 8);
      y[l + 16] = d * float(int(b.qs[l] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkSmall) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
    for (int l = 0; l < 16; ++l) {
      y[l] = d * float(b.qs[l] & 15) + m;
      y[l + 16] = d * float(b.qs[l] >> 4) + m;
    }
  }
}

void dequant_q5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkSmall) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = fp16_to_f32(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int l = 0; l < 16; ++l) {
      const int lo = int(b.qs[l] & 15) | int(((qh >> l) & 1) << 4);
      const int hi = int(b.qs[l] >> 4) | int(((qh >> (l + 16)) & 1) << 4);
      y[l] = d * float(lo - 16);
      y[l + 16] = d * float(hi - 16);
    }
  }
}

void dequant_q5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkSmall) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int l = 0; l < 16; ++l) {
      const int lo = int(b.qs[l] & 15) | int(((qh >> l) & 1) << 4);
      const int hi = int(b.qs[l] >> 4) | int(((qh >> (l + 16)) & 1) << 4);
      y[l] = d * float(lo) + m;
      y[l + 16] = d * float(hi) + m;
    }
  }
}

void dequant_q8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkSmall) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int l = 0; l < 32; ++l) y[l] = float(b.qs[l]) * d;
  }
}

void dequant_q2_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int e = 0; e < kQkK; e += 16) {
      const uint8_t sc = b.scales[e / 16];
      const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
      const int h = e / 128, s = (e % 128) / 32, l0 = e % 32;
      for (int l = 0; l < 16; ++l) {
        const int q = (b.qs[32 * h + l0 + l] >> (2 * s)) & 3;
        y[e + l] = dl * float(q) - ml;
      }
    }
  }
}

void dequant_q3_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
      const int lo = j < 8 ? (b.scales[j] & 15) : (b.scales[j - 8] >> 4);
      const int hi = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = d * float((lo | (hi << 4)) - 32);
      const int e0 = 16 * j, h = e0 / 128, s = (e0 % 128) / 32, l0 = e0 % 32;
      const int hbit = e0 / 32;
      for (int l = 0; l < 16; ++l) {
        const int low = (b.qs[32 * h + l0 + l] >> (2 * s)) & 3;
        const int off = ((b.hmask[l0 + l] >> hbit) & 1) ? 0 : 4;
        y[e0 + l] = dl * float(low - off);
      }
    }
  }
}

// The 6-bit (scale, min) pair of sub-block j shared by Q4_K and Q5_K.
void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequant_q4_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k_scale_min(b.scales, j, sc, mn);
      const float dl = d * float(sc), ml = dmin * float(mn);
      const uint8_t* q = b.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * float((q[l] >> shift) & 15) - ml;
    }
  }
}

void dequant_q5_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      k_scale_min(b.scales, j, sc, mn);
      const float dl = d * float(sc), ml = dmin * float(mn);
      const uint8_t* q = b.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 15) | (((b.qh[l] >> j) & 1) << 4);
        y[32 * j + l] = dl * float(v) - ml;
      }
    }
  }
}

void dequant_q6_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQkK) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = fp16_to_f32(b.d);
    for (int e0 = 0; e0 < kQkK; e0 += 16) {
      const float dl = d * float(b.scales[e0 / 16]);
      const int h = e0 / 128, k = (e0 % 128) / 32, l0 = e0 % 32;
      const uint8_t* ql = b.ql + 64 * h + 32 * (k % 2) + l0;
      const uint8_t* qh = b.qh + 32 * h + l0;
      const int lshift = 4 * (k / 2), hshift = 2 * k;
      for (int l = 0; l < 16; ++l) {
        const int v = ((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4);
        y[e0 + l] = dl * float(v - 32);
      }
    }
  }
}

using BlockDecoder = void (*)(const uint8_t* src, float* y, int64_t n_blocks);

BlockDecoder block_decoder(DType t) {
  // clang-format off
  switch (t) {
    case DType::Q4_0: return dequant_q4_0;
    case DType::Q4_1: return dequant_q4_1;
    case DType::Q5_0: return dequant_q5_0;
    case DType::Q5_1: return dequant_q5_1;
    case DType::Q8_0: return dequant_q8_0;
    case DType::Q2_K: return dequant_q2_k;
    case DType::Q3_K: return dequant_q3_k;
    case DType::Q4_K: return dequant_q4_k;
    case DType::Q5_K: return dequant_q5_k;
    case DType::Q6_K: return dequant_q6_k;
    default: return nullptr;
  }
  // clang-format on
}

}  // namespace

bool dequant_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8_E4M3:
      return true;
    default:
      return block_decoder(t) != nullptr;
  }
}

void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::F8_E4M3: {
      const float* table = fp8_e4m3_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
      return;
    }
    default:
      // Callers check dequant_supported first; an unsupported type writes nothing.
      if (BlockDecoder f = block_decoder(t)) f(src, dst, n / int64_t(dtype_info(t).block_elems));
  }
}

Result<void> dequantize_range(DType t, std::span<const uint8_t> src, int64_t begin, int64_t end,
                              std::span<float> dst, const std::string& what) {
  if (!dequant_supported(t))
    return make_error(what + ": no FP32 conversion for dtype " + dtype_name(t));
  const auto& info = dtype_info(t);
  const int64_t be = info.block_elems;
  if (begin < 0 || end < begin || begin % be != 0 || end % be != 0)
    return make_error(what + ": element range [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") is not aligned to the " + info.name + " block of " +
                      std::to_string(be));
  const uint64_t first_byte = uint64_t(begin / be) * info.block_bytes;
  const uint64_t nbytes = uint64_t((end - begin) / be) * info.block_bytes;
  if (first_byte > src.size() || nbytes > src.size() - first_byte)
    return make_error(what + ": element range [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") needs bytes up to " +
                      std::to_string(first_byte + nbytes) + " but the tensor has " +
                      std::to_string(src.size()));
  if (uint64_t(end - begin) > dst.size())
    return make_error(what + ": output holds " + std::to_string(dst.size()) + " values, " +
                      std::to_string(end - begin) + " needed");
  dequantize_row(t, src.data() + first_byte, dst.data(), end - begin);
  return {};
}

Result<void> dequantize(DType t, std::span<const uint8_t> src, std::span<float> dst,
                        const std::string& what) {
  if (!dequant_supported(t))
    return make_error(what + ": no FP32 conversion for dtype " + dtype_name(t));
  const size_t need = dtype_bytes(t, dst.size());
  if (need == std::numeric_limits<size_t>::max())
    return make_error(what + ": " + std::to_string(dst.size()) +
                      " values are not a whole number of " + dtype_name(t) + " blocks");
  if (need != src.size())
    return make_error(what + ": " + std::to_string(dst.size()) + " " + dtype_name(t) +
                      " values need " + std::to_string(need) + " bytes, the tensor has " +
                      std::to_string(src.size()));
  dequantize_row(t, src.data(), dst.data(), int64_t(dst.size()));
  return {};
}

}  // namespace kvant
