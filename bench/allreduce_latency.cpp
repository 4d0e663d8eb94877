// All-reduce latency of a communicator (src/dist/), for message sizes from
// 4 KiB (one decode step's hidden vector of a 1024-wide model in FP32) up
// to 16 MiB, doubling:
//
//   mpirun --oversubscribe --allow-run-as-root --bind-to none --mca pml ob1
//          --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
//          -np 2 build/bench/kvant_bench_allreduce --json        (one line)
//
// (README.md, "Several processes on one machine", says what each flag is for.)
//
// Every repetition starts together (a barrier, not timed) and counts as its
// slowest rank's time: a collective is done when its last rank is. Reported
// per size: the median and p90 of those times (nearest rank) in
// microseconds, with the rank count and the communicator's name; rank 0
// prints. The input is restored before each repetition so the sums stay
// finite and every repetition adds the same numbers.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace kvant::dist {
namespace {

struct Options {
  std::string comm;  // empty: "mpi" under mpirun, "local" otherwise
  int reps = 100;
  int warmup = 5;
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 16 << 20;
  bool json = false;
};

struct Row {
  int64_t bytes;
  double median_us, p90_us;
};

void must(Communicator& c, Result<void> r) {
  if (r.ok()) return;
  std::fprintf(stderr, "allreduce_latency: rank %d: %s\n", c.rank(), r.error().message.c_str());
  c.abort(1);
}

// Nearest rank: the smallest value with at least p of the values at or below it.
double percentile(const std::vector<double>& sorted, double p) {
  const size_t k = size_t(std::ceil(p * double(sorted.size())));
  return sorted[std::max<size_t>(k, 1) - 1];
}

// One size: `reps` timed all-reduces of the first `n` floats of `data`, the
// slowest rank's time of each, then its median and p90.
Row measure(Communicator& c, const Options& o, std::vector<float>& data,
            const std::vector<float>& input, size_t n) {
  const std::span<float> msg(data.data(), n);
  for (int i = 0; i < o.warmup; ++i) {
    std::copy_n(input.begin(), n, data.begin());
    must(c, c.all_reduce_sum(msg));
  }
  std::vector<double> mine(size_t(o.reps));
  for (double& us : mine) {
    std::copy_n(input.begin(), n, data.begin());
    must(c, c.barrier());
    const auto t0 = std::chrono::steady_clock::now();
    must(c, c.all_reduce_sum(msg));
    us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  std::vector<double> all(mine.size() * size_t(c.size()));
  must(c, c.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all))));
  std::vector<double> slowest(mine.size(), 0.0);
  for (size_t r = 0; r < size_t(c.size()); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      slowest[i] = std::max(slowest[i], all[r * mine.size() + i]);
  std::sort(slowest.begin(), slowest.end());
  return {int64_t(n * sizeof(float)), percentile(slowest, 0.5), percentile(slowest, 0.9)};
}

void print(const Communicator& c, const Options& o, const std::vector<Row>& rows) {
  if (o.json) {
    std::printf(
        "{\"communicator\": \"%s\", \"ranks\": %d, \"reps\": %d, \"warmup\": %d, \"results\": [",
        c.name(), c.size(), o.reps, o.warmup);
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf(
          "%s\n  {\"bytes\": %lld, \"floats\": %lld, \"median_us\": %.2f, \"p90_us\": %.2f}",
          i ? "," : "", (long long)rows[i].bytes, (long long)rows[i].bytes / 4, rows[i].median_us,
          rows[i].p90_us);
    std::printf("\n]}\n");
    return;
  }
  std::printf("all_reduce_sum, communicator %s, %d rank(s), %d repetitions\n", c.name(), c.size(),
              o.reps);
  std::printf("%12s %12s %12s\n", "bytes", "median us", "p90 us");
  for (const Row& r : rows)
    std::printf("%12lld %12.2f %12.2f\n", (long long)r.bytes, r.median_us, r.p90_us);
}

int run(const Options& o) {
  const std::string kind = !o.comm.empty() ? o.comm : launched_by_mpirun() ? "mpi" : "local";
  auto made = make_communicator(kind);
  if (!made.ok()) {
    std::fprintf(stderr, "allreduce_latency: %s\n", made.error().message.c_str());
    return 1;
  }
  Communicator& c = **made;
  const size_t max_n = size_t(o.max_bytes) / sizeof(float);
  std::vector<float> data(max_n), input(max_n);
  for (size_t i = 0; i < max_n; ++i) input[i] = float(i % 17) * 0.25f + float(c.rank());
  std::vector<Row> rows;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2)
    rows.push_back(measure(c, o, data, input, size_t(bytes) / sizeof(float)));
  if (c.rank() == 0) print(c, o, rows);
  return 0;
}

}  // namespace
}  // namespace kvant::dist

int main(int argc, char** argv) {
  kvant::dist::Options o;
  CLI::App app{"all-reduce latency of a kvant communicator, per message size"};
  app.add_option("--comm", o.comm, "local or mpi (default: mpi under mpirun, local otherwise)");
  app.add_option("--reps", o.reps, "timed repetitions per size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed repetitions per size first")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-bytes", o.min_bytes, "smallest message (bytes, a multiple of 4)");
  app.add_option("--max-bytes", o.max_bytes, "largest message; sizes double up to it");
  app.add_flag("--json", o.json, "one JSON object on stdout");
  CLI11_PARSE(app, argc, argv);
  if (o.min_bytes < 4 || o.min_bytes % 4 != 0 || o.max_bytes < o.min_bytes) {
    std::fprintf(stderr,
                 "allreduce_latency: need 4 <= --min-bytes <= --max-bytes, multiples of 4\n");
    return 2;
  }
  return kvant::dist::run(o);
}
