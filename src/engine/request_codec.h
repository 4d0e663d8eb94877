// StepInputs and their byte encoding: what rank 0's Engine accepted in one
// step (new requests, cancellations, shutdown), sent to the other tensor-
// parallel ranks so that each replays the same inputs and its scheduler
// makes the same decisions. A Request travels whole except its on_event
// callback, which stays on the rank that took the request from its client.
//
// Version 3, little-endian throughout:
//   message: "KVSI", u8 version, u64 seq,
//            u32 n, n x (u64 id, request), u32 n, n x u64 cancelled id,
//            u8 shutdown
//   request: u32 n, n x i32 prompt,
//            sampling: f32 temperature, i32 top_k, f32 top_p, f32 min_p,
//              f32 repetition_penalty, f32 presence_penalty,
//              f32 frequency_penalty, u64 seed, i32 top_logprobs,
//              u32 n, n x (i32 token, f32 bias) logit_bias,
//            stop: u32 n, n x (u32 len, len bytes) stop strings,
//              u32 n, n x i32 stop_token_ids, u8 ignore_eos, i32 max_tokens,
//              u8 skip_special_tokens,
//            u8 logprobs, i32 prompt_logprobs, i64 prompt_logprobs_from,
//            u8 prompt_only
// Floats travel as their IEEE-754 bits, so they come back bit for bit
// (negative zero, subnormals, NaN payloads); bools as 0 or 1.
//
// The codec checks the format only: whether the values are in range is
// Engine::submit's to say, on every rank alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"
#include "engine/engine.h"

namespace kvant {

// One step's engine inputs, in the order rank 0 accepted them.
struct StepInputs {
  uint64_t seq = 0;                                      // rank 0's step number
  std::vector<std::pair<RequestId, Request>> submitted;  // on_event is not carried
  std::vector<RequestId> cancelled;
  bool shutdown = false;
};

inline constexpr char kStepInputsMagic[4] = {'K', 'V', 'S', 'I'};
inline constexpr uint8_t kStepInputsVersion = 4;  // 2: Request::handoff; 3: logit_bias; 4: speculative method

std::vector<std::byte> encode_step_inputs(const StepInputs& inputs);
// Errors name what was wrong and the byte offset where it was found: a
// message shorter than its header, another magic or version, a read past
// the end, a count larger than the bytes left could hold, a bool other
// than 0 or 1, bytes left over after the message.
Result<StepInputs> decode_step_inputs(std::span<const std::byte> bytes);

}  // namespace kvant
