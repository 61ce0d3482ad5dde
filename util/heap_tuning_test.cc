#include "util/heap_tuning.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"

namespace bnps::util {
namespace {

constexpr size_t kBlockBytes = size_t{8} << 20;

// Minor page faults of the calling thread so far.
long ThreadFaults() {
  rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Page faults taken while allocating a block and writing all of it.
long FaultsToFill(void** block) {
  const long before = ThreadFaults();
  *block = std::malloc(kBlockBytes);
  if (*block == nullptr) return -1;
  std::memset(*block, 1, kBlockBytes);
  // The compiler must not drop the writes or the allocation.
  asm volatile("" : : "r"(*block) : "memory");
  return ThreadFaults() - before;
}

TEST(KeepFreedHeapTest, RejectsNegative) {
  EXPECT_EQ(KeepFreedHeap(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KeepFreedHeapTest, ZeroChangesNothing) {
  EXPECT_TRUE(KeepFreedHeap(0).ok());
}

// What the tuning is for: a block freed and taken again (as gRPC's read
// buffers are, on its own threads) reuses the same memory instead of faulting
// fresh pages in. With glibc's defaults the first free of a block this large
// hands its pages back (it had pages of its own), so the second fill faults
// them all in again; this process is fresh, so no earlier free raised the
// adaptive threshold.
TEST(KeepFreedHeapTest, FreedBlockIsReusedWithoutFaults) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer's allocator ignores the settings";
#endif
  ASSERT_TRUE(KeepFreedHeap(int64_t{64} << 20).ok());
  long first = -1, second = -1;
  std::thread t([&] {
    void* block = nullptr;
    first = FaultsToFill(&block);
    std::free(block);
    second = FaultsToFill(&block);
    std::free(block);
  });
  t.join();
  const long pages = static_cast<long>(kBlockBytes / 4096);
  // The first fill brings the pages in (transparent huge pages may bring
  // several at once, so only "some").
  EXPECT_GT(first, 0);
  // The second reuses them: a few faults at most, not one per page.
  EXPECT_LT(second, pages / 16) << "first fill: " << first << " faults";
}

}  // namespace
}  // namespace bnps::util
