// The state behind a Tensor handle. A tensor is either
//   pending   — ir_ holds the IR value that will compute it (registered as live), or
//   on device — data_ holds its device buffer (maybe not computed yet: see runtime/buffer.h).
// Reading or marking a step moves a tensor from pending to on device; nothing moves back.
#pragma once

#include "ir/node.h"
#include "runtime/buffer.h"

#include <loom/tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <source_location>

namespace loom {

namespace autograd {
struct GradNode;
}

class TensorImpl : public std::enable_shared_from_this<TensorImpl> {
 public:
  TensorImpl(ir::NodePtr ir, Device device);
  // `leaf`, when given, is the DeviceData node already standing for `data`.
  TensorImpl(std::shared_ptr<runtime::DeviceBuffer> data, Device device, ir::NodePtr leaf = nullptr);
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return device_.load(std::memory_order_relaxed); }
  uint64_t id() const { return id_; }
  // The id the next tensor will get: ids grow, so a smaller id is an older tensor.
  static uint64_t next_id();

  // The IR value to use this tensor as an operand: its pending node, or a DeviceData leaf
  // for its buffer (one leaf per buffer, so two uses of the tensor read one input slot).
  ir::NodePtr node();
  // Pending IR, or null.
  ir::NodePtr pending() const;
  // Device buffer, or null while pending.
  std::shared_ptr<runtime::DeviceBuffer> data() const;
  // Pending → on device. Called by the executor once a program owes this buffer.
  void set_data(std::shared_ptr<runtime::DeviceBuffer> data);
  // In-place update that keeps this tensor's identity: takes `value`'s state (pending IR or
  // buffer) and its autograd history. dtype and shape must match.
  void assign(const TensorImpl& value);

  // Autograd state (framework/autograd). A tensor needs a gradient when it is a leaf that
  // requires one or when it was computed from such tensors (it then has a grad_fn).
  bool requires_grad() const;
  void set_requires_grad(bool on);
  std::shared_ptr<autograd::GradNode> grad_fn() const;
  void set_grad_fn(std::shared_ptr<autograd::GradNode> fn);
  Tensor grad() const;
  void set_grad(Tensor grad);

 private:
  const DType dtype_;
  const Shape shape_;
  std::atomic<Device> device_;  // changes only by assign() of a value on another device
  const uint64_t id_;
  mutable std::mutex mutex_;
  ir::NodePtr ir_;
  std::shared_ptr<runtime::DeviceBuffer> data_;
  ir::NodePtr leaf_;
  bool requires_grad_ = false;
  std::shared_ptr<autograd::GradNode> grad_fn_;
  std::shared_ptr<TensorImpl> grad_;
};

namespace lazy {

// Wraps an IR node as a tensor. In eager mode the node runs at once. A DeviceData node gives
// a tensor on that buffer (nothing pending).
Tensor make_tensor(ir::NodePtr node, Device device);
// A tensor whose buffer already holds `data` (copied from the host, counted as a transfer).
Tensor make_device_tensor(const void* data, DType dtype, const Shape& shape, Device device);
// Every live pending tensor, grouped by device (devices in the order first met).
std::vector<std::pair<Device, std::vector<std::shared_ptr<TensorImpl>>>> live_pending_by_device();
// Whether any tensor is pending (cheap: what a compiled call checks first).
bool has_live_pending();
// A copy of `t`'s value on `device` (through the host when the target's backend cannot reach
// the source's memory); runs `t`'s graph first if it is pending.
Tensor transfer(const Tensor& t, Device device);

// Runs the subgraph of `t` (if pending) and waits for its buffer; counts one
// TransferFromDevice. `reader` names the caller in errors.
HostTensor read(const Tensor& t, const char* reader, const std::source_location& site);

}  // namespace lazy
}  // namespace loom
