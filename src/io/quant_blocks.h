// GGUF (ggml) quantization blocks as packed structs, exactly as they lie in a
// .gguf file. This header owns only the byte layouts; decoding them is in
// dequant.cpp, and the block geometry table (elements/bytes per block) is in
// dtype.cpp. Multi-byte fields are little-endian, which is what every GGUF
// file and every host kvant runs on uses. Layouts: docs/FORMATS.md.
//
// Notation: "element e" is the e-th weight of the block in row order. Scales
// `d`, `m`, `dmin` are IEEE binary16 bit patterns.
#pragma once

#include <cstdint>

namespace kvant {

inline constexpr int kQkSmall = 32;  // elements per Q4_0 ... Q8_0 block
inline constexpr int kQkK = 256;     // elements per K-quant super-block

#pragma pack(push, 1)

// Q4_0, 18 bytes: element e < 16 is the low nibble of qs[e], element e >= 16
// the high nibble of qs[e-16]; value = d * (q - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1, 20 bytes: nibbles as Q4_0; value = d * q + m.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0, 22 bytes: the low four bits as Q4_0; bit e of the little-endian
// uint32 qh is bit 4 of element e; value = d * (q - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1, 24 bytes: bits as Q5_0; value = d * q + m.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q8_0, 34 bytes: value = d * qs[e].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q2_K, 84 bytes, 16 sub-blocks of 16. Element e = 128*h + 32*s + l
// (h < 2, s < 4, l < 32) is bits [2s, 2s+2) of qs[32*h + l]. Sub-block
// j = e / 16 has scale byte scales[j]: low nibble sc, high nibble mn;
// value = (d * sc) * q - (dmin * mn).
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K, 110 bytes, 16 sub-blocks of 16. The low two bits of element e are
// laid out as in Q2_K; bit (e / 32) of hmask[e % 32] set means "no offset",
// clear means subtract 4: q = low - (hbit ? 0 : 4), in [-4, 3]. The 16 6-bit
// signed scales (stored + 32): scale j's low nibble is scales[j] & 15 for
// j < 8 and scales[j-8] >> 4 for j >= 8; its top two bits are bits
// [2*(j/4), 2*(j/4)+2) of scales[8 + j%4]. value = (d * (s - 32)) * q.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K, 144 bytes, 8 sub-blocks of 32. Element e = 64*g + 32*s + l is
// nibble s of qs[32*g + l]. Sub-block j has a 6-bit scale sc and min mn in
// the 12 scale bytes: for j < 4, sc = scales[j] & 63, mn = scales[j+4] & 63;
// for j >= 4, sc = (scales[j+4] & 15) | ((scales[j-4] >> 6) << 4) and
// mn = (scales[j+4] >> 4) | ((scales[j] >> 6) << 4).
// value = (d * sc) * q - (dmin * mn).
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K, 176 bytes: as Q4_K, plus bit (e / 32) of qh[e % 32] as bit 4 of q.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K, 210 bytes, 16 sub-blocks of 16. Element e = 128*h + 32*k + l
// (h < 2, k < 4, l < 32): its low four bits are nibble (k / 2) of
// ql[64*h + 32*(k % 2) + l], its high two bits are bits [2k, 2k+2) of
// qh[32*h + l]; q = that 6-bit value - 32. value = (d * scales[e / 16]) * q.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

#pragma pack(pop)

}  // namespace kvant
