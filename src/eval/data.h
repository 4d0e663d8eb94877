// Evaluation data for `kvant eval`: the vendored data sets under data/eval,
// each file checked against the folder's SHA256SUMS when read, and parsed
// into items (GSM8K problems, ARC-Challenge and MMLU multiple-choice
// questions, WikiText-2 text). No model knowledge here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kvant::eval {

// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

// The data folder and its SHA256SUMS (`<hex>  <relative path>` lines).
class DataDir {
 public:
  static Result<DataDir> open(const std::string& root);
  // The file's bytes; an error when it is missing, not listed in SHA256SUMS
  // or its sum differs.
  Result<std::string> read(const std::string& rel) const;
  const std::string& root() const { return root_; }
  // The listed files under `prefix` (e.g. "mmlu/test/"), sorted.
  std::vector<std::string> list(const std::string& prefix) const;
  // The recorded sum of a listed file ("" if none).
  std::string sum(const std::string& rel) const;

 private:
  std::string root_;
  std::map<std::string, std::string> sums_;
};

// The default data folder: $KVANT_EVAL_DATA, else the source tree's data/eval.
std::string default_data_dir();

// RFC 4180 CSV: quoted fields may hold commas, quotes ("") and newlines;
// rows end in LF or CRLF. A final row without a line end is kept.
std::vector<std::vector<std::string>> parse_csv(std::string_view text);

// One multiple-choice question (ARC-Challenge, MMLU).
struct McItem {
  std::string id;       // stable: ARC's id, MMLU "<subject>/<row>"
  std::string stratum;  // for stratified subsets: ARC's source prefix, MMLU's subject
  std::string subject;  // MMLU subject ("" for ARC)
  std::string question;
  std::vector<std::string> labels;   // "A".."E" or "1".."5"
  std::vector<std::string> choices;  // texts, same order
  int answer = -1;                   // index into choices
};

struct GsmItem {
  std::string id;       // "gsm8k/<row>"
  std::string stratum;  // "steps<k>": lines of the reference solution (capped at 8)
  std::string question;
  std::string solution;  // the reference answer text, "#### N" at the end
  std::string target;    // N, commas removed
};

// Each loader names the file and line or row of the first malformed entry.
Result<std::vector<McItem>> parse_arc_jsonl(std::string_view text, const std::string& name);
Result<std::vector<McItem>> parse_mmlu_csv(std::string_view text, const std::string& subject);
Result<std::vector<GsmItem>> parse_gsm8k_jsonl(std::string_view text, const std::string& name);

Result<std::vector<McItem>> load_arc(const DataDir& d, const std::string& split);  // test|train
Result<std::vector<McItem>> load_mmlu(const DataDir& d, const std::string& split);  // test|dev
Result<std::vector<GsmItem>> load_gsm8k_test(const DataDir& d);
Result<std::vector<GsmItem>> load_gsm8k_exemplars(const DataDir& d);
Result<std::string> load_wikitext2_test(const DataDir& d);

}  // namespace kvant::eval
