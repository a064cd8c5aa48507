// The backend interface: deliberately narrow (alloc, copy in, copy out, supports, compile,
// execute), so another device plugs in behind it. Execution is asynchronous: execute()
// queues and returns; output buffers become readable when their Completion is signalled.
#pragma once

#include "ir/program.h"
#include "runtime/buffer.h"

#include <loom/dtype.h>

#include <functional>
#include <memory>
#include <vector>

namespace loom::runtime {

class Executable {
 public:
  virtual ~Executable() = default;
};

using BufferList = std::vector<std::shared_ptr<DeviceBuffer>>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  virtual std::shared_ptr<Storage> alloc(std::size_t bytes) = 0;
  virtual void copy_in(const void* host, Storage& dst, std::size_t bytes) = 0;
  virtual void copy_out(const Storage& src, void* host, std::size_t bytes) = 0;
  virtual bool supports(ir::Op op, DType dtype) const = 0;
  virtual std::shared_ptr<const Executable> compile(ir::Program program) = 0;
  // Queues `exe` over `inputs` (in Program::inputs order); fills `outputs` when it runs.
  virtual void execute(std::shared_ptr<const Executable> exe, BufferList inputs,
                       BufferList outputs) = 0;
  // Runs `fn` on the device thread after everything queued so far.
  virtual void enqueue_callback(std::function<void()> fn) = 0;
  virtual void synchronize() = 0;

  // Test hooks.
  virtual void hold_queue() = 0;
  virtual void release_queue() = 0;
  virtual int pending_programs() const = 0;
};

Backend& backend(Device device);

}  // namespace loom::runtime
