// Storage: a block of one device's memory, owned by the backend that allocated it. The last
// reference gives it back to that backend (its cache or its allocator), whatever thread drops
// it; nothing outside the backend knows how its memory is kept.
#pragma once

#include <loom/dtype.h>

#include <cstddef>

namespace loom::runtime {

class Storage {
 public:
  Storage(void* data, std::size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}
  virtual ~Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // The block's address on its device (a host address only for devices whose memory the
  // host can read; only the backend dereferences it).
  void* data() const { return data_; }
  // What the backend handed out: at least what was asked for.
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  std::size_t bytes_;
  Device device_;
};

}  // namespace loom::runtime
