// FP8 block quantization of weights (fp8_block.h).
#include "numerics/fp8_block.h"

#include <algorithm>
#include <cmath>

#include "numerics/fp8.h"

namespace kvant {

void fp8_block_quantize(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* codes,
                        float* scales) {
  const int64_t br = (rows + block - 1) / block, bc = (cols + block - 1) / block;
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r1 = std::min(rows, (i + 1) * block), c1 = std::min(cols, (j + 1) * block);
      float amax = 0.f;
      for (int64_t r = i * block; r < r1; ++r)
        for (int64_t c = j * block; c < c1; ++c) {
          const float a = std::fabs(w[r * cols + c]);
          if (std::isfinite(a)) amax = std::max(amax, a);
        }
      const float s = amax > 0.f ? amax / kFp8E4m3Max : 1.f;
      scales[i * bc + j] = s;
      for (int64_t r = i * block; r < r1; ++r)
        for (int64_t c = j * block; c < c1; ++c) codes[r * cols + c] = f32_to_fp8_e4m3(w[r * cols + c] / s);
    }
}

}  // namespace kvant
