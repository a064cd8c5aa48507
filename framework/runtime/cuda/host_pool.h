// Page-locked host memory for Backend::alloc_host, one pool per device. The DeviceLoader
// collates every batch into such blocks; copy_in copies a source that lies inside one with a
// single cudaMemcpyAsync on the copy stream (a pageable source goes through the staging
// buffer instead, one memcpy more).
//
// cudaHostAlloc is slow (it maps and locks pages), so a block whose last reference goes is
// kept by its size class and handed out again: a loader's steady epochs reuse the same few
// blocks and allocate none. The cache is bounded: allocate() frees cached blocks beyond
// kMaxCachedBytes before it asks CUDA for a new one, and empty_cache() frees them all.
// A block's deleter only does bookkeeping (it may run on any thread, inside a destructor),
// so every CUDA call happens in allocate() or empty_cache(), where its error can be thrown.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace loom::runtime::cuda {

class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  static constexpr std::size_t kMaxCachedBytes = std::size_t{256} << 20;

  // Blocks' deleters hold the pool: make it with std::make_shared.
  explicit HostPool(int device_index);
  // Frees the cached blocks (no block is in use: each holds the pool).
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Thread-safe. At least `bytes` (the size class's bytes), page-locked; throws loom::Error
  // naming CUDA's message when none can be had.
  std::shared_ptr<void> allocate(std::size_t bytes);
  // Whether [p, p + bytes) lies inside one block handed out and not yet given back.
  bool contains(const void* p, std::size_t bytes) const;
  // Frees the cached blocks (those in use stay).
  void empty_cache();

  // The bytes a request takes: at least 4 KiB, rounded up to a quarter of its power of two
  // (at most 25% more than asked for), so that nearby sizes share blocks.
  static std::size_t size_class(std::size_t bytes);

 private:
  void release(void* p) noexcept;
  // Frees cached blocks, largest first, until at most `keep` bytes stay cached.
  void trim_locked(std::size_t keep);

  const int device_index_;
  mutable std::mutex mutex_;
  std::map<const char*, std::size_t> in_use_;   // handed out: address → size class
  std::multimap<std::size_t, void*> cached_;    // given back: size class → address
  std::size_t cached_bytes_ = 0;
};

}  // namespace loom::runtime::cuda
