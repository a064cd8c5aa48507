// The executor's heap-allocation counter (heap_count.h): it counts what a thread allocates
// inside a HeapCount scope, nothing outside one, and survives a thread's nested scopes.
#include "runtime/cpu/heap_count.h"

#include "runtime/cpu/kernels_impl.h"  // parallel_range

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <atomic>
#include <set>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::runtime {
namespace {

// Opaque to the optimiser, so that an allocation whose result is unused still happens.
void* volatile g_sink;

// The test binaries link the wrappers (loom_heap_count); on glibc the counter must be live, or
// every ExecuteHeapAlloc check in the suite would pass by counting nothing.
TEST(HeapCount, WrappersAreLinkedIntoTheTests) {
  if (kSanitizerAllocator) GTEST_SKIP() << kSanitizerAllocatorSkip;
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

// A kernel's parallel tasks count on whichever thread runs them (parallel_range opens a
// HeapCount scope in each task): ExecuteHeapAlloc covers the worker threads, not only the
// device thread. Eight tasks allocate 100 times each; at least one runs on a TBB worker when
// the machine has two threads (asserted, so the test cannot pass on the calling thread alone).
TEST(HeapCount, KernelTasksCountOnEveryThread) {
  if (!heap_counting_supported()) GTEST_SKIP() << "the malloc wrappers (loom_heap_count) are not linked, or the C library is not glibc";
  std::mutex m;
  std::set<std::thread::id> threads;
  std::atomic<int> started{0};
  int64_t counted = 0;
  {
    HeapCount counting;
    const int64_t before = heap_allocations();
    parallel_range(8, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        ++started;
        // Hold every task until a second thread has taken one (or a while has passed).
        for (int spin = 0; spin < 2000; ++spin) {
          bool two = false;
          {
            std::lock_guard<std::mutex> lock(m);
            threads.insert(std::this_thread::get_id());
            two = threads.size() >= 2;
          }
          if (two) break;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        for (int k = 0; k < 100; ++k) {
          void* p = std::malloc(48);
          g_sink = p;
          std::free(p);
        }
      }
    });
    counted = heap_allocations() - before;
  }
  EXPECT_EQ(started.load(), 8);
  if (std::thread::hardware_concurrency() >= 2) {
    EXPECT_GE(threads.size(), 2u) << "every task ran on the calling thread: nothing was shown";
  }
  // The tasks' 800 allocations, wherever they ran (plus TBB's own bookkeeping and the set's
  // nodes): a worker thread's uncounted would leave at most 700.
  EXPECT_GE(counted, 800);
  EXPECT_LE(counted, 800 + 100);
}

}  // namespace
}  // namespace loom::runtime
