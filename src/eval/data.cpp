#include "eval/data.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#ifndef KVANT_SOURCE_DIR
#define KVANT_SOURCE_DIR "."
#endif

namespace kvant::eval {
namespace {

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void sha256_block(const uint8_t* p, std::array<uint32_t, 8>& h) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
           uint32_t(p[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kK[size_t(i)] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

std::string strip_cr(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n')) s.pop_back();
  return s;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const size_t n = bytes.size();
  size_t i = 0;
  for (; i + 64 <= n; i += 64) sha256_block(reinterpret_cast<const uint8_t*>(bytes.data()) + i, h);
  uint8_t tail[128] = {};
  const size_t rem = n - i;
  std::memcpy(tail, bytes.data() + i, rem);
  tail[rem] = 0x80;
  const size_t tail_len = rem + 9 <= 64 ? 64 : 128;
  const uint64_t bits = uint64_t(n) * 8;
  for (int b = 0; b < 8; ++b) tail[tail_len - 1 - size_t(b)] = uint8_t(bits >> (8 * b));
  sha256_block(tail, h);
  if (tail_len == 128) sha256_block(tail + 64, h);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint32_t v : h)
    for (int s = 28; s >= 0; s -= 4) out.push_back(hex[(v >> s) & 15]);
  return out;
}

Result<DataDir> DataDir::open(const std::string& root) {
  DataDir d;
  d.root_ = root;
  std::ifstream f(root + "/SHA256SUMS");
  if (!f) return make_error("eval data: cannot open " + root + "/SHA256SUMS (--data DIR)");
  std::string line;
  int ln = 0;
  while (std::getline(f, line)) {
    ++ln;
    line = strip_cr(line);
    if (line.empty()) continue;
    const auto sp = line.find(' ');
    if (sp != 64 || line.size() < 67)
      return make_error("eval data: " + root + "/SHA256SUMS line " + std::to_string(ln) +
                        ": expected '<64 hex digits>  <path>'");
    std::string path = line.substr(66);
    if (!path.empty() && path[0] == '*') path = path.substr(1);
    d.sums_[path] = line.substr(0, 64);
  }
  return d;
}

Result<std::string> DataDir::read(const std::string& rel) const {
  auto it = sums_.find(rel);
  if (it == sums_.end())
    return make_error("eval data: " + rel + " is not listed in " + root_ + "/SHA256SUMS");
  const std::string path = root_ + "/" + rel;
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("eval data: cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string bytes = ss.str();
  const std::string got = sha256_hex(bytes);
  if (got != it->second)
    return make_error("eval data: " + path + " has SHA-256 " + got + ", SHA256SUMS says " +
                      it->second + " (the file was changed or damaged)");
  return bytes;
}

std::vector<std::string> DataDir::list(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : sums_)
    if (k.rfind(prefix, 0) == 0) out.push_back(k);
  return out;
}

std::string DataDir::sum(const std::string& rel) const {
  auto it = sums_.find(rel);
  return it == sums_.end() ? "" : it->second;
}

std::string default_data_dir() {
  if (const char* e = std::getenv("KVANT_EVAL_DATA"); e && *e) return e;
  return std::string(KVANT_SOURCE_DIR) + "/data/eval";
}

std::vector<std::vector<std::string>> parse_csv(std::string_view t) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char ch = t[i];
    if (quoted) {
      if (ch == '"') {
        if (i + 1 < t.size() && t[i + 1] == '"') {
          field.push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field.push_back(ch);
      }
      continue;
    }
    if (ch == '"') {
      quoted = true;
      any = true;
    } else if (ch == ',') {
      row.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
      row.push_back(std::move(field));
      field.clear();
      rows.push_back(std::move(row));
      row.clear();
      any = false;
    } else {
      field.push_back(ch);
      any = true;
    }
  }
  if (any || !field.empty() || !row.empty()) {
    row.push_back(std::move(field));
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<std::vector<McItem>> parse_arc_jsonl(std::string_view text, const std::string& name) {
  std::vector<McItem> out;
  std::istringstream in{std::string(text)};
  std::string line;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    line = strip_cr(line);
    if (line.empty()) continue;
    const std::string where = name + " line " + std::to_string(ln);
    try {
      const auto j = nlohmann::json::parse(line);
      McItem it;
      it.id = j.at("id").get<std::string>();
      it.stratum = it.id.substr(0, it.id.find('_'));
      it.question = j.at("question").at("stem").get<std::string>();
      for (const auto& c : j.at("question").at("choices")) {
        it.labels.push_back(c.at("label").get<std::string>());
        it.choices.push_back(c.at("text").get<std::string>());
      }
      const std::string key = j.at("answerKey").get<std::string>();
      for (size_t i = 0; i < it.labels.size(); ++i)
        if (it.labels[i] == key) it.answer = int(i);
      if (it.answer < 0) return make_error(where + ": answerKey '" + key + "' is no choice label");
      if (it.choices.size() < 2) return make_error(where + ": fewer than 2 choices");
      out.push_back(std::move(it));
    } catch (const std::exception& e) {
      return make_error(where + ": " + e.what());
    }
  }
  return out;
}

Result<std::vector<McItem>> parse_mmlu_csv(std::string_view text, const std::string& subject) {
  std::vector<McItem> out;
  const auto rows = parse_csv(text);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.size() == 1 && row[0].empty()) continue;
    if (row.size() != 6)
      return make_error("mmlu " + subject + " row " + std::to_string(r + 1) + ": " +
                        std::to_string(row.size()) + " fields, expected 6");
    McItem it;
    it.id = subject + "/" + std::to_string(r);
    it.stratum = subject;
    it.subject = subject;
    it.question = row[0];
    it.labels = {"A", "B", "C", "D"};
    it.choices = {row[1], row[2], row[3], row[4]};
    const std::string& a = row[5];
    if (a.size() != 1 || a[0] < 'A' || a[0] > 'D')
      return make_error("mmlu " + subject + " row " + std::to_string(r + 1) + ": answer '" + a +
                        "' is not A-D");
    it.answer = a[0] - 'A';
    out.push_back(std::move(it));
  }
  return out;
}

Result<std::vector<GsmItem>> parse_gsm8k_jsonl(std::string_view text, const std::string& name) {
  std::vector<GsmItem> out;
  std::istringstream in{std::string(text)};
  std::string line;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    line = strip_cr(line);
    if (line.empty()) continue;
    const std::string where = name + " line " + std::to_string(ln);
    try {
      const auto j = nlohmann::json::parse(line);
      GsmItem it;
      it.id = "gsm8k/" + std::to_string(out.size());
      it.question = j.at("question").get<std::string>();
      it.solution = j.at("answer").get<std::string>();
      const auto hash = it.solution.rfind("#### ");
      if (hash != std::string::npos) {
        for (char c : it.solution.substr(hash + 5))
          if (c != ',' && c != '\n' && c != '\r' && c != ' ') it.target.push_back(c);
        const int steps = int(std::count(it.solution.begin(), it.solution.begin() + long(hash), '\n'));
        it.stratum = "steps" + std::to_string(std::min(steps, 8));
      } else {
        // Exemplars: the final number follows "The answer is ".
        const auto k = it.solution.rfind("The answer is ");
        if (k == std::string::npos)
          return make_error(where + ": no '#### N' or 'The answer is N' in the answer");
        for (char c : it.solution.substr(k + 14))
          if (c != ',' && c != '.') it.target.push_back(c);
        it.stratum = "exemplar";
      }
      out.push_back(std::move(it));
    } catch (const std::exception& e) {
      return make_error(where + ": " + e.what());
    }
  }
  return out;
}

Result<std::vector<McItem>> load_arc(const DataDir& d, const std::string& split) {
  const std::string rel = split == "train" ? "arc_challenge/ARC-Challenge-Train.jsonl"
                                           : "arc_challenge/ARC-Challenge-Test.jsonl";
  auto t = d.read(rel);
  if (!t) return t.error();
  return parse_arc_jsonl(*t, rel);
}

Result<std::vector<McItem>> load_mmlu(const DataDir& d, const std::string& split) {
  std::vector<McItem> all;
  const std::string prefix = "mmlu/" + split + "/";
  const std::string suffix = "_" + split + ".csv";
  const auto files = d.list(prefix);
  if (files.empty()) return make_error("eval data: no " + prefix + "*.csv in SHA256SUMS");
  for (const auto& rel : files) {
    std::string subject = rel.substr(prefix.size());
    if (!subject.ends_with(suffix)) continue;
    subject.resize(subject.size() - suffix.size());
    auto t = d.read(rel);
    if (!t) return t.error();
    auto items = parse_mmlu_csv(*t, subject);
    if (!items) return items.error();
    for (auto& it : *items) all.push_back(std::move(it));
  }
  return all;
}

Result<std::vector<GsmItem>> load_gsm8k_test(const DataDir& d) {
  auto t = d.read("gsm8k/test.jsonl");
  if (!t) return t.error();
  return parse_gsm8k_jsonl(*t, "gsm8k/test.jsonl");
}

Result<std::vector<GsmItem>> load_gsm8k_exemplars(const DataDir& d) {
  auto t = d.read("gsm8k/cot_exemplars.jsonl");
  if (!t) return t.error();
  return parse_gsm8k_jsonl(*t, "gsm8k/cot_exemplars.jsonl");
}

Result<std::string> load_wikitext2_test(const DataDir& d) {
  return d.read("wikitext-2-raw/wiki.test.raw");
}

}  // namespace kvant::eval
