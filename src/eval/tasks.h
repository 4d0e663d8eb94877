// Prompt formats, answer extraction and item selection for `kvant eval`.
// The formats follow lm-evaluation-harness's conventions (arc_challenge,
// mmlu, gsm8k_cot) so scores compare with published ones; docs/ACCURACY.md
// spells each out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/data.h"

namespace kvant::eval {

// A log-likelihood request: the score of `continuation` after `context`.
struct LoglikRequest {
  std::string context, continuation;
};

// ARC-Challenge: "Question: <stem>\nAnswer:" and each choice as " <text>";
// few-shot exemplars are "Question: <stem>\nAnswer: <correct text>", joined
// and followed by "\n\n".
std::string arc_query(const McItem& it);
std::string arc_fewshot_prefix(const std::vector<McItem>& shots);
std::vector<LoglikRequest> arc_requests(const std::string& prefix, const McItem& it);

// MMLU: "The following are multiple choice questions (with answers) about
// <subject with spaces>.\n\n", the dev split's first k items of the subject as
// "<question>\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer: <letter>\n\n", then the
// question in the same form ending "Answer:"; the choices are " A".." D".
std::string mmlu_subject_title(const std::string& subject);  // "high school biology"
std::string mmlu_query(const McItem& it);
std::string mmlu_prefix(const std::string& subject, const std::vector<McItem>& shots);
std::vector<LoglikRequest> mmlu_requests(const std::string& prefix, const McItem& it);

// GSM8K 8-shot chain of thought: "Q: <question>\nA: <worked answer>\n\n" per
// exemplar, then "Q: <question>\nA:"; greedy generation stops at any of
// gsm8k_stop() or after 256 tokens.
std::string gsm8k_prompt(const std::vector<GsmItem>& exemplars, const std::string& question);
const std::vector<std::string>& gsm8k_stop();

// The answer in a generation, as the harness's two filters find it:
// strict: the number after the first "The answer is " (sign, digits, '.',
// ','), which must be followed by a character; flexible: the last number-like
// run in the text ("-?[$0-9.,]{2,}" or "-?[0-9]+"). "" when there is none.
std::string gsm8k_extract_strict(const std::string& gen);
std::string gsm8k_extract_flexible(const std::string& gen);
// Drops ',' and '$', everything up to a "#### ", and one trailing '.'.
std::string gsm8k_normalize(const std::string& s);

// Character count of UTF-8 text (code points): the length the harness
// normalizes acc_norm by.
int64_t utf8_length(const std::string& s);

// Index of the largest value; ties go to the lower index.
size_t argmax(const std::vector<double>& v);

// A fixed, seeded, stratified subset of `limit` items: each stratum gets its
// proportional share (largest remainders, ties by stratum name), and within a
// stratum the items whose hash of (seed, id) is smallest. The result keeps
// the items' original order. `name` identifies it: the task, limit, seed and
// the first 12 hex digits of the SHA-256 of the chosen ids.
struct Subset {
  std::vector<size_t> indices;
  std::string name;
};
Subset stratified_subset(const std::string& task, const std::vector<std::string>& ids,
                         const std::vector<std::string>& strata, size_t limit, uint64_t seed);
// `limit` of `n` windows spread evenly over the text (all when limit is 0 or >= n).
std::vector<size_t> spread_subset(size_t n, size_t limit);

// k distinct indices of a pool of n, by hash of (seed, index): the few-shot
// exemplars (ARC's 25 from its train split).
std::vector<size_t> seeded_choice(size_t n, size_t k, uint64_t seed);

uint64_t mix64(uint64_t x);

}  // namespace kvant::eval
