#include "runtime/buffer.h"

#include <loom/error.h>

namespace loom::runtime {

void Completion::set_done() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
}

void Completion::set_failed(std::string message) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(message);
  }
  cv_.notify_all();
}

std::string Completion::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  return error_;
}

bool Completion::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

const Storage& DeviceBuffer::wait(const char* reader) const {
  auto error = ready->wait();
  if (!error.empty())
    throw Error(std::string(reader) + ": the device buffer of this tensor failed: " + error);
  return *storage;
}

std::shared_ptr<DeviceBuffer> ready_buffer(DType dtype, Shape shape, std::shared_ptr<Storage> storage) {
  auto ready = std::make_shared<Completion>();
  ready->set_done();
  return std::make_shared<DeviceBuffer>(DeviceBuffer{dtype, std::move(shape), std::move(ready), std::move(storage)});
}

std::string input_failed(const std::string& error) {
  static const std::string prefix = "an input of this step had failed: ";
  return error.compare(0, prefix.size(), prefix) == 0 ? error : prefix + error;
}

}  // namespace loom::runtime
