// The counter side of heap_count.h; the malloc wrappers that call note_allocation() are in
// heap_count_malloc.cpp (the loom_heap_count OBJECT library, not part of loom_framework).
#include "runtime/cpu/heap_count.h"

#include <atomic>

// Defined by heap_count_malloc.cpp. Weak: a program without the wrappers links, and the
// address is then null (an OBJECT library is linked whole, so the definition is there
// whenever the wrappers are).
extern "C" __attribute__((weak)) void loom_heap_count_wrappers_linked();

namespace loom::runtime {
namespace {

std::atomic<int64_t> g_allocations{0};
std::atomic<int64_t> g_library_allocations{0};
// initial-exec: reading them never allocates (malloc cannot depend on a lazily made TLS block).
__attribute__((tls_model("initial-exec"))) thread_local int t_depth = 0;
__attribute__((tls_model("initial-exec"))) thread_local int t_library_depth = 0;

// A breakpoint here (gdb: break loom::runtime::(anonymous namespace)::counted) stops at each
// counted allocation, with the allocating code on the stack.
__attribute__((noinline)) void counted() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  asm volatile("");  // keeps the call: the breakpoint needs a frame
}

}  // namespace

HeapCount::HeapCount() { ++t_depth; }
HeapCount::~HeapCount() { --t_depth; }
LibraryHeapScope::LibraryHeapScope() { ++t_library_depth; }
LibraryHeapScope::~LibraryHeapScope() { --t_library_depth; }

int64_t heap_allocations() { return g_allocations.load(std::memory_order_relaxed); }
int64_t library_heap_allocations() {
  return g_library_allocations.load(std::memory_order_relaxed);
}

bool heap_counting_supported() { return loom_heap_count_wrappers_linked != nullptr; }

void detail::note_allocation() noexcept {
  if (t_depth == 0) return;
  if (t_library_depth > 0) g_library_allocations.fetch_add(1, std::memory_order_relaxed);
  else counted();
}

}  // namespace loom::runtime
