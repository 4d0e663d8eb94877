// A one-line progress bar on stderr for `kvant eval`'s tasks: done/total,
// elapsed time and an ETA from the items finished in this run (resumed ones
// do not count towards the rate).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace kvant::eval {

// Seconds as M:SS or H:MM:SS ("--:--" when unknown).
std::string hms(double s);

class Progress {
  using Clock = std::chrono::steady_clock;

 public:
  Progress(std::string name, size_t total, size_t resumed, bool quiet);
  void tick(size_t n = 1);
  ~Progress();
  double elapsed() const;

 private:
  void draw(bool force);
  std::string name_;
  size_t total_, done_, resumed_;
  bool quiet_;
  Clock::time_point t0_ = Clock::now(), last_{};
};

}  // namespace kvant::eval
