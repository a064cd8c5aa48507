#include "backend/guarded_backend.h"

#include "runtime/device_queue.h"
#include "runtime/registry.h"

#include <loom/error.h>
#include <loom/metrics.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

namespace loom::test {
namespace {

constexpr std::size_t kGuard = 64;       // bytes of guard band on each side
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned char kPoison = 0xFF;  // NaN as float/double, -1 as an integer
constexpr std::size_t kQuarantine = 64;  // freed blocks kept (poisoned) before the system gets them

std::atomic<int64_t> violations{0};
std::atomic<int64_t> alive{0};
std::atomic<int64_t> host_alive{0};
std::atomic<int64_t> host_made{0};
std::atomic<int64_t> host_copies{0};

void report(const char* what, Device device, std::size_t bytes) {
  ++violations;
  std::fprintf(stderr, "guarded backend: %s in a block of %zu bytes on %s\n", what, bytes,
               device_str(device).c_str());
}

bool all_bytes(const unsigned char* p, std::size_t n, unsigned char v) {
  return std::all_of(p, p + n, [v](unsigned char b) { return b == v; });
}

// One block: [guard][bytes][guard], allocated with malloc.
struct Block {
  unsigned char* base;
  std::size_t bytes;
  Device device;

  // A new block of `bytes` (`what` names them in the out-of-memory error), its guards set and
  // its bytes poisoned.
  static Block make(std::size_t bytes, Device device, const char* what) {
    auto* base = static_cast<unsigned char*>(std::malloc(bytes + 2 * kGuard));
    if (!base)
      throw Error("guarded: out of memory allocating " + std::to_string(bytes) + " " + what);
    Block b{base, bytes, device};
    std::memset(base, kGuardByte, kGuard);
    std::memset(b.data(), kPoison, bytes);
    std::memset(b.data() + bytes, kGuardByte, kGuard);
    return b;
  }

  unsigned char* data() const { return base + kGuard; }
  // Reports an overwritten guard once: the guard is restored after it is reported.
  void check_guards(const char* when) const {
    if (!all_bytes(base, kGuard, kGuardByte)) {
      report((std::string("the guard before the block was overwritten ") + when).c_str(), device, bytes);
      std::memset(base, kGuardByte, kGuard);
    }
    if (!all_bytes(data() + bytes, kGuard, kGuardByte)) {
      report((std::string("the guard after the block was overwritten ") + when).c_str(), device, bytes);
      std::memset(data() + bytes, kGuardByte, kGuard);
    }
  }
};

class Quarantine {
 public:
  void add(Block b) {
    std::lock_guard lock(mutex_);
    blocks_.push_back(b);
    while (blocks_.size() > kQuarantine) release_front();
  }
  void flush() {
    std::lock_guard lock(mutex_);
    while (!blocks_.empty()) release_front();
  }

 private:
  void release_front() {
    const Block& b = blocks_.front();
    b.check_guards("after it was freed");
    if (!all_bytes(b.data(), b.bytes, kPoison)) report("a write after free", b.device, b.bytes);
    std::free(b.base);
    blocks_.pop_front();
  }
  std::mutex mutex_;
  std::deque<Block> blocks_;
};

// Host memory for transfers (alloc_host): blocks like the device's, guarded and poisoned, and
// known while alive, so that copy_in can tell a copy from one of them (as the CUDA backend
// tells its page-locked blocks) and check its guards first. Freed blocks go straight back to
// the system.
class HostBlocks : public std::enable_shared_from_this<HostBlocks> {
 public:
  std::shared_ptr<void> allocate(std::size_t bytes, Device device) {
    const Block b = Block::make(bytes, device, "host bytes");
    {
      std::lock_guard lock(mutex_);
      alive_.emplace(b.data(), b);
    }
    ++host_alive;
    ++host_made;
    return std::shared_ptr<void>(b.data(), [blocks = shared_from_this()](void* p) { blocks->release(p); });
  }

  // Whether [p, p + bytes) lies inside a block alive now; checks that block's guards.
  bool contains(const void* p, std::size_t bytes) {
    const auto* c = static_cast<const unsigned char*>(p);
    std::lock_guard lock(mutex_);
    auto it = alive_.upper_bound(c);
    if (it == alive_.begin()) return false;
    const Block& b = std::prev(it)->second;
    if (c < b.data() || bytes > b.bytes || static_cast<std::size_t>(c - b.data()) > b.bytes - bytes)
      return false;
    b.check_guards("before a copy to the device");
    return true;
  }

 private:
  void release(void* p) {
    Block b{};
    {
      std::lock_guard lock(mutex_);
      auto it = alive_.find(static_cast<unsigned char*>(p));
      if (it == alive_.end()) std::abort();  // only allocate()'s deleter calls this
      b = it->second;
      alive_.erase(it);
    }
    b.check_guards("while the host block was in use");
    std::memset(b.data(), kPoison, b.bytes);
    std::free(b.base);
    --host_alive;
  }

  std::mutex mutex_;
  std::map<const unsigned char*, Block> alive_;  // by data()
};

class GuardedStorage final : public runtime::Storage {
 public:
  GuardedStorage(Block block, Quarantine& quarantine)
      : Storage(block.data(), block.bytes, block.device), block_(block), quarantine_(quarantine) {
    ++alive;
  }
  ~GuardedStorage() override {
    block_.check_guards("while it was in use");
    std::memset(block_.data(), kPoison, block_.bytes);
    quarantine_.add(block_);
    --alive;
  }

 private:
  Block block_;
  Quarantine& quarantine_;
};

// The guarded device's program: the CPU backend's executable for the same Program, and the
// byte sizes of the results to copy back.
struct GuardedExecutable final : runtime::Executable {
  std::shared_ptr<const runtime::Executable> cpu;
  std::vector<ir::SlotType> results;
};

// A target that is not the CPU's: no epilogue fusion, no transposed-operand folding, no
// arena, so the same graph compiles to another Program here.
ir::Target guarded_target() {
  ir::Target t;
  t.name = "guarded";
  t.run_everything();
  t.fuse_elementwise = t.fuse_reduce_prologue = true;
  return t;
}

std::size_t byte_size(DType dtype, const Shape& shape) {
  return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
}

class GuardedBackend final : public runtime::Backend {
 public:
  explicit GuardedBackend(Device device) : device_(device), cpu_(runtime::backend(Device{})) {}

  std::shared_ptr<void> alloc_host(std::size_t bytes) override {
    return host_blocks_->allocate(bytes, device_);
  }

  std::shared_ptr<runtime::Storage> alloc(std::size_t bytes) override {
    const Block b = Block::make(bytes, device_, "bytes");
    metrics::increment("AllocatorSystemAlloc", device_);
    return std::make_shared<GuardedStorage>(b, quarantine_);
  }
  void empty_cache() override { quarantine_.flush(); }

  void copy_in(const void* host, runtime::Storage& dst, std::size_t bytes) override {
    check_fits(dst, bytes, "copy_in");
    if (host_blocks_->contains(host, bytes)) ++host_copies;
    if (bytes) std::memcpy(dst.data(), host, bytes);
  }
  void copy_out(const runtime::Storage& src, void* host, std::size_t bytes) override {
    check_fits(src, bytes, "copy_out");
    if (bytes) std::memcpy(host, src.data(), bytes);
  }
  // Guarded memory and the CPU's are both host memory.
  bool copy(const runtime::Storage& src, runtime::Storage& dst, std::size_t bytes) override {
    if (!(src.device() == Device{}) && src.device().type != device_.type) return false;
    check_fits(src, bytes, "copy");
    check_fits(dst, bytes, "copy");
    if (bytes) std::memcpy(dst.data(), src.data(), bytes);
    return true;
  }

  const ir::Target& target() const override { return target_; }

  std::shared_ptr<const runtime::Executable> compile(ir::Program program) override {
    auto exe = std::make_shared<GuardedExecutable>();
    for (int slot : program.outputs) exe->results.push_back(program.slot_type(slot));
    exe->cpu = cpu_.compile(std::move(program));
    return exe;
  }

  void execute(std::shared_ptr<const runtime::Executable> exe, runtime::BufferList inputs,
               runtime::BufferList outputs) override {
    queue_.enqueue([this, exe = std::static_pointer_cast<const GuardedExecutable>(exe),
                    inputs = std::move(inputs), outputs = std::move(outputs)]() mutable {
      std::string error;
      try {
        run(*exe, inputs, outputs);
      } catch (const std::exception& e) {
        error = e.what();
      }
      inputs.clear();
      metrics::increment("ExecuteProgram", device_);
      for (auto& o : outputs) {  // a shared Completion is signalled more than once: harmless
        if (error.empty()) o->ready->set_done();
        else o->ready->set_failed(error);
      }
    });
  }
  void enqueue_callback(std::function<void()> fn) override { queue_.enqueue(std::move(fn)); }
  void synchronize() override { queue_.wait_idle(); }

 private:
  void check_fits(const runtime::Storage& s, std::size_t bytes, const char* what) const {
    if (bytes > s.bytes())
      throw Error(std::string("guarded: ") + what + " of " + std::to_string(bytes) + " bytes into a block of " +
                  std::to_string(s.bytes()));
  }

  // On the guarded thread: inputs to CPU storage, the CPU run, results back.
  void run(const GuardedExecutable& exe, const runtime::BufferList& inputs, const runtime::BufferList& outputs) {
    runtime::BufferList cpu_in, cpu_out;
    for (const auto& in : inputs) {
      const auto& src = in->wait("guarded");
      auto bytes = byte_size(in->dtype, in->shape);
      auto storage = cpu_.alloc(bytes);
      cpu_.copy_in(src.data(), *storage, bytes);
      cpu_in.push_back(runtime::ready_buffer(in->dtype, in->shape, std::move(storage)));
    }
    auto done = std::make_shared<runtime::Completion>();
    for (const auto& r : exe.results) {
      auto b = std::make_shared<runtime::DeviceBuffer>();
      b->dtype = r.dtype;
      b->shape = r.shape;
      b->ready = done;
      cpu_out.push_back(std::move(b));
    }
    cpu_.execute(exe.cpu, std::move(cpu_in), cpu_out);
    if (auto error = done->wait(); !error.empty()) throw Error(error);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      auto bytes = byte_size(exe.results[k].dtype, exe.results[k].shape);
      auto storage = alloc(bytes);
      cpu_.copy_out(*cpu_out[k]->storage, storage->data(), bytes);
      outputs[k]->storage = std::move(storage);
    }
  }

  const Device device_;
  runtime::Backend& cpu_;
  const ir::Target target_ = guarded_target();
  Quarantine quarantine_;
  std::shared_ptr<HostBlocks> host_blocks_ = std::make_shared<HostBlocks>();
  runtime::DeviceQueue queue_;
};

}  // namespace

Device guarded_device(int index) {
  static const DeviceType kind = runtime::register_backend("guarded", 2, [](int i) {
    return std::make_unique<GuardedBackend>(Device{parse_device("guarded").type, i});
  });
  return Device{kind, index};
}

int64_t guard_violations() { return violations.load(); }
int64_t guarded_blocks_alive() { return alive.load(); }
int64_t guarded_host_blocks_alive() { return host_alive.load(); }
int64_t guarded_host_blocks_made() { return host_made.load(); }
int64_t guarded_copies_from_host_blocks() { return host_copies.load(); }

}  // namespace loom::test
