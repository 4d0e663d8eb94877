// AlignedBuffer: small buffers from aligned_alloc, large ones mapped with
// 2 MiB alignment for transparent huge pages; zeroed and usable either way.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/aligned.h"

namespace kvant {
namespace {

TEST(AlignedBuffer, SmallAndLargeAreAlignedZeroedAndWritable) {
  for (size_t n : {size_t(1), size_t(1000), kHugeBytes - 1, kHugeBytes, kHugeBytes + 1,
                   3 * kHugeBytes + 12345}) {
    const int64_t mapped0 = detail::mapped_allocs.load();
    AlignedBuffer<uint8_t> b(n);
    ASSERT_EQ(b.size(), n);
    const auto addr = reinterpret_cast<uintptr_t>(b.data());
    EXPECT_EQ(addr % 64, 0u) << n;
    const bool large = n >= kHugeBytes;
#if defined(__linux__)
    EXPECT_EQ(detail::mapped_allocs.load() - mapped0, large ? 1 : 0) << n;
    if (large) {
      EXPECT_EQ(addr % kHugeBytes, 0u) << n;
    }
#else
    (void)mapped0;
    (void)large;
#endif
    for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(b[i], 0) << n << " at " << i;
    ASSERT_EQ(b[n - 1], 0);
    std::memset(b.data(), 0xa5, n);  // the whole length is writable
    EXPECT_EQ(b[n - 1], 0xa5);
  }
}

// A mapped buffer costs at most 4 KiB past its length: the tail after the
// last whole 2 MiB stays in small pages instead of rounding up to 2 MiB.
TEST(AlignedBuffer, MappingIsNotRoundedUpToHugePages) {
#if defined(__linux__)
  EXPECT_EQ(detail::mapped_bytes(kHugeBytes - 1), 0u);
  EXPECT_EQ(detail::mapped_bytes(kHugeBytes), kHugeBytes);
  EXPECT_EQ(detail::mapped_bytes(kHugeBytes + 1), kHugeBytes + 4096);
  EXPECT_EQ(detail::mapped_bytes(7 * kHugeBytes / 2), 7 * kHugeBytes / 2);
#else
  GTEST_SKIP() << "mapped buffers are Linux-only";
#endif
}

TEST(AlignedBuffer, MovesAndReplacesWithoutLeakingMappings) {
  AlignedBuffer<float> a(kHugeBytes);  // 8 MiB of floats
  a[0] = 1.f;
  AlignedBuffer<float> b = std::move(a);
  EXPECT_EQ(b[0], 1.f);
  EXPECT_TRUE(a.empty() || a.data() == nullptr);
  for (int i = 0; i < 64; ++i) b = AlignedBuffer<float>(kHugeBytes / 2 + size_t(i));  // 64 remaps
  EXPECT_EQ(b.size(), kHugeBytes / 2 + 63);
  EXPECT_EQ(b[b.size() - 1], 0.f);
}

}  // namespace
}  // namespace kvant
