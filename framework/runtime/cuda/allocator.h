// The CUDA backend's caching allocator, one per device. Freed blocks go to a free list by
// size and are handed out again, so a steady training step asks cudaMalloc for nothing.
//
// Every kernel runs on the device's compute stream, so a block freed while queued kernels
// still read it may be handed to the next compute-stream user at once: the stream orders
// them. The copy stream is not ordered with it: a block records an event on the compute
// stream when it is freed, and copy_in waits for that event (wait_until_free) before writing.
//
// Out of memory: the cache is emptied and cudaMalloc tried again; if that fails too, a
// loom::Error names the bytes asked for, what the pool holds and what the device has free.
#pragma once

#include "runtime/storage.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace loom::runtime::cuda {

class DeviceAllocator {
 public:
  DeviceAllocator(Device device, cudaStream_t compute);
  ~DeviceAllocator();

  // Thread-safe. Blocks are 256-byte aligned; bytes() is the block's rounded size.
  std::shared_ptr<Storage> allocate(std::size_t bytes);
  // Makes `copy_stream` wait until the kernels that read `s` before it was last freed have run.
  void wait_until_free(const Storage& s, cudaStream_t copy_stream);
  // Frees the cached blocks (after the queued kernels that may still read them).
  void empty_cache();

  struct Stats {
    std::size_t in_use = 0, cached = 0, peak_in_use = 0;
  };
  Stats stats() const;

 private:
  class Block;
  void release(void* data, std::size_t bytes, cudaEvent_t freed);
  void free_cached_locked();

  Device device_;
  cudaStream_t compute_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, std::pair<void*, cudaEvent_t>> free_;  // by size
  std::vector<cudaEvent_t> spare_events_;
  Stats stats_;
};

}  // namespace loom::runtime::cuda
