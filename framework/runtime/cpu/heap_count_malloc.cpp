// glibc's malloc family, wrapped to feed the heap counter (heap_count.h). Built as the OBJECT
// library loom_heap_count and linked only into the test binaries and the benchmarks, never
// into loom_framework: defining malloc replaces the allocator of the whole program.
#include "runtime/cpu/heap_count.h"

#include <cerrno>
#include <cstddef>

// Not under AddressSanitizer or ThreadSanitizer, whose allocators replace glibc's (their blocks
// would reach glibc's free): there heap counting is off (heap_counting_supported() is false).
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// glibc lets a program define these to wrap its allocator (the GNU C Library manual,
// "Replacing malloc"); blocks still come from glibc, so glibc's free, malloc_usable_size and
// the rest work on them unchanged.
extern "C" {
// Its presence is what heap_counting_supported() checks.
void loom_heap_count_wrappers_linked() {}

void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);
void* __libc_pvalloc(std::size_t);
void __libc_free(void*);

using loom::runtime::detail::note_allocation;

// free is defined too, so that every block is glibc's even when another allocator is
// preloaded (LD_PRELOAD of jemalloc or tcmalloc would otherwise free glibc's blocks).
void free(void* p) noexcept { __libc_free(p); }

void* malloc(std::size_t n) noexcept {
  note_allocation();
  return __libc_malloc(n);
}

void* calloc(std::size_t count, std::size_t n) noexcept {
  note_allocation();
  return __libc_calloc(count, n);
}

void* realloc(void* p, std::size_t n) noexcept {
  note_allocation();
  return __libc_realloc(p, n);
}

void* memalign(std::size_t alignment, std::size_t n) noexcept {
  note_allocation();
  return __libc_memalign(alignment, n);
}

void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
  note_allocation();
  return __libc_memalign(alignment, n);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t n) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  note_allocation();
  void* p = __libc_memalign(alignment, n);
  if (!p && n != 0) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(std::size_t n) noexcept {
  note_allocation();
  return __libc_valloc(n);
}

void* pvalloc(std::size_t n) noexcept {
  note_allocation();
  return __libc_pvalloc(n);
}
}  // extern "C"
#endif
