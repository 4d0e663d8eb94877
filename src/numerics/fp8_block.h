// FP8 e4m3 weights with block scales, as DeepSeek-V3-style checkpoints store
// them: each block x block tile of a [rows, cols] weight has one FP32 scale,
// amax(tile) / 448, and codes e4m3(w / scale) (round to nearest even,
// saturating). The rule kvant uses to quantize BF16 weights to FP8 at load
// and when writing an FP8 checkpoint; reading a checkpoint takes its own
// codes and scales as they are.
#pragma once

#include <cstdint>

namespace kvant {

inline constexpr int64_t kFp8WeightBlock = 128;

// codes [rows, cols]; scales [ceil(rows / block), ceil(cols / block)]. A tile
// with no finite non-zero value gets scale 1 (its codes are then zeros, or
// NaN codes for NaN inputs).
void fp8_block_quantize(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* codes,
                        float* scales);

}  // namespace kvant
