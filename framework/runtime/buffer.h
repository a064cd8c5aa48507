// A device buffer: the (possibly future) value of a materialized tensor. mark_step hands out
// buffers at once; the program that fills them runs later on the device thread and signals
// their shared Completion. Readers wait on it; a failed program fails every buffer it owed.
#pragma once

#include "runtime/storage.h"

#include <loom/dtype.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace loom::runtime {

class Completion {
 public:
  void set_done();
  void set_failed(std::string message);
  // Waits; returns the failure message, or an empty string on success.
  std::string wait();
  bool done() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

// The failure of a program one of whose inputs failed with `error`: said once however many
// steps the failure passes through ("an input of this step had failed: <the first error>").
std::string input_failed(const std::string& error);

struct DeviceBuffer {
  DType dtype;
  Shape shape;
  std::shared_ptr<Completion> ready;
  std::shared_ptr<Storage> storage;  // set by the device thread before `ready` is signalled

  // Waits for the value; throws loom::Error naming `reader` if the producing program failed.
  const Storage& wait(const char* reader) const;
};

// A buffer whose value is in `storage` already (copied in, not computed): ready at once.
std::shared_ptr<DeviceBuffer> ready_buffer(DType dtype, Shape shape, std::shared_ptr<Storage> storage);

}  // namespace loom::runtime
