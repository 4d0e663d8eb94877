#include "eval/tasks.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace kvant::eval {
namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\n' || s[a] == '\t' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\n' || s[b - 1] == '\t' || s[b - 1] == '\r'))
    --b;
  return s.substr(a, b - a);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_numlike(char c) { return is_digit(c) || c == '.' || c == ','; }
bool is_flexlike(char c) { return is_numlike(c) || c == '$'; }

uint64_t hash_id(uint64_t seed, const std::string& id) {
  uint64_t h = mix64(seed ^ 0x9e3779b97f4a7c15ull);
  for (unsigned char c : id) h = mix64(h ^ c);
  return h;
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string arc_query(const McItem& it) { return "Question: " + it.question + "\nAnswer:"; }

std::string arc_fewshot_prefix(const std::vector<McItem>& shots) {
  std::string p;
  for (const auto& s : shots) p += arc_query(s) + " " + s.choices[size_t(s.answer)] + "\n\n";
  return p;
}

std::vector<LoglikRequest> arc_requests(const std::string& prefix, const McItem& it) {
  std::vector<LoglikRequest> r;
  for (const auto& c : it.choices) r.push_back({prefix + arc_query(it), " " + c});
  return r;
}

std::string mmlu_subject_title(const std::string& subject) {
  std::string s = subject;
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

std::string mmlu_query(const McItem& it) {
  std::string q = trim(it.question);
  for (size_t i = 0; i < it.choices.size(); ++i) q += "\n" + it.labels[i] + ". " + it.choices[i];
  return q + "\nAnswer:";
}

std::string mmlu_prefix(const std::string& subject, const std::vector<McItem>& shots) {
  std::string p = "The following are multiple choice questions (with answers) about " +
                  mmlu_subject_title(subject) + ".\n\n";
  for (const auto& s : shots) p += mmlu_query(s) + " " + s.labels[size_t(s.answer)] + "\n\n";
  return p;
}

std::vector<LoglikRequest> mmlu_requests(const std::string& prefix, const McItem& it) {
  std::vector<LoglikRequest> r;
  for (const auto& l : it.labels) r.push_back({prefix + mmlu_query(it), " " + l});
  return r;
}

std::string gsm8k_prompt(const std::vector<GsmItem>& ex, const std::string& question) {
  std::string p;
  for (const auto& e : ex) p += "Q: " + e.question + "\nA: " + e.solution + "\n\n";
  return p + "Q: " + question + "\nA:";
}

const std::vector<std::string>& gsm8k_stop() {
  static const std::vector<std::string> s = {"Q:", "</s>", "<|im_end|>", "\n\n"};
  return s;
}

std::string gsm8k_extract_strict(const std::string& g) {
  const std::string key = "The answer is ";
  for (size_t at = g.find(key); at != std::string::npos; at = g.find(key, at + 1)) {
    size_t i = at + key.size();
    const size_t start = i;
    if (i < g.size() && g[i] == '-') ++i;
    size_t j = i;
    while (j < g.size() && is_numlike(g[j])) ++j;
    if (j == i) continue;
    // The pattern needs one more character after the number; if the text
    // ends there, the last character of the run plays that part.
    if (j < g.size()) return g.substr(start, j - start);
    if (j - i >= 2) return g.substr(start, j - 1 - start);
  }
  return "";
}

std::string gsm8k_extract_flexible(const std::string& g) {
  std::string last;
  size_t i = 0;
  while (i < g.size()) {
    // Alternative 1: -?[$0-9.,]{2,}
    size_t k = i + (g[i] == '-' ? 1 : 0);
    size_t j = k;
    while (j < g.size() && is_flexlike(g[j])) ++j;
    if (j - k >= 2) {
      last = g.substr(i, j - i);
      i = j;
      continue;
    }
    // Alternative 2: -?[0-9]+
    j = k;
    while (j < g.size() && is_digit(g[j])) ++j;
    if (j > k) {
      last = g.substr(i, j - i);
      i = j;
      continue;
    }
    ++i;
  }
  return last;
}

std::string gsm8k_normalize(const std::string& s) {
  std::string t = s;
  if (auto h = t.rfind("#### "); h != std::string::npos) t = t.substr(h + 5);
  std::string out;
  for (char c : t)
    if (c != ',' && c != '$') out.push_back(c);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return trim(out);
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

size_t argmax(const std::vector<double>& v) {
  size_t b = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[b]) b = i;
  return b;
}

Subset stratified_subset(const std::string& task, const std::vector<std::string>& ids,
                         const std::vector<std::string>& strata, size_t limit, uint64_t seed) {
  Subset s;
  const size_t n = ids.size();
  if (limit == 0 || limit >= n) {
    s.indices.resize(n);
    std::iota(s.indices.begin(), s.indices.end(), size_t(0));
    s.name = task + " (all " + std::to_string(n) + ")";
    return s;
  }
  std::map<std::string, std::vector<size_t>> by;
  for (size_t i = 0; i < n; ++i) by[strata[i]].push_back(i);
  struct Share {
    std::string name;
    size_t base;
    double frac;
  };
  std::vector<Share> shares;
  size_t given = 0;
  for (const auto& [name, v] : by) {
    const double exact = double(limit) * double(v.size()) / double(n);
    const size_t base = std::min(v.size(), size_t(exact));
    shares.push_back({name, base, exact - double(base)});
    given += base;
  }
  std::vector<size_t> order(shares.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return shares[a].frac > shares[b].frac; });
  for (size_t k = 0; given < limit; k = (k + 1) % order.size()) {
    Share& sh = shares[order[k]];
    if (sh.base < by[sh.name].size()) {
      ++sh.base;
      ++given;
    }
  }
  for (const auto& sh : shares) {
    auto v = by[sh.name];
    std::sort(v.begin(), v.end(), [&](size_t a, size_t b) {
      const uint64_t ha = hash_id(seed, ids[a]), hb = hash_id(seed, ids[b]);
      return ha != hb ? ha < hb : a < b;
    });
    s.indices.insert(s.indices.end(), v.begin(), v.begin() + long(sh.base));
  }
  std::sort(s.indices.begin(), s.indices.end());
  std::string joined;
  for (size_t i : s.indices) joined += ids[i] + "\n";
  s.name = task + " limit=" + std::to_string(limit) + " seed=" + std::to_string(seed) +
           " stratified by " + std::to_string(by.size()) + " strata, ids " +
           sha256_hex(joined).substr(0, 12);
  return s;
}

std::vector<size_t> spread_subset(size_t n, size_t limit) {
  std::vector<size_t> v;
  if (limit == 0 || limit >= n) {
    v.resize(n);
    std::iota(v.begin(), v.end(), size_t(0));
    return v;
  }
  for (size_t i = 0; i < limit; ++i) v.push_back(size_t((double(i) + 0.5) * double(n) / double(limit)));
  return v;
}

std::vector<size_t> seeded_choice(size_t n, size_t k, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const uint64_t ha = mix64(seed * 0x100000001b3ull + a), hb = mix64(seed * 0x100000001b3ull + b);
    return ha != hb ? ha < hb : a < b;
  });
  idx.resize(std::min(n, k));
  return idx;
}

}  // namespace kvant::eval
