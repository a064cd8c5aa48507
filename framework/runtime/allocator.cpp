#include "runtime/allocator.h"

#include <loom/error.h>
#include <loom/metrics.h>

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

}  // namespace

Storage::~Storage() {
  auto& c = cache();
  std::lock_guard lock(c.mutex);
  c.free[bytes_].push_back(data_);
}

std::shared_ptr<Storage> allocate(std::size_t bytes) {
  std::size_t cls = size_class(bytes);
  auto& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free.find(cls);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      metrics::increment("AllocatorCacheHit");
      return std::make_shared<Storage>(p, cls);
    }
  }
  void* p = std::aligned_alloc(kAlignment, cls);
  if (!p) {
    empty_cache();
    p = std::aligned_alloc(kAlignment, cls);
  }
  if (!p) throw Error("allocator: out of memory allocating " + std::to_string(cls) + " bytes");
  metrics::increment("AllocatorSystemAlloc");
  return std::make_shared<Storage>(p, cls);
}

void empty_cache() {
  auto& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [cls, blocks] : c.free)
    for (void* p : blocks) std::free(p);
  c.free.clear();
}

}  // namespace loom::runtime
