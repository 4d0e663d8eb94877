// Scheduler (see scheduler.h).
//
// Ordering within a step: decodes of running sequences (oldest first), then
// prefill chunks of running sequences, then admissions from the waiting queue.
// When a sequence needs pages the pool lacks, index-only prefix pages go first
// (LRU), then the youngest running sequence; if that is the sequence asking,
// it preempts itself. A step that preempted anyone admits no one, so a
// sequence is never sent back and re-admitted within one plan.
#include "engine/scheduler.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace kvant {

Scheduler::Scheduler(PagePool& pool, PrefixIndex* index, SchedulerOptions options)
    : pool_(pool), index_(index), options_(options), page_tokens_(pool.geometry().page_tokens) {
  KV_CHECK_GT(options_.max_step_tokens, int64_t(0));
  KV_CHECK_GT(options_.max_running, int64_t(0));
  running_.reserve(size_t(options_.max_running));
  plan_.sequences.reserve(size_t(options_.max_running));
  plan_.preempted.reserve(size_t(options_.max_running));
  finished_.reserve(size_t(options_.max_running));
}

Scheduler::~Scheduler() {
  for (auto& [id, s] : seqs_) release(*s);
}

Result<SeqId> Scheduler::add(SequenceRequest request) {
  if (request.prompt.empty()) return make_error("scheduler: empty prompt");
  if (request.max_tokens <= 0)
    return make_error("scheduler: max_tokens must be > 0, got " +
                      std::to_string(request.max_tokens));
  const int64_t total = int64_t(request.prompt.size()) + request.max_tokens;
  const int64_t pages = kv_pages_for_tokens(total, page_tokens_);
  if (pages > pool_.num_pages())
    return make_error("scheduler: prompt (" + std::to_string(request.prompt.size()) +
                      " tokens) + max_tokens (" + std::to_string(request.max_tokens) + ") needs " +
                      std::to_string(pages) + " pages, the pool has " +
                      std::to_string(pool_.num_pages()));
  auto s = std::make_unique<SequenceState>();
  s->id = next_id_++;
  s->arrival = next_arrival_++;
  s->prompt_tokens = int64_t(request.prompt.size());
  s->max_tokens = request.max_tokens;
  s->max_prefix_hit = request.max_prefix_hit;
  s->tokens = std::move(request.prompt);
  // Reserved up front so that decode steps never reallocate, and spans in a
  // plan stay valid until commit.
  s->tokens.reserve(size_t(total));
  s->table.pages.reserve(size_t(pages));
  const SeqId id = s->id;
  waiting_.push_back(s.get());
  seqs_.emplace(id, std::move(s));
  return id;
}

Result<SeqId> Scheduler::add_prefilled(SequenceRequest request, std::vector<PageRef> pages,
                                       int32_t first) {
  const int64_t n = int64_t(request.prompt.size());
  if (n == 0) return make_error("scheduler: empty prompt");
  if (request.max_tokens < 2)
    return make_error("scheduler: a prefilled sequence generates 2 tokens or more, got max_tokens " +
                      std::to_string(request.max_tokens));
  if (int64_t(pages.size()) != kv_pages_for_tokens(n, page_tokens_))
    return make_error("scheduler: " + std::to_string(pages.size()) + " pages for a prompt of " +
                      std::to_string(n) + " tokens (pages of " + std::to_string(page_tokens_) + ")");
  if (int64_t(running_.size()) >= options_.max_running)
    return make_error("scheduler: " + std::to_string(running_.size()) +
                      " sequences are running, the limit");
  const int64_t total = n + request.max_tokens;
  auto s = std::make_unique<SequenceState>();
  s->id = next_id_++;
  s->arrival = next_arrival_++;
  s->prompt_tokens = n;
  s->max_tokens = request.max_tokens;
  s->max_prefix_hit = request.max_prefix_hit;
  s->tokens = std::move(request.prompt);
  s->tokens.reserve(size_t(total));
  s->tokens.push_back(first);
  s->generated = 1;
  s->computed = n;
  s->status = SequenceStatus::Running;
  s->table.pages = std::move(pages);
  s->table.pages.reserve(size_t(kv_pages_for_tokens(total, page_tokens_)));
  s->table.tokens = n;
  const SeqId id = s->id;
  insert_into_running(s.get());
  seqs_.emplace(id, std::move(s));
  return id;
}

void Scheduler::clear_plan() {
  plan_.sequences.clear();
  plan_.preempted.clear();
  plan_.total_tokens = 0;
}

void Scheduler::release(SequenceState& s) {
  // Rejected entries (stale or free pages) only happen after a fault that the
  // integrity pass reports; they are another holder's to free, not ours.
  const ReleaseCounts c = page_table_release(pool_, s.table);
  rejected_releases_ += c.rejected;
  s.computed = 0;
  s.indexed_pages = 0;
}

void Scheduler::insert_into_running(SequenceState* s) {
  auto it = std::upper_bound(
      running_.begin(), running_.end(), s,
      [](const SequenceState* a, const SequenceState* b) { return a->arrival < b->arrival; });
  running_.insert(it, s);
}

void Scheduler::preempt(SequenceState& s) {
  KV_CHECK(s.status == SequenceStatus::Running);
  // Drop its entry if it was already planned this step; its budget comes back.
  for (auto it = plan_.sequences.begin(); it != plan_.sequences.end(); ++it)
    if (it->id == s.id) {
      budget_ += it->n_tokens;
      plan_.total_tokens -= it->n_tokens;
      plan_.sequences.erase(it);
      break;
    }
  drop_draft(s);
  release(s);
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  s.status = SequenceStatus::Waiting;
  waiting_.push_front(&s);
  ++s.preemptions;
  ++preemptions_;
  plan_.preempted.push_back(s.id);
}

void Scheduler::drop_draft(SequenceState& s) {
  s.tokens.resize(s.tokens.size() - size_t(s.draft));
  s.draft = 0;
}

void Scheduler::propose(SeqId id, std::span<const int32_t> draft) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  SequenceState& s = *it->second;
  if (s.status != SequenceStatus::Running || int64_t(s.tokens.size()) - s.computed != 1) return;
  s.proposal.assign(draft.begin(), draft.end());
}

// A running sequence's decode, with as much of its proposed draft as the
// budget, its max_tokens and the free pages allow (a draft never preempts).
void Scheduler::schedule_decode(SequenceState& s) {
  int64_t k = std::min<int64_t>(int64_t(s.proposal.size()), budget_ - 1);
  k = std::min(k, s.max_tokens - s.generated - 1);
  if (k > 0) {
    s.tokens.insert(s.tokens.end(), s.proposal.begin(), s.proposal.begin() + k);
    s.draft = k;
    if (reserve(s, 1 + k, false)) {
      add_entry(s, 1 + k, StepKind::Decode);
      return;
    }
    drop_draft(s);
  }
  if (reserve(s, 1, true)) add_entry(s, 1, StepKind::Decode);
}

bool Scheduler::reserve(SequenceState& s, int64_t n, bool may_preempt) {
  const int64_t need = page_table_pages_needed(s.table, n, page_tokens_);
  while (need > pool_.free_pages()) {
    if (index_ != nullptr && index_->evict_for(need - pool_.free_pages()) > 0) continue;
    if (!may_preempt || running_.empty()) return false;
    SequenceState* victim = running_.back();
    preempt(*victim);
    if (victim == &s) return false;
  }
  KV_CHECK(page_table_grow(pool_, s.table, n));
  return true;
}

void Scheduler::add_entry(SequenceState& s, int64_t n, StepKind kind) {
  ScheduledSequence e;
  e.id = s.id;
  e.kind = kind;
  e.start = s.computed;
  e.n_tokens = n;
  e.samples = s.computed + n == int64_t(s.tokens.size());
  e.tokens = std::span<const int32_t>(s.tokens).subspan(size_t(s.computed), size_t(n));
  e.draft = s.draft;
  e.pages = std::span<const PageRef>(s.table.pages)
                .first(size_t(kv_pages_for_tokens(s.computed + n, page_tokens_)));
  plan_.sequences.push_back(e);
  plan_.total_tokens += n;
  budget_ -= n;
}

const StepPlan& Scheduler::schedule() {
  KV_CHECK(!plan_pending_);
  clear_plan();
  plan_pending_ = true;
  ++steps_;
  budget_ = options_.max_step_tokens;

  // Decodes first. Indexing, not iterators: preemption shrinks running_ from
  // the back, and a sequence that preempts itself is the last one.
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    SequenceState& s = *running_[i];
    if (int64_t(s.tokens.size()) - s.computed != 1) continue;
    schedule_decode(s);
  }
  for (SequenceState* s : running_) s->proposal.clear();
  for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
    SequenceState& s = *running_[i];
    const int64_t remaining = int64_t(s.tokens.size()) - s.computed;
    if (remaining <= 1 || s.draft > 0) continue;
    const int64_t n = std::min(remaining, budget_);
    if (reserve(s, n, true)) add_entry(s, n, StepKind::Prefill);
  }
  if (!plan_.preempted.empty()) return plan_;

  while (!waiting_.empty() && budget_ > 0 && int64_t(running_.size()) < options_.max_running) {
    SequenceState& s = *waiting_.front();
    KV_CHECK(s.table.pages.empty());
    int64_t hit_tokens = 0;
    if (index_ != nullptr) {
      // Full pages only, and never the last token: its logits are needed.
      size_t len = s.tokens.size() - 1;
      if (s.max_prefix_hit >= 0) len = std::min(len, size_t(s.max_prefix_hit));
      auto prefix = std::span<const int32_t>(s.tokens).first(len);
      hit_tokens = index_->lookup(prefix, s.table.pages) * page_tokens_;
      s.computed = hit_tokens;
      s.table.tokens = hit_tokens;
      s.indexed_pages = int64_t(s.table.pages.size());
    }
    const int64_t remaining = int64_t(s.tokens.size()) - s.computed;
    const int64_t n = std::min(remaining, budget_);
    if (!reserve(s, n, false)) {
      release(s);  // the prefix hits go back; the next try looks up again
      break;
    }
    waiting_.pop_front();
    s.status = SequenceStatus::Running;
    insert_into_running(&s);
    if (index_ != nullptr) {
      prefix_hit_tokens_ += hit_tokens;
      prefix_lookup_tokens_ += int64_t(s.tokens.size()) - 1;
    }
    add_entry(s, n, StepKind::Prefill);
  }
  return plan_;
}

void Scheduler::index_full_pages(SequenceState& s) {
  if (index_ == nullptr) return;
  const int64_t full = s.computed / page_tokens_;
  if (full <= s.indexed_pages) return;
  index_->insert(std::span<const int32_t>(s.tokens).first(size_t(full * page_tokens_)),
                 std::span<const PageRef>(s.table.pages).first(size_t(full)));
  s.indexed_pages = full;
}

Result<void> Scheduler::commit(std::span<const int32_t> sampled,
                               std::span<const int32_t> accepted) {
  if (!plan_pending_) return make_error("scheduler: commit without a scheduled step");
  if (sampled.size() != plan_.sequences.size())
    return make_error("scheduler: commit got " + std::to_string(sampled.size()) +
                      " tokens for a plan of " + std::to_string(plan_.sequences.size()) +
                      " sequences");
  if (!accepted.empty() && accepted.size() != sampled.size())
    return make_error("scheduler: commit got " + std::to_string(accepted.size()) +
                      " accepted-draft counts for a plan of " +
                      std::to_string(plan_.sequences.size()) + " sequences");
  plan_pending_ = false;
  finished_.clear();
  for (size_t i = 0; i < plan_.sequences.size(); ++i) {
    const ScheduledSequence& e = plan_.sequences[i];
    auto it = seqs_.find(e.id);
    if (it == seqs_.end()) continue;  // finished or cancelled since the plan
    SequenceState& s = *it->second;
    KV_CHECK(s.status == SequenceStatus::Running);
    KV_CHECK_EQ(s.computed, e.start);
    if (e.draft > 0) {
      // The last token and the accepted draft tokens are computed; the
      // rejected ones leave `tokens` and their pages go back.
      const int64_t a = accepted.empty() ? 0 : std::clamp<int64_t>(accepted[i], 0, e.draft);
      s.computed = e.start + 1 + a;
      s.tokens.resize(size_t(s.computed));
      page_table_truncate(pool_, s.table, s.computed);
      s.generated += a;
      s.draft = 0;
    } else {
      s.computed += e.n_tokens;
    }
    KV_CHECK_EQ(s.computed, s.table.tokens);
    index_full_pages(s);
    if (!e.samples) continue;
    s.tokens.push_back(sampled[i]);
    ++s.generated;
    if (s.generated >= s.max_tokens) finished_.push_back({s.id, FinishReason::Length});
  }
  for (const FinishedSequence& f : finished_) {
    auto r = finish(f.id, f.reason);
    KV_CHECK(r.ok());
  }
  clear_plan();
  return {};
}

Result<void> Scheduler::finish(SeqId id, FinishReason reason) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return make_error("scheduler: no sequence with id " + std::to_string(id));
  SequenceState& s = *it->second;
  if (s.status == SequenceStatus::Running) {
    // A pending plan keeps its entry (commit skips ids that are gone), so the
    // engine's results stay aligned with the plan it was given.
    running_.erase(std::find(running_.begin(), running_.end(), &s));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  }
  (void)reason;  // the engine reports the reason; every reason frees the same way
  release(s);
  seqs_.erase(it);
  ++finished_count_;
  return {};
}

PageTable* Scheduler::table_for_fault_injection(SeqId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second->table;
}

const SequenceState* Scheduler::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

SchedulerCounters Scheduler::counters() const {
  SchedulerCounters c;
  c.running = int64_t(running_.size());
  c.waiting = int64_t(waiting_.size());
  c.preemptions = preemptions_;
  c.prefix_hit_tokens = prefix_hit_tokens_;
  c.prefix_lookup_tokens = prefix_lookup_tokens_;
  c.steps = steps_;
  c.finished = finished_count_;
  c.rejected_releases = rejected_releases_;
  return c;
}

int64_t Scheduler::repair_pool() {
  holders_.clear();
  for (const auto& [id, s] : seqs_) {
    for (const PageRef& r : s->table.pages)
      if (pool_.is_current(r)) holders_.push_back(r);
  }
  if (index_ != nullptr) {
    index_->drop_stale();
    index_->collect_refs(holders_);
  }
  return pool_.repair(holders_);
}

Result<void> Scheduler::check_invariants() const {
  if (running_.size() + waiting_.size() != seqs_.size())
    return make_error("scheduler: " + std::to_string(running_.size()) + " running + " +
                      std::to_string(waiting_.size()) +
                      " waiting != " + std::to_string(seqs_.size()) + " sequences");
  if (int64_t(running_.size()) > options_.max_running)
    return make_error("scheduler: " + std::to_string(running_.size()) + " running > max_running " +
                      std::to_string(options_.max_running));
  for (size_t i = 1; i < running_.size(); ++i)
    if (running_[i - 1]->arrival >= running_[i]->arrival)
      return make_error("scheduler: running queue out of arrival order");
  for (const SequenceState* s : waiting_)
    if (s->status != SequenceStatus::Waiting || !s->table.pages.empty())
      return make_error("scheduler: waiting sequence " + std::to_string(s->id) +
                        " holds pages or is not waiting");
  holders_.clear();
  for (const SequenceState* s : running_) {
    if (s->status != SequenceStatus::Running)
      return make_error("scheduler: sequence " + std::to_string(s->id) +
                        " is in the running queue but not running");
    // While a plan is pending, tables already cover the planned tokens.
    if (!plan_pending_ && s->table.tokens != s->computed)
      return make_error("scheduler: sequence " + std::to_string(s->id) + " table holds " +
                        std::to_string(s->table.tokens) + " tokens, computed " +
                        std::to_string(s->computed));
    if (int64_t(s->table.pages.size()) != kv_pages_for_tokens(s->table.tokens, page_tokens_))
      return make_error("scheduler: sequence " + std::to_string(s->id) + " holds " +
                        std::to_string(s->table.pages.size()) + " pages for " +
                        std::to_string(s->table.tokens) + " tokens");
    if (s->computed > int64_t(s->tokens.size()))
      return make_error("scheduler: sequence " + std::to_string(s->id) +
                        " computed past its tokens");
    holders_.insert(holders_.end(), s->table.pages.begin(), s->table.pages.end());
  }
  if (index_ != nullptr) index_->collect_refs(holders_);
  return pool_.check_invariants(holders_);
}

}  // namespace kvant
