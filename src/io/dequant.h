// Dequantization of model-file storage (GGUF ggml types, safetensors dtypes)
// to FP32. Owns the per-type decoders; it does not own block layouts
// (quant_blocks.h), block geometry (dtype.h) or FP8 block scales, which are a
// safetensors convention applied by safetensors.cpp on top of these decoders.
//
// Decoders are pure functions over byte ranges: no allocation, no logging.
// The results match the GGUF reference (gguf-py / ggml) bit for bit: every
// product is formed in the same order, in FP32.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/result.h"
#include "io/dtype.h"

namespace kvant {

// True when dequantize_row can decode `t`.
bool dequant_supported(DType t);

// Decodes `n` elements (a multiple of the type's block) from `src` to `dst`.
// `src` holds dtype_bytes(t, n) bytes and need not be aligned. The caller
// guarantees both conditions and dequant_supported(t).
void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n);

// Decodes elements [begin, end) of a tensor stored contiguously in `src`, so
// callers can split a tensor between threads on block boundaries. Errors name
// `what` (file and tensor) when the type is unsupported, the range is not
// block aligned, or `src`/`dst` are too small.
Result<void> dequantize_range(DType t, std::span<const uint8_t> src, int64_t begin, int64_t end,
                              std::span<float> dst, const std::string& what);

// Whole-tensor helper: `src` must hold exactly dtype_bytes(t, dst.size()).
Result<void> dequantize(DType t, std::span<const uint8_t> src, std::span<float> dst,
                        const std::string& what);

}  // namespace kvant
