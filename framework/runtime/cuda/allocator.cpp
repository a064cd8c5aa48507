#include "runtime/cuda/allocator.h"

#include "runtime/cuda/cuda_check.h"

#include <loom/error.h>

#include <string>

namespace loom::runtime::cuda {
namespace {

// Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, so blocks of nearby sizes are
// interchangeable without wasting much; a cached block serves a request of up to its size
// when it is at most twice as large.
std::size_t round_size(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20;
  const std::size_t unit = bytes < (std::size_t{1} << 20) ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

std::string mib(std::size_t bytes) {
  return std::to_string(bytes / (1024.0 * 1024.0)).substr(0, 8) + " MiB";
}

}  // namespace

// A block handed out: returns itself to the allocator, with an event recorded on the
// compute stream, when its last reference goes.
class DeviceAllocator::Block final : public Storage {
 public:
  Block(DeviceAllocator& owner, void* data, std::size_t bytes, cudaEvent_t freed)
      : Storage(data, bytes, owner.device_), owner_(owner), freed_(freed) {}
  ~Block() override { owner_.release(data(), bytes(), freed_); }
  cudaEvent_t freed() const { return freed_; }

 private:
  DeviceAllocator& owner_;
  cudaEvent_t freed_;  // recorded when the block was last freed; may be unrecorded
};

DeviceAllocator::DeviceAllocator(Device device, cudaStream_t compute)
    : device_(device), compute_(compute) {}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard lock(mutex_);
  free_cached_locked();
}

std::shared_ptr<Storage> DeviceAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  check(cudaSetDevice(device_.index), "cudaSetDevice");
  if (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size) {
    auto [data, event] = it->second;
    const std::size_t got = it->first;
    free_.erase(it);
    stats_.cached -= got;
    stats_.in_use += got;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return std::make_shared<Block>(*this, data, got, event);
  }
  void* data = nullptr;
  cudaError_t status = cudaMalloc(&data, size);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    free_cached_locked();
    status = cudaMalloc(&data, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error("cuda:" + std::to_string(device_.index) + ": out of device memory allocating " +
                std::to_string(bytes) + " bytes: loom's pool holds " + mib(stats_.in_use) +
                " in use (peak " + mib(stats_.peak_in_use) + "), the device has " +
                mib(free_bytes) + " free of " + mib(total));
  }
  check(status, "cudaMalloc");
  cudaEvent_t event = nullptr;
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else {
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  }
  stats_.in_use += size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return std::make_shared<Block>(*this, data, size, event);
}

void DeviceAllocator::release(void* data, std::size_t bytes, cudaEvent_t freed) {
  std::lock_guard lock(mutex_);
  cudaSetDevice(device_.index);
  // Whatever the compute stream has queued up to now may still read the block.
  cudaEventRecord(freed, compute_);
  free_.emplace(bytes, std::make_pair(data, freed));
  stats_.in_use -= bytes;
  stats_.cached += bytes;
}

void DeviceAllocator::wait_until_free(const Storage& s, cudaStream_t copy_stream) {
  const auto& block = static_cast<const Block&>(s);
  check(cudaStreamWaitEvent(copy_stream, block.freed(), 0), "cudaStreamWaitEvent");
}

void DeviceAllocator::free_cached_locked() {
  if (free_.empty()) return;
  cudaSetDevice(device_.index);
  // cudaFree waits for the device; the kernels that last read these blocks finish first.
  for (auto& [size, block] : free_) {
    cudaFree(block.first);
    spare_events_.push_back(block.second);
  }
  free_.clear();
  stats_.cached = 0;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  free_cached_locked();
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace loom::runtime::cuda
