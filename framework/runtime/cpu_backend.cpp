// The CPU backend: interprets a Program instruction by instruction on the device thread,
// with kernels from kernels.cpp. Reshape shares its input's storage (buffers are immutable).
#include "runtime/backend.h"

#include "runtime/device_queue.h"
#include "runtime/kernels.h"

#include <loom/error.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <chrono>
#include <cstring>

namespace loom::runtime {
namespace {

class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(compiler::Program p) : program(std::move(p)) {}
  compiler::Program program;
};

void run_program(const compiler::Program& p, const BufferList& inputs, const BufferList& outputs) {
  std::vector<std::shared_ptr<Storage>> slots(p.num_slots());
  auto n_in = static_cast<int>(p.inputs.size());
  for (int i = 0; i < n_in; ++i) {
    // Programs run in queue order, so an input is already computed; it may have failed.
    auto error = inputs[i]->ready->wait();
    if (!error.empty()) throw Error("an input of this step had failed: " + error);
    slots[i] = inputs[i]->storage;
  }
  std::vector<TensorView> views;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    const auto& in = p.instrs[i];
    int out_slot = n_in + i;
    if (in.op == ir::Op::Reshape) {
      slots[out_slot] = slots[in.args[0]];
    } else {
      auto bytes = static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
      slots[out_slot] = allocate(bytes);
      views.clear();
      for (auto a : in.args) {
        auto t = p.slot_type(a);
        views.push_back({slots[a]->data(), t.dtype, t.shape});
      }
      run_kernel(in.op, in.attr, views, {slots[out_slot]->data(), in.dtype, in.shape});
    }
    for (auto s : in.free_after) slots[s].reset();
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) outputs[k]->storage = slots[p.outputs[k]];
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return {}; }

  std::shared_ptr<Storage> alloc(std::size_t bytes) override { return allocate(bytes); }

  void copy_in(const void* host, Storage& dst, std::size_t bytes) override {
    if (bytes) std::memcpy(dst.data(), host, bytes);
  }

  void copy_out(const Storage& src, void* host, std::size_t bytes) override {
    if (bytes) std::memcpy(host, src.data(), bytes);
  }

  bool supports(ir::Op, DType) const override { return true; }

  std::shared_ptr<const Executable> compile(compiler::Program program) override {
    return std::make_shared<CpuExecutable>(std::move(program));
  }

  void execute(std::shared_ptr<const Executable> exe, BufferList inputs,
               BufferList outputs) override {
    queue_.enqueue([exe = std::move(exe), inputs = std::move(inputs),
                    outputs = std::move(outputs)] {
      const auto& program = static_cast<const CpuExecutable&>(*exe).program;
      profiler::Trace span("execute");
      auto start = std::chrono::steady_clock::now();
      try {
        run_program(program, inputs, outputs);
        for (auto& o : outputs) o->ready->set_done();
      } catch (const std::exception& e) {
        for (auto& o : outputs) o->ready->set_failed(e.what());
      }
      metrics::increment("ExecuteProgram");
      metrics::record("ExecuteTime", std::chrono::duration<double, std::nano>(
                                         std::chrono::steady_clock::now() - start).count());
    });
  }

  void enqueue_callback(std::function<void()> fn) override { queue_.enqueue(std::move(fn)); }
  void synchronize() override { queue_.wait_idle(); }
  void hold_queue() override { queue_.hold(); }
  void release_queue() override { queue_.release(); }
  int pending_programs() const override { return queue_.pending(); }

 private:
  DeviceQueue queue_;
};

}  // namespace

Backend& backend(Device device) {
  switch (device.type) {
    case DeviceType::CPU: {
      if (device.index != 0)
        throw Error("device: expected cpu:0, got " + device_str(device));
      static auto* cpu = new CpuBackend;  // leaked: its thread must outlive static tensors
      return *cpu;
    }
  }
  throw Error("device: unknown device " + device_str(device));
}

}  // namespace loom::runtime
