// Counting the executor's heap allocations. A steady-state training step should allocate
// nothing on the device: every buffer comes from the caching allocator or the program's arena,
// kernels reuse per-thread scratch, and GEMMs pack into that scratch. This counter is how
// that is checked: the backend records each program run's count as the ExecuteHeapAlloc
// metric.
//
//   HeapCount counting;            // this thread's allocations now count, until scope exit
//   int64_t before = heap_allocations();
//   ... run a program ...
//   int64_t n = heap_allocations() - before;
//
// Every call of malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign, valloc and
// pvalloc (operator new and Eigen reach the heap through these) is counted while the calling
// thread is inside a HeapCount scope: the device thread while it runs a program, and any
// thread while it runs a kernel's parallel_range task. Allocations of other threads (the host
// tracing the next step, a data loader) are not counted. The functions are glibc's, called
// through their __libc_ entry points (free too, so that every block stays glibc's).
//
// The counter lives in loom_framework; the malloc wrappers that feed it do not. They are in
// heap_count_malloc.cpp, the OBJECT library loom_heap_count, which only the test binaries and
// the benchmarks link: a program that links loom keeps its own allocator (glibc's, jemalloc,
// tcmalloc) untouched, and its ExecuteHeapAlloc metric stays 0. heap_counting_supported()
// is true only in a program that links loom_heap_count on glibc.
//
// A library that loom calls may allocate inside its own work in a way loom cannot avoid
// (oneDNN builds a map of its arguments at every execute: onednn.h). Such a call runs in a
// LibraryHeapScope: its allocations count apart, in library_heap_allocations() (the metric
// ExecuteHeapAllocLibrary), so that ExecuteHeapAlloc stays the count of loom's own.
#pragma once

#include <cstdint>

namespace loom::runtime {

class HeapCount {
 public:
  HeapCount();
  ~HeapCount();
  HeapCount(const HeapCount&) = delete;
  HeapCount& operator=(const HeapCount&) = delete;
};

// Inside this scope (nested in a HeapCount one), this thread's allocations are the
// library's: counted by library_heap_allocations(), not by heap_allocations().
class LibraryHeapScope {
 public:
  LibraryHeapScope();
  ~LibraryHeapScope();
  LibraryHeapScope(const LibraryHeapScope&) = delete;
  LibraryHeapScope& operator=(const LibraryHeapScope&) = delete;
};

// Allocations counted since the process started (all threads together), loom's own.
int64_t heap_allocations();
// Allocations inside a LibraryHeapScope (and a HeapCount scope) since the process started.
int64_t library_heap_allocations();
// Whether the malloc wrappers (loom_heap_count) are linked into this program.
bool heap_counting_supported();

// Whether this build leaves the wrappers out: under AddressSanitizer or ThreadSanitizer, whose
// allocators replace glibc's (heap_count_malloc.cpp). Tests that need the counter skip there,
// with a line.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerAllocator = true;
#else
inline constexpr bool kSanitizerAllocator = false;
#endif
inline constexpr const char* kSanitizerAllocatorSkip =
    "built with a sanitizer whose allocator replaces glibc's: no heap counting";

namespace detail {
// Called by the wrappers on every allocation: counts it when this thread is inside a
// HeapCount scope. Never allocates.
void note_allocation() noexcept;
}  // namespace detail

}  // namespace loom::runtime
