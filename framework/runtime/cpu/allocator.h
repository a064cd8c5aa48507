// A caching allocator: freed blocks go to a free list per size class (powers of two) and
// are handed out again, so a steady training step allocates nothing from the system.
#pragma once

#include <cstddef>
#include <memory>

namespace loom::runtime {

class Storage {
 public:
  Storage(void* data, std::size_t bytes) : data_(data), bytes_(bytes) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_;
  std::size_t bytes_;  // the size class, not the requested size
};

// Thread-safe. Blocks are 64-byte aligned.
std::shared_ptr<Storage> allocate(std::size_t bytes);

// Returns cached blocks to the system.
void empty_cache();

}  // namespace loom::runtime
