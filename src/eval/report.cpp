#include "eval/report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvant::eval {
namespace {

using nlohmann::json;

std::string fmt(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// Accuracies as percentages, others as they are.
bool is_percent(const json& m) { return m.value("unit", "") == "%"; }

std::string show(const json& m, double v) {
  if (is_percent(m)) return fmt(100 * v, 2);
  const double a = std::fabs(v);
  return fmt(v, a != 0 && a < 0.01 ? 6 : 4);
}

}  // namespace

json estimate_json(const Estimate& e) {
  return {{"value", e.value}, {"se", e.se}, {"ci95", {e.lo, e.hi}}, {"n", e.n}};
}

Estimate estimate_from_json(const json& j) {
  Estimate e;
  e.value = j.value("value", 0.0);
  e.se = j.value("se", 0.0);
  if (j.contains("ci95") && j["ci95"].size() == 2) {
    e.lo = j["ci95"][0].get<double>();
    e.hi = j["ci95"][1].get<double>();
  } else {
    e.lo = e.hi = e.value;
  }
  e.n = j.value("n", int64_t(0));
  return e;
}

std::string markdown_table(const json& r) {
  std::ostringstream o;
  o << "| task | subset | metric | value | 95% CI | n |\n|---|---|---|---:|---|---:|\n";
  for (const auto& [task, t] : r.at("tasks").items()) {
    for (const auto& [name, m] : t.at("metrics").items()) {
      o << "| " << task << " | " << t.value("subset", "") << " | " << name
        << (is_percent(m) ? " (%)" : "") << " | " << show(m, m.value("value", 0.0)) << " | ";
      if (m.contains("ci95"))
        o << show(m, m["ci95"][0].get<double>()) << " – " << show(m, m["ci95"][1].get<double>());
      else
        o << "–";
      o << " | " << m.value("n", int64_t(0)) << " |\n";
    }
  }
  return o.str();
}

Comparison compare_results(const json& a, const json& b) {
  Comparison c;
  std::ostringstream o;
  o << "B - A, 95% intervals; paired over shared items where per-item values exist\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-14s %-16s %12s %12s %12s %26s %6s %s\n", "task", "metric",
                "A", "B", "B - A", "95% CI", "n", "significant");
  o << line;
  for (const auto& [task, tb] : b.at("tasks").items()) {
    if (!a.at("tasks").contains(task)) continue;
    const json& ta = a["tasks"][task];
    for (const auto& [name, mb] : tb.at("metrics").items()) {
      if (!ta.at("metrics").contains(name)) continue;
      const json& ma = ta["metrics"][name];
      const Estimate ea = estimate_from_json(ma), eb = estimate_from_json(mb);
      Difference d;
      const std::string key = mb.value("item_key", "");
      bool paired = false;
      if (!key.empty() && ta.contains("items") && tb.contains("items")) {
        std::map<std::string, double> va;
        for (const auto& it : ta["items"])
          if (it.contains(key)) va[it.value("id", "")] = it[key].get<double>();
        std::vector<double> xa, xb;
        for (const auto& it : tb["items"]) {
          auto f = va.find(it.value("id", ""));
          if (f == va.end() || !it.contains(key)) continue;
          xa.push_back(f->second);
          xb.push_back(it[key].get<double>());
        }
        if (xa.size() > 1) {
          d = paired_difference(xa, xb);
          paired = true;
          if (mb.value("transform", "") == "exp") {
            // Perplexity: the paired difference is in mean NLL per token;
            // shown as the change of A's perplexity it implies.
            const double pa = ea.value;
            d.diff = pa * (std::exp(d.diff) - 1);
            d.lo = pa * (std::exp(d.lo) - 1);
            d.hi = pa * (std::exp(d.hi) - 1);
          }
        }
      }
      if (!paired) d = unpaired_difference(ea, eb);
      const bool has_ci = mb.contains("ci95") && ma.contains("ci95");
      std::string ci = has_ci ? "[" + show(mb, d.lo) + ", " + show(mb, d.hi) + "]" : "-";
      std::snprintf(line, sizeof line, "%-14s %-16s %12s %12s %12s %26s %6lld %s\n", task.c_str(),
                    (name + (is_percent(mb) ? " (%)" : "")).c_str(), show(ma, ea.value).c_str(),
                    show(mb, eb.value).c_str(), show(mb, d.diff).c_str(), ci.c_str(),
                    (long long)d.n,
                    !has_ci ? "-" : d.significant ? (paired ? "yes (paired)" : "yes")
                                                  : (paired ? "no (paired)" : "no"));
      o << line;
      c.json[task][name] = {{"a", ea.value},       {"b", eb.value},
                            {"diff", d.diff},      {"ci95", {d.lo, d.hi}},
                            {"n", d.n},            {"paired", paired},
                            {"significant", has_ci && d.significant}};
    }
  }
  c.text = o.str();
  return c;
}

Result<ResumeLog> ResumeLog::open(const std::string& path, const json& fp, bool fresh) {
  ResumeLog r;
  r.path_ = path;
  bool start = true;
  if (!fresh) {
    std::ifstream f(path);
    std::string line;
    if (f && std::getline(f, line)) {
      json h;
      try {
        h = json::parse(line);
      } catch (...) {
        return make_error("eval: " + path + " is not a kvant eval resume file (remove it)");
      }
      if (h.value("fingerprint", json()) != fp)
        return make_error("eval: " + path +
                          " holds results of a different run (model, settings, task or subset); "
                          "remove it or pass --no-resume");
      start = false;
      while (std::getline(f, line)) {
        try {
          auto j = json::parse(line);
          r.done_[j.at("task").get<std::string>() + "\n" + j.at("id").get<std::string>()] = j;
        } catch (...) {
          // A line cut short by an interruption.
        }
      }
    }
  }
  if (start) {
    std::ofstream f(path, std::ios::trunc);
    f << json{{"fingerprint", fp}}.dump() << "\n";
    if (!f) return make_error("eval: cannot write " + path);
  } else {
    // Rewrite without a damaged tail so later appends start on a fresh line.
    std::ofstream f(path, std::ios::trunc);
    f << json{{"fingerprint", fp}}.dump() << "\n";
    for (const auto& [k, v] : r.done_) f << v.dump() << "\n";
    if (!f) return make_error("eval: cannot write " + path);
  }
  return r;
}

const json* ResumeLog::find(const std::string& task, const std::string& id) const {
  auto it = done_.find(task + "\n" + id);
  return it == done_.end() ? nullptr : &it->second;
}

Result<void> ResumeLog::append(const json& rec) {
  std::ofstream f(path_, std::ios::app);
  f << rec.dump() << "\n";
  f.flush();
  if (!f) return make_error("eval: cannot append to " + path_);
  done_[rec.at("task").get<std::string>() + "\n" + rec.at("id").get<std::string>()] = rec;
  return {};
}

}  // namespace kvant::eval
