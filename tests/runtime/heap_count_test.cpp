// The executor's heap-allocation counter (heap_count.h): it counts what a thread allocates
// inside a HeapCount scope, nothing outside one, and survives a thread's nested scopes.
#include "runtime/cpu/heap_count.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace loom::runtime {
namespace {

// Opaque to the optimiser, so that an allocation whose result is unused still happens.
void* volatile g_sink;

// The test binaries link the wrappers (loom_heap_count); on glibc the counter must be live, or
// every ExecuteHeapAlloc check in the suite would pass by counting nothing.
TEST(HeapCount, WrappersAreLinkedIntoTheTests) {
#if defined(__GLIBC__)
  EXPECT_TRUE(heap_counting_supported());
#else
  GTEST_SKIP() << "the wrappers need glibc";
#endif
}

TEST(HeapCount, CountsAllocationsInsideAScopeOnly) {
  if (!heap_counting_supported()) GTEST_SKIP() << "the malloc wrappers (loom_heap_count) are not linked, or the C library is not glibc";
  int64_t before = heap_allocations();
  g_sink = new std::vector<int>(1000);  // two allocations (the vector, its elements), uncounted
  delete static_cast<std::vector<int>*>(g_sink);
  EXPECT_EQ(heap_allocations(), before);
  {
    HeapCount counting;
    before = heap_allocations();
    auto* v = new std::vector<int>(1000);
    g_sink = v;
    delete v;
    void* p = std::malloc(64);
    g_sink = p;
    std::free(p);
    void* q = nullptr;
    ASSERT_EQ(posix_memalign(&q, 64, 256), 0);
    std::free(q);
    EXPECT_EQ(heap_allocations() - before, 4);
    {
      HeapCount nested;
      auto u = std::make_unique<int>(3);
      g_sink = u.get();
    }
    EXPECT_EQ(heap_allocations() - before, 5);  // still counting after the nested scope
  }
  before = heap_allocations();
  g_sink = std::malloc(16);
  std::free(g_sink);
  EXPECT_EQ(heap_allocations(), before);
}

TEST(HeapCount, OtherThreadsAreNotCounted) {
  if (!heap_counting_supported()) GTEST_SKIP() << "the malloc wrappers (loom_heap_count) are not linked, or the C library is not glibc";
  HeapCount counting;
  const int64_t before = heap_allocations();
  std::thread other([] {
    for (int i = 0; i < 100; ++i) {
      void* p = std::malloc(32);
      g_sink = p;
      std::free(p);
    }
  });  // the std::thread's own state is allocated here, on this thread: one allocation
  const int64_t after_start = heap_allocations();
  other.join();
  EXPECT_EQ(heap_allocations(), after_start);
  EXPECT_LE(after_start - before, 2);
}

}  // namespace
}  // namespace loom::runtime
