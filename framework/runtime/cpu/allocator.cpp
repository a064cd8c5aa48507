#include "runtime/cpu/allocator.h"

#include "ir/setting.h"

#include <loom/error.h>
#include <loom/metrics.h>

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::runtime {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kMinBlock = 64;

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free;  // size class -> blocks
};

Cache& cache() {
  static auto* c = new Cache;  // leaked: storages may die during static destruction
  return *c;
}

std::size_t size_class(std::size_t bytes) { return std::bit_ceil(std::max(bytes, kMinBlock)); }

// Blocks of a huge page and more start on a huge page and are advised for transparent huge
// pages (madvise MADV_HUGEPAGE; Debian's default THP mode, "madvise", gives them only to
// memory so advised): a step's large tensors then take one TLB entry per 2 MB instead of 512.
// Measured on the 2-core EPYC (Zen 3, 2026-11-28) in one process, buffers advised and not
// advised alternated call by call (12 to 30 calls each): oneDNN's float32 GEMMs at the
// decoder's shapes 0.1-6% faster by median in eight comparisons ([2048,512] x [512,8192]
// 117.8 vs 125.5 ms), a two-thread y = 1.5 x + 1 over 64 MB 7.5 vs 8.3-8.5 ms. Whole training steps moved more than
// that between runs on that shared machine. LOOM_HUGE_PAGES=0 leaves every block on the
// system's default pages.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

bool huge_pages() {
  static const bool on = ir::env_setting("LOOM_HUGE_PAGES", "1", {"0", "1"}) == "1";
  return on;
}

void* system_alloc(std::size_t cls) {
  const bool huge = cls >= kHugePage && huge_pages();
  void* p = std::aligned_alloc(huge ? kHugePage : kAlignment, cls);
#ifdef MADV_HUGEPAGE
  if (p && huge) madvise(p, cls, MADV_HUGEPAGE);  // advice: where refused, plain pages serve
#endif
  return p;
}

// The shared_ptr control blocks (with the Storage in them) are recycled too: a freed one goes
// on a free list and the next allocate() takes it, so handing out a buffer never reaches the
// heap once the first steps have run (heap_count.h).
template <class T>
struct NodePool {
  std::mutex mutex;
  std::vector<void*> free;
};

template <class T>
NodePool<T>& node_pool() {
  static auto* pool = new NodePool<T>;  // leaked, like the cache
  return *pool;
}

template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) {}

  T* allocate(std::size_t n) {
    if (n == 1) {
      auto& pool = node_pool<T>();
      std::lock_guard lock(pool.mutex);
      if (!pool.free.empty()) {
        void* p = pool.free.back();
        pool.free.pop_back();
        return static_cast<T*>(p);
      }
    }
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) {
    if (n != 1) return std::allocator<T>().deallocate(p, n);
    auto& pool = node_pool<T>();
    std::lock_guard lock(pool.mutex);
    pool.free.push_back(p);
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const { return true; }
};

class CpuStorage final : public Storage {
 public:
  CpuStorage(void* data, std::size_t bytes) : Storage(data, bytes, Device{}) {}
  ~CpuStorage() override {
    auto& c = cache();
    std::lock_guard lock(c.mutex);
    c.free[bytes()].push_back(data());
  }
};

std::shared_ptr<Storage> make_storage(void* data, std::size_t bytes) {
  return std::allocate_shared<CpuStorage>(PoolAllocator<CpuStorage>(), data, bytes);
}

}  // namespace

std::shared_ptr<Storage> allocate(std::size_t bytes) {
  std::size_t cls = size_class(bytes);
  auto& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free.find(cls);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      metrics::increment("AllocatorCacheHit", Device{});
      return make_storage(p, cls);
    }
  }
  void* p = system_alloc(cls);
  if (!p) {
    empty_cache();
    p = system_alloc(cls);
  }
  if (!p) throw Error("allocator: out of memory allocating " + std::to_string(cls) + " bytes");
  metrics::increment("AllocatorSystemAlloc", Device{});
  return make_storage(p, cls);
}

void empty_cache() {
  auto& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [cls, blocks] : c.free)
    for (void* p : blocks) std::free(p);
  c.free.clear();
}

}  // namespace loom::runtime
