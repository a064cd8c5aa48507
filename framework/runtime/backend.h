// The backend contract: what a device gives the engine, and nothing else. Eleven methods, in
// four groups: memory (alloc, alloc_host, empty_cache), copies (copy_in, copy_out, copy),
// compilation (target, compile) and execution (execute, enqueue_callback, synchronize). A
// backend lives in its own folder below runtime/ and is registered once (runtime/registry.h).
//
// Execution is asynchronous: execute() queues and returns; output buffers become readable
// when their Completion is signalled. Programs and callbacks run in the order queued, so a
// program always finds its inputs computed. Copies are synchronous on the calling thread and
// touch only storage that no queued work writes: the caller waits for a buffer's Completion
// before copying out of it.
#pragma once

#include "ir/program.h"
#include "ir/target.h"
#include "runtime/buffer.h"
#include "runtime/storage.h"

#include <loom/error.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <vector>

namespace loom::runtime {

// A compiled program, as the backend keeps it between runs.
class Executable {
 public:
  virtual ~Executable() = default;
};

using BufferList = std::vector<std::shared_ptr<DeviceBuffer>>;

class Backend {
 public:
  virtual ~Backend() = default;

  // Memory of this device, freed by the Storage's last reference; throws loom::Error when
  // the device has none left.
  virtual std::shared_ptr<Storage> alloc(std::size_t bytes) = 0;
  // Host memory to copy_in from: what this device copies fastest. Any thread may drop the last
  // reference, which frees the block or gives it back to the backend for reuse. copy_in takes
  // any host address; one inside such a block it may copy more directly (the CUDA backend
  // hands out page-locked blocks and copies them with one transfer, no staging). The default:
  // plain memory aligned to kHostAlignment, which the CPU needs nothing better than.
  static constexpr std::size_t kHostAlignment = 64;
  virtual std::shared_ptr<void> alloc_host(std::size_t bytes) {
    constexpr std::align_val_t align{kHostAlignment};
    return std::shared_ptr<void>(::operator new(bytes > 0 ? bytes : 1, align),
                                 [align](void* p) { ::operator delete(p, align); });
  }
  // Gives the memory no Storage holds (cached blocks) back to the device or the system.
  virtual void empty_cache() = 0;

  virtual void copy_in(const void* host, Storage& dst, std::size_t bytes) = 0;
  virtual void copy_out(const Storage& src, void* host, std::size_t bytes) = 0;
  // Into `dst` (this backend's) from `src` on any device. Returns false, copying nothing,
  // when this backend cannot reach src's memory; the caller then goes through the host.
  virtual bool copy(const Storage& src, Storage& dst, std::size_t bytes) = 0;

  // What this device runs and which rewrites its kernels take (ir/target.h).
  virtual const ir::Target& target() const = 0;
  // A Program compiled for target(); kept by the engine's compile cache.
  virtual std::shared_ptr<const Executable> compile(ir::Program program) = 0;

  // Queues `exe` over `inputs` (in Program::inputs order); fills `outputs` when it runs.
  virtual void execute(std::shared_ptr<const Executable> exe, BufferList inputs,
                       BufferList outputs) = 0;
  // Runs `fn` on the device thread after everything queued so far.
  virtual void enqueue_callback(std::function<void()> fn) = 0;
  // Waits until everything queued so far has run.
  virtual void synchronize() = 0;
};

// alloc(bytes), an allocation failure rethrown naming what the bytes were for
// (ir::allocation_str: an instruction's result, or with `in` null a program's arena).
template <class Alloc>
std::shared_ptr<Storage> allocate_for(const ir::Instr* in, std::size_t bytes, Alloc&& alloc) {
  try {
    return alloc(bytes);
  } catch (const Error& e) {
    throw Error(ir::allocation_str(in, bytes) + ": " + e.what());
  }
}

}  // namespace loom::runtime
