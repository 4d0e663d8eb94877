// BPE merge loop. Ordering follows HF tokenizers' Word::merge_all, so ties
// resolve identically. HF re-validates a popped candidate by looking its
// current pair up again and comparing result ids; here the candidate keeps
// the pair it was pushed for and is applied only if both symbols are still
// those ids. The two tests agree: a symbol only ever grows rightwards by
// absorbing its right neighbour, so a pair at a position that changed spells
// a longer string and cannot merge into the same token. It saves one table
// lookup (a likely cache miss) per merge.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <span>

namespace kvant {
namespace {

// Min-heap order: lower rank first, then the leftmost position.
bool later(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  if (a.rank != b.rank) return a.rank > b.rank;
  return a.pos > b.pos;
}

}  // namespace

void MergeTable::rehash(size_t capacity) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64;
  for (size_t c = capacity; c > 1; c >>= 1) --shift_;
  for (const Slot& s : old) {
    if (s.key == kEmptyKey) continue;
    size_t i = slot_of(s.key);
    while (slots_[i].key != kEmptyKey) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  if (cap > slots_.size()) rehash(cap);
}

void MergeTable::add(int32_t left, int32_t right, uint32_t rank, int32_t result) {
  if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
  const uint64_t k = key(left, right);
  size_t i = slot_of(k);
  while (slots_[i].key != kEmptyKey && slots_[i].key != k) i = (i + 1) & mask_;
  if (slots_[i].key == kEmptyKey) ++size_;
  slots_[i] = Slot{k, Merge{rank, result}};
}

namespace {

void merge_piece(std::span<const int32_t> ids, const MergeTable& merges, BpeScratch& s,
                 std::vector<int32_t>& out) {
  const int32_t n = int32_t(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  auto& sym = s.symbols;
  auto& heap = s.heap;
  sym.resize(size_t(n));
  heap.clear();
  for (int32_t i = 0; i < n; ++i)
    sym[size_t(i)] = {ids[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1, true};

  auto push = [&](int32_t pos) {
    const int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    if (const Merge* m = merges.find(sym[size_t(pos)].id, sym[size_t(nx)].id)) {
      heap.push_back({m->rank, pos, sym[size_t(pos)].id, sym[size_t(nx)].id, m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    auto& left = sym[size_t(top.pos)];
    if (!left.alive || left.next < 0 || left.id != top.left) continue;
    auto& right = sym[size_t(left.next)];
    if (right.id != top.right) continue;
    left.id = top.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

}  // namespace

void bpe_merge(const std::vector<int32_t>& ids, const MergeTable& merges, BpeScratch& s,
               std::vector<int32_t>& out) {
  const std::span<const int32_t> all(ids);
  for (size_t i = 0; i < all.size() || i == 0; i += kMaxBpeSymbols)
    merge_piece(all.subspan(i, std::min(kMaxBpeSymbols, all.size() - i)), merges, s, out);
}

}  // namespace kvant
