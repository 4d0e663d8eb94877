// Results of `kvant eval` as JSON and Markdown, the resume file, and
// `kvant eval compare`. A result file holds, per task, its metrics (value,
// standard error, 95% interval) and per-item values, so that two runs on the
// same items compare item by item (paired) and other runs by their intervals.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/result.h"
#include "eval/stats.h"

namespace kvant::eval {

nlohmann::json estimate_json(const Estimate& e);
Estimate estimate_from_json(const nlohmann::json& j);

// Markdown table of every task's metrics in a result file:
// | task | metric | value | 95% CI | n |.
std::string markdown_table(const nlohmann::json& result);

// Differences B - A for every metric both files have: paired over the
// items both scored when per-item values are present (metric "item_key"),
// else from the two intervals. Text table plus the same as JSON.
struct Comparison {
  std::string text;
  nlohmann::json json;
};
Comparison compare_results(const nlohmann::json& a, const nlohmann::json& b);

// Resume file: a header line {"fingerprint": ...} and one JSON object per
// finished item (with "task" and "id"). A damaged or incomplete last line
// (the run was killed while writing it) is ignored.
class ResumeLog {
 public:
  // Opens `path`: keeps its records if its fingerprint equals `fingerprint`,
  // refuses (error) if it differs, starts it otherwise. fresh: discard old records.
  static Result<ResumeLog> open(const std::string& path, const nlohmann::json& fingerprint,
                                bool fresh);
  const nlohmann::json* find(const std::string& task, const std::string& id) const;
  size_t size() const { return done_.size(); }
  Result<void> append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, nlohmann::json> done_;  // task + '\n' + id
};

}  // namespace kvant::eval
