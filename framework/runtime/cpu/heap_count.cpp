#include "runtime/cpu/heap_count.h"

#include <atomic>
#include <cerrno>
#include <cstddef>

namespace loom::runtime {
namespace {

std::atomic<int64_t> g_allocations{0};
// initial-exec: reading it never allocates (malloc cannot depend on a lazily made TLS block).
__attribute__((tls_model("initial-exec"))) thread_local int t_depth = 0;

// A breakpoint here (gdb: break loom::runtime::(anonymous namespace)::counted) stops at each
// counted allocation, with the allocating code on the stack.
__attribute__((noinline)) void counted() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  asm volatile("");  // keeps the call: the breakpoint needs a frame
}

inline void note() {
  if (t_depth > 0) counted();
}

}  // namespace

HeapCount::HeapCount() { ++t_depth; }
HeapCount::~HeapCount() { --t_depth; }

int64_t heap_allocations() { return g_allocations.load(std::memory_order_relaxed); }

#if defined(__GLIBC__) && LOOM_HEAP_COUNT
bool heap_counting_supported() { return true; }
#else
bool heap_counting_supported() { return false; }
#endif

}  // namespace loom::runtime

#if defined(__GLIBC__) && LOOM_HEAP_COUNT
// glibc lets a program define these to wrap its allocator (the GNU C Library manual,
// "Replacing malloc"); blocks still come from glibc, so glibc's free, malloc_usable_size and
// the rest work on them unchanged.
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);
void* __libc_pvalloc(std::size_t);
void __libc_free(void*);

// free is defined too, so that every block is glibc's even when another allocator is
// preloaded (LD_PRELOAD of jemalloc or tcmalloc would otherwise free glibc's blocks).
void free(void* p) noexcept { __libc_free(p); }

void* malloc(std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_malloc(n);
}

void* calloc(std::size_t count, std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_calloc(count, n);
}

void* realloc(void* p, std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_realloc(p, n);
}

void* memalign(std::size_t alignment, std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_memalign(alignment, n);
}

void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_memalign(alignment, n);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t n) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  loom::runtime::note();
  void* p = __libc_memalign(alignment, n);
  if (!p && n != 0) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_valloc(n);
}

void* pvalloc(std::size_t n) noexcept {
  loom::runtime::note();
  return __libc_pvalloc(n);
}
}  // extern "C"
#endif
