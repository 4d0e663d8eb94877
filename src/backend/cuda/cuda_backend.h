// The CUDA backend (KVANT_CUDA builds): the backend operations on one NVIDIA
// GPU. Activations live in memory the backend allocates (alloc: managed
// memory, preferred on the device, so that the host can still read it after
// a step); weights are uploaded at prepare time into the kernels' own
// layouts (row-major BF16, INT4 nibbles with BF16-rounded group scales, FP8
// codes with FP32 group scales). Views or pages in plain host memory (the
// op tests' buffers, a logits span) are staged through device memory for the
// one operation, so every operation accepts what the CPU backend accepts.
//
// Operations with a device kernel: embedding, the row operations, linear
// products (BF16, INT4, FP8), RoPE, KV store/gather (BF16 and FP8 pages,
// dynamic or static scales), paged decode attention and prefill attention
// (head_dim <= 256). The rest (MoE routing/permutation/combination, MLA
// expansion, the DSA selection, and attention over wider heads) run on the
// CPU backend over the same memory after the device has finished: correct,
// not fast.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace kvant::backend {

// Number of CUDA devices this process sees (0 without a driver or GPU).
int cuda_device_count();
// The backend on device 0; nullptr with a message in *why when none can run.
std::unique_ptr<Backend> make_cuda_backend(std::string* why = nullptr);

}  // namespace kvant::backend
