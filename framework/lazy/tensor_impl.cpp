#include "lazy/tensor_impl.h"

#include "lazy/capture.h"
#include "lazy/debug.h"
#include "lazy/executor.h"
#include "runtime/registry.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/profiler.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>

namespace loom {
namespace {

std::atomic<uint64_t> id_counter{1};

// Live pending tensors by creation order; mark_step collects them.
struct LiveRegistry {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<TensorImpl>> tensors;
};

LiveRegistry& live() {
  static auto* r = new LiveRegistry;  // leaked: tensors may die during static destruction
  return *r;
}

void register_live(const std::shared_ptr<TensorImpl>& impl) {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  r.tensors.emplace(impl->id(), impl);
}

void unregister(uint64_t id) {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  r.tensors.erase(id);
}

}  // namespace

TensorImpl::TensorImpl(ir::NodePtr ir, Device device)
    : dtype_(ir->dtype()), shape_(ir->shape()), device_(device), id_(id_counter++), ir_(std::move(ir)) {}

TensorImpl::TensorImpl(std::shared_ptr<runtime::DeviceBuffer> data, Device device, ir::NodePtr leaf)
    : dtype_(data->dtype), shape_(data->shape), device_(device), id_(id_counter++), data_(std::move(data)),
      leaf_(std::move(leaf)) {}

uint64_t TensorImpl::next_id() { return id_counter.load(); }

TensorImpl::~TensorImpl() {
  if (ir_) unregister(id_);
}

ir::NodePtr TensorImpl::node() {
  std::lock_guard lock(mutex_);
  if (ir_) return ir_;
  if (!leaf_) leaf_ = ir::make_device_data(dtype_, shape_, data_);
  if (lazy::capture::active) [[unlikely]]
    lazy::capture::note_read(*this, data_);
  return leaf_;
}

ir::NodePtr TensorImpl::pending() const {
  std::lock_guard lock(mutex_);
  return ir_;
}

std::shared_ptr<runtime::DeviceBuffer> TensorImpl::data() const {
  std::lock_guard lock(mutex_);
  return data_;
}

void TensorImpl::set_data(std::shared_ptr<runtime::DeviceBuffer> data) {
  bool was_pending;
  {
    std::lock_guard lock(mutex_);
    was_pending = ir_ != nullptr;
    data_ = std::move(data);
    ir_.reset();
    leaf_.reset();
  }
  if (was_pending) unregister(id_);
}

void TensorImpl::assign(const TensorImpl& value) {
  if (&value == this) return;
  if (value.dtype_ != dtype_ || value.shape_ != shape_)
    throw Error("assign: expected a value of " + std::string(dtype_name(dtype_)) + shape_str(shape_) +
                ", got " + dtype_name(value.dtype_) + shape_str(value.shape_));
  ir::NodePtr ir;
  std::shared_ptr<runtime::DeviceBuffer> data;
  std::shared_ptr<autograd::GradNode> fn;
  {
    std::lock_guard lock(value.mutex_);
    ir = value.ir_;
    data = value.data_;
    fn = value.grad_fn_;
  }
  bool was_pending;
  {
    std::lock_guard lock(mutex_);
    if (lazy::capture::active) [[unlikely]]
      lazy::capture::note_assign(*this, data_);
    if (fn && requires_grad_ && !grad_fn_)
      throw Error("assign: a leaf tensor that requires grad cannot take a value with autograd "
                  "history; update parameters under loom::NoGradGuard");
    was_pending = ir_ != nullptr;
    ir_ = std::move(ir);
    data_ = std::move(data);
    leaf_.reset();
    grad_fn_ = std::move(fn);
    // A value on another device moves the tensor there (Module::to); a gradient on the old
    // device no longer fits it.
    if (!(value.device() == device())) {
      device_.store(value.device(), std::memory_order_relaxed);
      grad_.reset();
    }
  }
  // The live registry holds weak pointers to pending tensors only.
  if (was_pending && !ir_) unregister(id_);
  if (!was_pending && ir_) register_live(shared_from_this());
}

bool TensorImpl::requires_grad() const {
  std::lock_guard lock(mutex_);
  return requires_grad_ || grad_fn_ != nullptr;
}

void TensorImpl::set_requires_grad(bool on) {
  std::lock_guard lock(mutex_);
  if (!on && grad_fn_)
    throw Error("requires_grad_: a computed tensor cannot stop requiring grad; use detach()");
  if (on && !is_floating(dtype_))
    throw Error(std::string("requires_grad_: expected a floating-point tensor, got ") + dtype_name(dtype_));
  requires_grad_ = on;
}

std::shared_ptr<autograd::GradNode> TensorImpl::grad_fn() const {
  std::lock_guard lock(mutex_);
  return grad_fn_;
}

void TensorImpl::set_grad_fn(std::shared_ptr<autograd::GradNode> fn) {
  std::lock_guard lock(mutex_);
  grad_fn_ = std::move(fn);
}

Tensor TensorImpl::grad() const {
  std::lock_guard lock(mutex_);
  return Tensor(grad_);
}

void TensorImpl::set_grad(Tensor grad) {
  if (grad.defined() && (grad.dtype() != dtype_ || grad.shape() != shape_))
    throw Error("set_grad: expected a gradient of " + std::string(dtype_name(dtype_)) + shape_str(shape_) +
                ", got " + dtype_name(grad.dtype()) + shape_str(grad.shape()));
  bool had;
  {
    std::lock_guard lock(mutex_);
    had = grad_ != nullptr;
    grad_ = grad.impl();
  }
  if (lazy::capture::active) lazy::capture::note_set_grad(*this, had, grad.defined());
}

namespace lazy {

Tensor make_tensor(ir::NodePtr node, Device device) {
  if (node->op() == ir::Op::DeviceData)
    return Tensor(std::make_shared<TensorImpl>(
        std::static_pointer_cast<runtime::DeviceBuffer>(node->payload()), device, node));
  auto impl = std::make_shared<TensorImpl>(std::move(node), device);
  register_live(impl);
  if (is_eager_mode()) run_graph({impl}, RunKind::Eager, "eager");
  return Tensor(std::move(impl));
}

Tensor make_device_tensor(const void* data, DType dtype, const Shape& shape, Device device) {
  for (auto d : shape)
    if (d <= 0) throw Error("from_host: expected positive sizes, got " + shape_str(shape));
  profiler::Trace span("transfer_to_device");
  auto start = std::chrono::steady_clock::now();
  auto& be = runtime::backend(device);
  auto bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto storage = be.alloc(bytes);
  be.copy_in(data, *storage, bytes);
  auto buf = runtime::ready_buffer(dtype, shape, std::move(storage));
  if (lazy::capture::active) [[unlikely]]
    lazy::capture::note_host_data(buf);
  metrics::increment("TransferToDevice", device);
  metrics::record("TransferToDeviceTime", std::chrono::duration<double, std::nano>(
                                              std::chrono::steady_clock::now() - start).count());
  return Tensor(std::make_shared<TensorImpl>(std::move(buf), device));
}

bool has_live_pending() {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  return !r.tensors.empty();
}

std::vector<std::pair<Device, std::vector<std::shared_ptr<TensorImpl>>>> live_pending_by_device() {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<Device, std::vector<std::shared_ptr<TensorImpl>>>> out;
  for (auto& [id, weak] : r.tensors) {
    auto t = weak.lock();
    if (!t) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == t->device(); });
    if (it == out.end()) it = out.insert(out.end(), {t->device(), {}});
    it->second.push_back(std::move(t));
  }
  return out;
}

Tensor transfer(const Tensor& t, Device device) {
  capture::refuse("it copies a tensor to another device inside (Tensor::to(Device)); a replay would copy nothing");
  const auto& impl = t.impl();
  auto& dst_backend = runtime::backend(device);  // an unknown device fails before any work
  if (impl->pending()) run_graph({impl}, RunKind::Read, "to");
  auto buf = impl->data();
  const runtime::Storage* src;
  {
    profiler::Trace span("wait");
    src = &buf->wait("to");
  }
  profiler::Trace span("transfer_between_devices");
  auto start = std::chrono::steady_clock::now();
  auto bytes = static_cast<std::size_t>(shape_numel(buf->shape)) * dtype_size(buf->dtype);
  auto storage = dst_backend.alloc(bytes);
  if (!dst_backend.copy(*src, *storage, bytes)) {
    std::vector<std::byte> host(bytes);
    runtime::backend(impl->device()).copy_out(*src, host.data(), bytes);
    dst_backend.copy_in(host.data(), *storage, bytes);
    metrics::increment("TransferThroughHost", device);
  }
  auto out = runtime::ready_buffer(buf->dtype, buf->shape, std::move(storage));
  metrics::increment("TransferBetweenDevices", device);
  metrics::record("TransferBetweenDevicesTime", std::chrono::duration<double, std::nano>(
                                                    std::chrono::steady_clock::now() - start).count());
  return Tensor(std::make_shared<TensorImpl>(std::move(out), device));
}

HostTensor read(const Tensor& t, const char* reader, const std::source_location& site) {
  if (!t.defined()) throw Error(std::string(reader) + ": got an undefined tensor");
  const auto& impl = t.impl();
  auto where = debug::site_of(site);
  capture::refuse(std::string("it reads a value inside (") + reader + " at " + where +
                  "); a replay runs no host code. Read it after the call, or in a step closure");
  if (impl->pending()) run_graph({impl}, RunKind::Read, where);
  auto buf = impl->data();
  // A step closure runs on the device thread once its step's work is done: a value not yet
  // computed there is a later step's, queued behind the closure, which it would wait for
  // for ever (a tensor assigned after the closure was added).
  if (debug::in_closure() && !buf->ready->done())
    throw Error(std::string(reader) + ": a step closure read a tensor whose value a later step computes (it was "
                "assigned after the closure was added); capture the value when adding the closure (t.detach())");
  const runtime::Storage* storage;
  {
    profiler::Trace span("wait");
    storage = &buf->wait(reader);
  }
  profiler::Trace span("transfer_from_device");
  debug::note_transfer(where);
  auto start = std::chrono::steady_clock::now();
  HostTensor h;
  h.dtype = impl->dtype();
  h.shape = impl->shape();
  h.bytes.resize(static_cast<std::size_t>(h.numel()) * dtype_size(h.dtype));
  runtime::backend(impl->device()).copy_out(*storage, h.bytes.data(), h.bytes.size());
  metrics::increment("TransferFromDevice", impl->device());
  metrics::record("TransferFromDeviceTime", std::chrono::duration<double, std::nano>(
                                                std::chrono::steady_clock::now() - start).count());
  return h;
}

}  // namespace lazy
}  // namespace loom
