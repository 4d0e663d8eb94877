// The communicator contracts (src/dist/communicator.h) on however many ranks
// this binary was started as: "mpi" under mpirun (ctest dist_mpi_np2,
// dist_mpi_np3), "local" otherwise (dist_local). Every rank runs every test
// and so calls the same collectives in the same order; checks are EXPECTs,
// never ASSERTs, so that a failure on one rank does not skip a collective
// the others are waiting in. A transport error aborts the whole job.
// Every rank knows every rank's input (a function of rank and index), so
// each checks its results against a scalar reference itself.
#include "dist/communicator.h"
#include "dist/nccl/ordered_sum.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace kvant::dist {
namespace {

Communicator* g_comm = nullptr;

// A transport error leaves the peers blocked: end the job, loudly.
void must(Result<void> r) {
  if (r.ok()) return;
  std::fprintf(stderr, "rank %d: %s\n", g_comm->rank(), r.error().message.c_str());
  g_comm->abort(2);
}

// Every rank's equal-length vector, rank 0's first.
template <class T>
std::vector<T> gather(const std::vector<T>& mine) {
  std::vector<T> all(mine.size() * size_t(g_comm->size()));
  must(g_comm->all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all))));
  return all;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank r's contribution to element i: signs and magnitudes from 2^-20 to
// 2^20, so that adding in another order changes the bits of many sums.
float contribution(int r, size_t i) {
  const uint64_t h = mix(uint64_t(r) * 0x9E3779B97F4A7C15ull + i + 1);
  const float mant = 0.5f + float(h & 0xFFFFFF) / float(1 << 24);
  const int exp = int((h >> 24) % 41) - 20;
  return ((h >> 40) & 1 ? -1.f : 1.f) * std::ldexp(mant, exp);
}

std::vector<float> contributions(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = contribution(r, i);
  return v;
}

// The contract's reference: ((x_0 + x_1) + x_2) + ..., one element at a time.
std::vector<float> rank_order_sum(size_t n, int ranks) {
  std::vector<float> sum = contributions(0, n);
  for (int r = 1; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i) sum[i] += contribution(r, i);
  return sum;
}

// The first index whose bits differ, or -1.
int64_t first_bit_difference(std::span<const float> a, std::span<const float> b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return int64_t(i);
  return -1;
}

TEST(Communicator, RankAndSize) {
  const int me = g_comm->rank(), n = g_comm->size();
  EXPECT_GE(me, 0);
  EXPECT_LT(me, n);
  EXPECT_STREQ(g_comm->name(), launched_by_mpirun() ? "mpi" : "local");
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(n, std::atoi(s));
  }
  if (const char* s = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(me, std::atoi(s));
  }
  const std::vector<int> ranks = gather(std::vector<int>{me});
  for (int r = 0; r < n; ++r) EXPECT_EQ(ranks[size_t(r)], r);
}

TEST(Communicator, AllReduceSumIsTheRankOrderSumBitwiseOnEveryRank) {
  const int N = g_comm->size();
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(4097), size_t(1) << 20}) {
    std::vector<float> got = contributions(g_comm->rank(), n);
    must(g_comm->all_reduce_sum(got));
    const std::vector<float> ref = rank_order_sum(n, N);
    EXPECT_EQ(first_bit_difference(got, ref), -1) << n << " floats, rank " << g_comm->rank();

    // Every rank holds the same bits.
    const std::vector<float> all = gather(got);
    for (int r = 0; r < N; ++r)
      EXPECT_EQ(first_bit_difference(std::span(all).subspan(size_t(r) * n, n), got), -1)
          << n << " floats: rank " << r << " differs from rank " << g_comm->rank();

    // And again, the same bits.
    std::vector<float> again = contributions(g_comm->rank(), n);
    must(g_comm->all_reduce_sum(again));
    EXPECT_EQ(first_bit_difference(again, got), -1) << n << " floats, second call";

    // The check can fail: from three ranks on, another order of the same
    // additions gives other bits for some elements.
    if (N >= 3 && n == 4097) {
      int64_t differ = 0;
      for (size_t i = 0; i < n; ++i) {
        float rev = contribution(N - 1, i);
        for (int r = N - 2; r >= 0; --r) rev += contribution(r, i);
        differ += std::bit_cast<uint32_t>(rev) != std::bit_cast<uint32_t>(ref[i]);
      }
      EXPECT_GT(differ, 0);
    }
  }
}

TEST(Communicator, AllReduceSumOnAPieceOfALargerBuffer) {
  // An unaligned piece: the rest of the buffer is left alone.
  const size_t n = 1001;
  std::vector<float> buf(n + 5, 7.f);
  const std::vector<float> mine = contributions(g_comm->rank(), n);
  std::copy(mine.begin(), mine.end(), buf.begin() + 3);
  must(g_comm->all_reduce_sum(std::span(buf).subspan(3, n)));
  EXPECT_EQ(first_bit_difference(std::span(buf).subspan(3, n), rank_order_sum(n, g_comm->size())),
            -1);
  for (size_t i : {size_t(0), size_t(1), size_t(2), n + 3, n + 4}) EXPECT_EQ(buf[i], 7.f);
}

std::byte pattern(int from, int to, size_t j) {
  return std::byte((from * 131 + to * 17 + int(j % 251) * 7 + 3) & 0xFF);
}

TEST(Communicator, AllGatherPlacesPiecesInRankOrder) {
  const int me = g_comm->rank(), N = g_comm->size();
  for (size_t k : {size_t(0), size_t(1), size_t(13), size_t(1) << 16}) {
    std::vector<std::byte> in(k), out(k * size_t(N), std::byte{0xEE});
    for (size_t j = 0; j < k; ++j) in[j] = pattern(me, 0, j);
    must(g_comm->all_gather(in, out));
    int64_t wrong = 0;
    for (int r = 0; r < N; ++r)
      for (size_t j = 0; j < k; ++j) wrong += out[size_t(r) * k + j] != pattern(r, 0, j);
    EXPECT_EQ(wrong, 0) << k << " bytes per rank";
  }
}

// Bytes from rank `from` to rank `to`, in each scenario.
using Counts = size_t (*)(int from, int to);
size_t uneven(int from, int to) {
  return (from + 2 * to) % 3 == 1 ? 0 : 1 + 97 * size_t((5 * from + 3 * to) % 4);
}
size_t none(int, int) { return 0; }
size_t only_rank0_sends(int from, int to) { return from == 0 ? 4097 + size_t(to) : 0; }
size_t large(int from, int to) { return (size_t(1) << 18) + size_t(from * 3 + to); }

TEST(Communicator, AllToAllVWithUnevenAndZeroCounts) {
  const int me = g_comm->rank(), N = g_comm->size();
  for (Counts count : {uneven, none, only_rank0_sends, large}) {
    std::vector<size_t> send_counts(static_cast<size_t>(N)), recv_counts(static_cast<size_t>(N));
    size_t send_total = 0, recv_total = 0;
    for (int r = 0; r < N; ++r) {
      send_total += send_counts[size_t(r)] = count(me, r);
      recv_total += recv_counts[size_t(r)] = count(r, me);
    }
    std::vector<std::byte> send;
    for (int r = 0; r < N; ++r)
      for (size_t j = 0; j < send_counts[size_t(r)]; ++j) send.push_back(pattern(me, r, j));
    // Room past the end, which must stay untouched.
    std::vector<std::byte> recv(recv_total + 16, std::byte{0xEE});
    must(g_comm->all_to_all_v(send, send_counts, recv, recv_counts));
    int64_t wrong = 0;
    size_t at = 0;
    for (int r = 0; r < N; ++r)
      for (size_t j = 0; j < recv_counts[size_t(r)]; ++j) wrong += recv[at++] != pattern(r, me, j);
    for (size_t j = recv_total; j < recv.size(); ++j) wrong += recv[j] != std::byte{0xEE};
    EXPECT_EQ(wrong, 0) << "rank " << me << ", " << send_total << " bytes sent, " << recv_total
                        << " received";
  }
}

TEST(Communicator, BroadcastFromEachRoot) {
  const int me = g_comm->rank(), N = g_comm->size();
  for (size_t k : {size_t(0), size_t(1), size_t(4097)}) {
    for (int root = 0; root < N; ++root) {
      std::vector<std::byte> buf(k, std::byte(0xA0 + me));
      if (me == root)
        for (size_t j = 0; j < k; ++j) buf[j] = pattern(root, 0, j);
      must(g_comm->broadcast(buf, root));
      int64_t wrong = 0;
      for (size_t j = 0; j < k; ++j) wrong += buf[j] != pattern(root, 0, j);
      EXPECT_EQ(wrong, 0) << k << " bytes from root " << root << " at rank " << me;
    }
  }
}

TEST(Communicator, BarrierHoldsEveryRankUntilAllArrive) {
  for (int i = 0; i < 50; ++i) must(g_comm->barrier());
  // Ranks arrive 30 ms apart; none may leave before the last arrives.
  // steady_clock is CLOCK_MONOTONIC, one clock for every process of a host,
  // so the times compare only when every rank runs on this host.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::vector<char> hosts = gather(std::vector<char>(host, host + sizeof host));
  bool one_host = true;
  for (int r = 0; r < g_comm->size(); ++r)
    one_host &= std::memcmp(hosts.data() + size_t(r) * sizeof host, host, sizeof host) == 0;
  const auto now_ns = [] {
    return int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count());
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(30 * g_comm->rank()));
  const int64_t enter = now_ns();
  must(g_comm->barrier());
  const int64_t leave = now_ns();
  const std::vector<int64_t> times = gather(std::vector<int64_t>{enter, leave});
  int64_t last_enter = 0, first_leave = INT64_MAX;
  for (int r = 0; r < g_comm->size(); ++r) {
    last_enter = std::max(last_enter, times[2 * size_t(r)]);
    first_leave = std::min(first_leave, times[2 * size_t(r) + 1]);
  }
  if (one_host) {
    EXPECT_LE(last_enter, first_leave);
  }
}

TEST(Communicator, WarmCallsAllocateNothing) {
  const int N = g_comm->size();
  std::vector<float> floats = contributions(g_comm->rank(), 4097);
  std::vector<std::byte> in(64), out(64 * size_t(N)), send(size_t(N) * 8), recv(size_t(N) * 8);
  const std::vector<size_t> counts(size_t(N), 8);
  must(g_comm->all_reduce_sum(floats));  // warms the scratch
  g_allocs = 0;
  g_count_allocs = true;
  Result<void> r[6];
  r[0] = g_comm->all_reduce_sum(floats);
  r[1] = g_comm->all_reduce_sum(std::span(floats).first(100));
  r[2] = g_comm->all_gather(in, out);
  r[3] = g_comm->all_to_all_v(send, counts, recv, counts);
  r[4] = g_comm->broadcast(in, N - 1);
  r[5] = g_comm->barrier();
  g_count_allocs = false;
  for (auto& x : r) must(std::move(x));
  EXPECT_EQ(g_allocs.load(), 0);
}

TEST(Communicator, MakeCommunicatorNamesWhatIsWrong) {
  auto bad = make_communicator("nccl2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("local, mpi"), std::string::npos) << bad.error().message;
  if (!built_with_mpi()) {
    auto mpi = make_communicator("mpi");
    ASSERT_FALSE(mpi.ok());
    EXPECT_NE(mpi.error().message.find("built without MPI"), std::string::npos)
        << mpi.error().message;
  }
  auto local = make_communicator("local");
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ((*local)->size(), 1);
  EXPECT_EQ((*local)->rank(), 0);
}

// The nccl communicator's all-reduce gathers every rank's vector and adds
// them with ordered_sum_element on the GPU: the same bits as the contract's
// reference, for 1 to 8 ranks (checked here on the CPU, which compiles the
// same header).
TEST(Communicator, NcclOrderedSumIsTheRankOrderSum) {
  const size_t n = 1000;
  for (int ranks = 1; ranks <= 8; ++ranks) {
    std::vector<float> parts;
    for (int r = 0; r < ranks; ++r) {
      const auto c = contributions(r, n);
      parts.insert(parts.end(), c.begin(), c.end());
    }
    std::vector<float> got(n);
    for (size_t i = 0; i < n; ++i) got[i] = ordered_sum_element(parts.data(), ranks, n, i);
    EXPECT_EQ(first_bit_difference(got, rank_order_sum(n, ranks)), -1) << ranks << " ranks";
  }
  auto nccl = make_communicator("nccl");
  if (!nccl.ok()) {  // a build without CUDA, or no GPU here
    EXPECT_NE(nccl.error().message.find("nccl"), std::string::npos) << nccl.error().message;
  }
}

TEST(Communicator, ASecondMpiCommunicatorSharesTheRuntime) {
  if (std::string(g_comm->name()) != "mpi") GTEST_SKIP() << "not under mpirun";
  // Made and dropped by every rank together (freeing it is collective);
  // MPI stays up for the first, which still works after.
  {
    auto second = make_communicator("mpi");
    if (!second.ok()) {
      ADD_FAILURE() << second.error().message;
      g_comm->abort(2);
    }
    EXPECT_EQ((*second)->size(), g_comm->size());
    EXPECT_EQ((*second)->rank(), g_comm->rank());
    std::vector<float> v = contributions(g_comm->rank(), 33);
    must((*second)->all_reduce_sum(v));
    EXPECT_EQ(first_bit_difference(v, rank_order_sum(33, g_comm->size())), -1);
  }
  must(g_comm->barrier());
}

// Failures on ranks other than 0, whose default printer is off so that the
// log is one rank's, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace kvant::dist

int main(int argc, char** argv) {
  using namespace kvant::dist;
  ::testing::InitGoogleTest(&argc, argv);
  auto made = make_communicator(launched_by_mpirun() ? "mpi" : "local");
  if (!made.ok()) {
    std::fprintf(stderr, "communicator_test: %s\n", made.error().message.c_str());
    return 1;
  }
  std::unique_ptr<Communicator> comm = std::move(made.value());
  g_comm = comm.get();
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(comm->rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // The job's verdict on every rank: one rank's failure fails them all.
  const std::vector<int> all = gather(std::vector<int>{failed});
  const int any = *std::max_element(all.begin(), all.end());
  g_comm = nullptr;
  comm.reset();  // finalises MPI
  return any;
}
