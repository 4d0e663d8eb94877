// The progress bar (progress.h).
#include "eval/progress.h"

#include <cmath>
#include <cstdio>

namespace kvant::eval {

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  char b[32];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%ld:%02ld", t / 60, t % 60);
  return b;
}

Progress::Progress(std::string name, size_t total, size_t resumed, bool quiet)
    : name_(std::move(name)), total_(total), done_(resumed), resumed_(resumed), quiet_(quiet) {
  draw(true);
}

void Progress::tick(size_t n) {
  done_ += n;
  draw(done_ == total_);
}

Progress::~Progress() {
  if (!quiet_) std::fprintf(stderr, "\n");
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

void Progress::draw(bool force) {
  if (quiet_) return;
  const auto now = Clock::now();
  if (!force && now - last_ < std::chrono::milliseconds(250)) return;
  last_ = now;
  const double el = elapsed();
  const size_t fresh = done_ - resumed_;
  const double eta = fresh > 0 ? el / double(fresh) * double(total_ - done_) : NAN;
  const int width = 24;
  const int fill = total_ ? int(double(width) * double(done_) / double(total_)) : width;
  std::string bar(size_t(fill), '#');
  bar += std::string(size_t(width - fill), '.');
  std::fprintf(stderr, "\r%-14s [%s] %zu/%zu %5.1f%%  %s elapsed  ETA %s   ", name_.c_str(),
               bar.c_str(), done_, total_, total_ ? 100.0 * double(done_) / double(total_) : 100.0,
               hms(el).c_str(), hms(eta).c_str());
  std::fflush(stderr);
}

}  // namespace kvant::eval
