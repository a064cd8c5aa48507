#include "lazy/tensor_impl.h"

#include "lazy/executor.h"
#include "runtime/backend.h"

#include <loom/lazy.h>
#include <loom/metrics.h>

#include <atomic>
#include <chrono>
#include <map>

namespace loom {
namespace {

std::atomic<uint64_t> next_id{1};

// Live pending tensors by creation order; mark_step collects them.
struct LiveRegistry {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<TensorImpl>> tensors;
};

LiveRegistry& live() {
  static auto* r = new LiveRegistry;  // leaked: tensors may die during static destruction
  return *r;
}

void unregister(uint64_t id) {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  r.tensors.erase(id);
}

}  // namespace

TensorImpl::TensorImpl(ir::NodePtr ir, Device device)
    : dtype_(ir->dtype()), shape_(ir->shape()), device_(device), id_(next_id++), ir_(std::move(ir)) {}

TensorImpl::TensorImpl(std::shared_ptr<runtime::DeviceBuffer> data, Device device)
    : dtype_(data->dtype), shape_(data->shape), device_(device), id_(next_id++), data_(std::move(data)) {}

TensorImpl::~TensorImpl() {
  if (ir_) unregister(id_);
}

ir::NodePtr TensorImpl::node() {
  std::lock_guard lock(mutex_);
  if (ir_) return ir_;
  if (!leaf_) leaf_ = ir::make_device_data(dtype_, shape_, data_);
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
  {
    std::lock_guard lock(mutex_);
    data_ = std::move(data);
    ir_.reset();
    leaf_.reset();
  }
  unregister(id_);
}

namespace lazy {

Tensor make_tensor(ir::NodePtr node, Device device) {
  auto impl = std::make_shared<TensorImpl>(std::move(node), device);
  {
    auto& r = live();
    std::lock_guard lock(r.mutex);
    r.tensors.emplace(impl->id(), impl);
  }
  if (is_eager_mode()) run_graph({impl}, RunKind::Eager);
  return Tensor(std::move(impl));
}

Tensor make_device_tensor(const void* data, DType dtype, const Shape& shape, Device device) {
  for (auto d : shape)
    if (d <= 0) throw Error("from_host: expected positive sizes, got " + shape_str(shape));
  auto start = std::chrono::steady_clock::now();
  auto& be = runtime::backend(device);
  auto bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto buf = std::make_shared<runtime::DeviceBuffer>();
  buf->dtype = dtype;
  buf->shape = shape;
  buf->storage = be.alloc(bytes);
  be.copy_in(data, *buf->storage, bytes);
  buf->ready = std::make_shared<runtime::Completion>();
  buf->ready->set_done();
  metrics::increment("TransferToDevice");
  metrics::record("TransferToDeviceTime", std::chrono::duration<double, std::nano>(
                                              std::chrono::steady_clock::now() - start).count());
  return Tensor(std::make_shared<TensorImpl>(std::move(buf), device));
}

std::vector<std::shared_ptr<TensorImpl>> live_pending(Device device) {
  auto& r = live();
  std::lock_guard lock(r.mutex);
  std::vector<std::shared_ptr<TensorImpl>> out;
  for (auto& [id, weak] : r.tensors)
    if (auto t = weak.lock(); t && t->device() == device) out.push_back(std::move(t));
  return out;
}

HostTensor read(const Tensor& t, const char* reader) {
  if (!t.defined()) throw Error(std::string(reader) + ": got an undefined tensor");
  const auto& impl = t.impl();
  if (impl->pending()) run_graph({impl}, RunKind::Read);
  auto buf = impl->data();
  const auto& storage = buf->wait(reader);
  auto start = std::chrono::steady_clock::now();
  HostTensor h;
  h.dtype = impl->dtype();
  h.shape = impl->shape();
  h.bytes.resize(static_cast<std::size_t>(h.numel()) * dtype_size(h.dtype));
  runtime::backend(impl->device()).copy_out(storage, h.bytes.data(), h.bytes.size());
  metrics::increment("TransferFromDevice");
  metrics::record("TransferFromDeviceTime", std::chrono::duration<double, std::nano>(
                                                std::chrono::steady_clock::now() - start).count());
  return h;
}

}  // namespace lazy
}  // namespace loom
