// Scheduler: decides, once per step, which sequences run and how many tokens
// each computes. It owns the waiting and running queues, each sequence's
// tokens (prompt + generated) and page table, and the page allocation a step
// needs: chunked prefill under a per-step token budget (decodes of running
// sequences first, then prefill chunks, then admissions), a cap on running
// sequences, prefix reuse on admission, LRU eviction of index-only pages, and
// preemption of the youngest running sequence (by arrival) when pages run out.
// A preempted sequence releases every page and is recomputed later from its
// prompt plus the tokens it had generated, so its output does not change.
//
// It does not run the model, sample, match stop strings or verify pages
// (kv_verifier.h does); it knows no model: queues + free pages + budgets in,
// a StepPlan out. Single-threaded, like the pool it allocates from. After
// warm-up, a decode-only step allocates nothing on the heap here (the prefix
// index may when it indexes a newly full page).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "engine/stop_matcher.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"
#include "kvcache/prefix_index.h"

namespace kvant {

using SeqId = uint64_t;

struct SchedulerOptions {
  int64_t max_step_tokens = 2048;  // token budget of one step, decodes and prefill chunks together
  int64_t max_running = 64;        // sequences holding pages and scheduled each step
};

struct SequenceRequest {
  std::vector<int32_t> prompt;  // non-empty
  int64_t max_tokens = 0;       // > 0: tokens to generate at most (then finish "length")
  // >= 0: prompt tokens the prefix index may serve at most (the rest is
  // computed, e.g. for the logits of prompt positions).
  int64_t max_prefix_hit = -1;
};

enum class SequenceStatus : uint8_t { Waiting, Running };

// One sequence as the scheduler keeps it. Invariant between steps:
// table.tokens == computed and table.pages holds exactly the pages of the
// first `computed` tokens.
struct SequenceState {
  SeqId id = 0;
  uint64_t arrival = 0;         // admission order; lower is older
  std::vector<int32_t> tokens;  // prompt, then every generated token
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  int64_t max_tokens = 0;
  int64_t max_prefix_hit = -1;
  int64_t computed = 0;       // tokens whose K/V is in the pages
  int64_t indexed_pages = 0;  // leading full pages already offered to the prefix index
  int64_t preemptions = 0;
  // Speculative decoding: the draft offered for the next step (propose()),
  // and how many draft tokens the planned step feeds after the last token
  // (they sit at the end of `tokens` until commit keeps the accepted ones).
  std::vector<int32_t> proposal;
  int64_t draft = 0;
  SequenceStatus status = SequenceStatus::Waiting;
  PageTable table;
};

enum class StepKind : uint8_t { Prefill, Decode };

// One sequence's share of a step: compute tokens [start, start + n_tokens).
struct ScheduledSequence {
  SeqId id = 0;
  StepKind kind = StepKind::Prefill;
  int64_t start = 0;
  int64_t n_tokens = 0;
  // True when the chunk reaches the sequence's last token: the model samples
  // one new token from it. False for an intermediate prefill chunk.
  bool samples = false;
  std::span<const int32_t> tokens;  // [n_tokens], the tokens to feed
  // A decode with draft tokens (speculative decoding): tokens[0] is the
  // sequence's last token and tokens[1..draft] the draft; n_tokens is
  // 1 + draft, each token computed as a decode of its own position.
  int64_t draft = 0;
  // Every page the step reads or writes for this sequence: the pages of
  // tokens [0, start + n_tokens), all current and allocated.
  std::span<const PageRef> pages;
};

// Valid until the next schedule() or commit(). An entry whose sequence was
// finished or cancelled since must not be read (its spans are gone).
struct StepPlan {
  std::vector<ScheduledSequence> sequences;  // decodes first, then prefill chunks
  std::vector<SeqId> preempted;              // sent back to waiting during this plan
  int64_t total_tokens = 0;
  bool empty() const { return sequences.empty(); }
};

struct FinishedSequence {
  SeqId id = 0;
  FinishReason reason = FinishReason::None;
};

struct SchedulerCounters {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;     // prompt tokens skipped thanks to the index
  int64_t prefix_lookup_tokens = 0;  // prompt tokens admitted with a lookup
  int64_t steps = 0;
  int64_t finished = 0;
  int64_t rejected_releases = 0;  // table entries not freed because they were stale (after a fault)
};

class Scheduler {
 public:
  // `index` may be null (no prefix caching). Both must outlive the scheduler.
  Scheduler(PagePool& pool, PrefixIndex* index, SchedulerOptions options);
  // Releases every page still held by a sequence.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Errors: empty prompt, max_tokens <= 0, a sequence that
  // could never fit in the pool, or bad options.
  Result<SeqId> add(SequenceRequest request);

  // A sequence whose prompt's K/V another engine computed (disaggregated
  // prefill, engine/kv_transfer.h): `pages` (allocated by the caller from
  // this pool, written, and now handed over) hold the first prompt.size()
  // tokens, and `first` is the token that engine sampled. It starts running,
  // its next step the decode of `first`. Errors (the pages then stay the
  // caller's): max_tokens < 2, a page count that does not cover the prompt,
  // or no room among the running sequences (max_running).
  Result<SeqId> add_prefilled(SequenceRequest request, std::vector<PageRef> pages, int32_t first);
  int64_t running_count() const { return int64_t(running_.size()); }
  // Plans the next step and allocates its pages. Must be followed by commit()
  // before the next schedule().
  const StepPlan& schedule();

  // Speculative decoding: draft tokens for a running sequence's next decode.
  // The next schedule() feeds its last token and then up to
  // max_tokens - generated - 1 of them, fewer when the step's budget is
  // short, none when their pages would need a preemption. Dropped by the
  // next schedule() whether used or not. Ignored for a sequence that is not
  // running or is still in prefill.
  void propose(SeqId id, std::span<const int32_t> draft);

  // Applies the step: `sampled[i]` is the token sampled for plan.sequences[i]
  // (ignored where samples is false; entries of sequences finished since the
  // plan are skipped). Sequences that reach max_tokens finish with "length";
  // finished() lists them until the next commit. For an entry with a draft,
  // `accepted[i]` (0..draft; 0 when `accepted` is empty) is how many of its
  // draft tokens the model agreed with: they stay, the rest are dropped with
  // their pages, and sampled[i] follows them.
  Result<void> commit(std::span<const int32_t> sampled, std::span<const int32_t> accepted = {});
  std::span<const FinishedSequence> finished() const { return finished_; }

  // Ends a sequence, waiting or running, and returns all its pages. Errors:
  // unknown id.
  Result<void> finish(SeqId id, FinishReason reason);
  Result<void> cancel(SeqId id) { return finish(id, FinishReason::Abort); }

  const SequenceState* find(SeqId id) const;
  // Fault injection only (tests, debug): a live sequence's table, to break.
  PageTable* table_for_fault_injection(SeqId id);
  SchedulerCounters counters() const;
  const SchedulerOptions& options() const { return options_; }

  // Pages held by all sequences plus the index must be exactly the pool's
  // references (PagePool::check_invariants), and each sequence's table must
  // match its computed tokens and queue.
  Result<void> check_invariants() const;
  // After a detected fault: makes the pool's reference counts and free list
  // agree with the current entries of every table and the index (pages only
  // a corrupted entry still pointed at are freed). Returns pages changed.
  int64_t repair_pool();

 private:
  void clear_plan();
  void preempt(SequenceState& s);
  void schedule_decode(SequenceState& s);
  // Takes the planned draft tokens off the end of `tokens`.
  void drop_draft(SequenceState& s);
  // Gives `s` the pages for `n` more tokens, evicting index-only pages and,
  // when `may_preempt`, preempting the youngest running sequences. False when
  // it could not (then `s` may itself have been preempted).
  bool reserve(SequenceState& s, int64_t n, bool may_preempt);
  void add_entry(SequenceState& s, int64_t n, StepKind kind);
  void insert_into_running(SequenceState* s);
  void index_full_pages(SequenceState& s);
  void release(SequenceState& s);

  PagePool& pool_;
  PrefixIndex* index_;
  SchedulerOptions options_;
  int64_t page_tokens_;
  std::unordered_map<SeqId, std::unique_ptr<SequenceState>> seqs_;
  std::vector<SequenceState*> running_;  // sorted by arrival, oldest first
  std::deque<SequenceState*> waiting_;   // preempted sequences go to the front
  StepPlan plan_;
  std::vector<FinishedSequence> finished_;
  bool plan_pending_ = false;
  int64_t budget_ = 0;  // tokens left in the step being planned
  SeqId next_id_ = 1;
  uint64_t next_arrival_ = 1;
  int64_t preemptions_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t prefix_lookup_tokens_ = 0;
  int64_t steps_ = 0;
  int64_t finished_count_ = 0;
  int64_t rejected_releases_ = 0;
  mutable std::vector<PageRef> holders_;  // scratch for check_invariants
};

}  // namespace kvant
