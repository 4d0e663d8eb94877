// The BPE merge step shared by byte-level and SentencePiece-style
// vocabularies: a pair -> (rank, result) table and the merge loop over one
// word. The loop is Hugging Face's: a min-heap of candidate pairs ordered by
// rank, then by position (leftmost first), re-validated when popped, so a word
// of n symbols costs O(n log n). It does not know how words are cut or how
// their first symbols are found (tokenizer.cpp does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvant {

struct Merge {
  uint32_t rank = 0;    // lower merges first
  int32_t result = -1;  // token id of the merged pair
};

class MergeTable {
 public:
  // A pair listed twice keeps its last listing, as HF's merges map does.
  void add(int32_t left, int32_t right, uint32_t rank, int32_t result);
  const Merge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.merge;
      if (s.key == kEmptyKey) return nullptr;
    }
  }
  size_t size() const { return size_; }
  void reserve(size_t n);

 private:
  // Open addressing with linear probing: this lookup is the inner loop of
  // encoding, and a node-based map spends most of it on cache misses.
  static constexpr uint64_t kEmptyKey = ~uint64_t(0);  // ids are never both -1
  struct Slot {
    uint64_t key = kEmptyKey;
    Merge merge;
  };
  static uint64_t key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t slot_of(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  void rehash(size_t capacity);

  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  unsigned shift_ = 64;
};

// Reusable buffers for bpe_merge, so encoding a long text allocates once.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t left, right;  // the pair as it was when pushed
    int32_t result;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Merges `ids` (the word's initial symbols) in place and appends the final
// ids to `out`. A word of more than kMaxBpeSymbols symbols (no natural text
// has one; a run of 32 MiB of letters is one) is merged in consecutive
// pieces of that many, so scratch memory and time stay bounded whatever the
// input; only such words can tokenize differently from an unbounded merge,
// and only next to the cuts.
inline constexpr size_t kMaxBpeSymbols = size_t(1) << 16;
void bpe_merge(const std::vector<int32_t>& ids, const MergeTable& merges, BpeScratch& scratch,
               std::vector<int32_t>& out);

}  // namespace kvant
