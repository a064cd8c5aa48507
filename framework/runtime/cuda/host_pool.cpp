#include "runtime/cuda/host_pool.h"

#include "runtime/cuda/cuda_check.h"

#include <bit>
#include <cstdlib>
#include <iterator>

namespace loom::runtime::cuda {

HostPool::HostPool(int device_index) : device_index_(device_index) {}

HostPool::~HostPool() {
  // Not checked: a destructor must not throw, and at exit the CUDA runtime may be unloading.
  for (const auto& [size, p] : cached_) cudaFreeHost(p);
  cudaGetLastError();
}

std::size_t HostPool::size_class(std::size_t bytes) {
  constexpr std::size_t kMin = 4096;
  if (bytes <= kMin) return kMin;
  const std::size_t step = std::bit_floor(bytes) / 4;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<void> HostPool::allocate(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  void* p = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (auto it = cached_.find(size); it != cached_.end()) {
      p = it->second;
      cached_.erase(it);
      cached_bytes_ -= size;
    } else {
      trim_locked(kMaxCachedBytes);
    }
  }
  if (!p) {
    check(cudaSetDevice(device_index_), "cudaSetDevice");
    if (cudaHostAlloc(&p, size, cudaHostAllocDefault) != cudaSuccess) {
      // Out of page-locked memory: give the cached blocks back and try once more.
      cudaGetLastError();
      p = nullptr;
      empty_cache();
      check(cudaHostAlloc(&p, size, cudaHostAllocDefault), "cudaHostAlloc (host block)");
    }
  }
  {
    std::lock_guard lock(mutex_);
    in_use_.emplace(static_cast<const char*>(p), size);
  }
  return std::shared_ptr<void>(p, [pool = shared_from_this()](void* q) { pool->release(q); });
}

bool HostPool::contains(const void* p, std::size_t bytes) const {
  const auto* c = static_cast<const char*>(p);
  std::lock_guard lock(mutex_);
  auto it = in_use_.upper_bound(c);  // the first block starting after c
  if (it == in_use_.begin()) return false;
  --it;
  const std::size_t size = it->second;
  return c >= it->first && bytes <= size && static_cast<std::size_t>(c - it->first) <= size - bytes;
}

void HostPool::empty_cache() {
  std::lock_guard lock(mutex_);
  trim_locked(0);
}

void HostPool::release(void* p) noexcept {
  std::lock_guard lock(mutex_);
  auto it = in_use_.find(static_cast<const char*>(p));
  if (it == in_use_.end()) std::abort();  // only allocate()'s deleter calls this
  const std::size_t size = it->second;
  in_use_.erase(it);
  cached_.emplace(size, p);
  cached_bytes_ += size;
}

void HostPool::trim_locked(std::size_t keep) {
  if (cached_bytes_ <= keep) return;
  check(cudaSetDevice(device_index_), "cudaSetDevice");
  while (cached_bytes_ > keep) {
    auto it = std::prev(cached_.end());
    const auto [size, p] = *it;
    cached_.erase(it);
    cached_bytes_ -= size;
    check(cudaFreeHost(p), "cudaFreeHost (host block)");
  }
}

}  // namespace loom::runtime::cuda
