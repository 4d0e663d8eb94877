// Disaggregated prefill and decode, inside the engine: a request's prompt
// K/V computed by one engine (a prefill server, its own weights) and handed
// to another (a decode server) that generates from it, as if it had run the
// prompt itself.
//
// The prefill side (Request::handoff): the request samples its first token
// and finishes; at that step, before its pages go back, the engine copies
// the pages that hold the prompt into a KvHandoff (bytes, each page's XXH3,
// its source page and generation tag) with the layout's hash, the first
// token (and its log-probabilities) and the sampler's state, and hands it
// out with the request's final event. The copy is what travels: the source
// pages are free to be reused the moment the step ends, so no transfer can
// ever read a page that was reallocated under it.
//
// The decode side (Engine::submit_handoff): the layout hash must be its own
// pool's and every page's XXH3 must match its bytes (checked on the caller's
// thread, before anything is queued); then, on the stepping thread, the
// engine allocates pages from its own pool (waiting, in order, while the
// pool is full: back-pressure rather than failure), copies the bytes in, and
// starts the sequence at the decode of the first token. Generation tags are
// local to a pool: the source tags travel as the record of where the bytes
// came from (the chain of custody: source (page, tag) -> checksum -> this
// pool's (page, tag), whose tag the integrity pass checks from then on).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/logprobs.h"
#include "kvcache/kv_layout.h"
#include "kvcache/page_pool.h"

namespace kvant {

struct KvHandoffPage {
  uint32_t src_page = 0;
  uint32_t src_generation = 0;
  uint64_t checksum = 0;  // XXH3-64 of the page's page_bytes bytes
};

struct KvHandoff {
  uint64_t layout_hash = 0;  // kv_layout_hash of the source pool
  int64_t page_bytes = 0;
  int64_t page_tokens = 0;
  std::vector<int32_t> prompt;  // the tokens whose K/V the pages hold, in order
  int32_t first_token = -1;     // what the prefill side sampled after them
  bool has_logprobs = false;    // first_logprobs is meaningful
  StepLogprobs first_logprobs;
  uint64_t sampler_state = 0;  // the sampler's random state after the first token
  // The prefill side's MTP draft for the tokens after first_token (empty
  // without one; at most 16).
  std::vector<int32_t> mtp_draft;
  std::vector<KvHandoffPage> pages;
  std::vector<uint8_t> data;  // pages.size() * page_bytes
};

// A digest of everything that decides what a page's bytes mean: geometry,
// dtype, scale mode, block offsets and sizes, and the static FP8 scales
// (which live in the pool, not in the pages). Two pools may exchange pages
// exactly when their hashes are equal.
uint64_t kv_layout_hash(const PagePool& pool);

// The first difference between two layouts whose hashes differ, in words
// (the static scales when nothing else differs), for the refusal message.
std::string kv_layout_difference(const KvLayout& a, const KvLayout& b);

// XXH3-64 of one page's bytes.
uint64_t kv_page_checksum(const uint8_t* bytes, int64_t n);

}  // namespace kvant
