// Tensor handles, creation and reads.
#include "lazy/ops_util.h"
#include "runtime/registry.h"

#include <loom/bfloat16.h>
#include <loom/lazy.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>

namespace loom {

Tensor::Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  if (!impl) throw Error("tensor: expected a defined tensor, got an empty handle");
  return *impl;
}
}  // namespace

DType Tensor::dtype() const { return checked(impl_).dtype(); }
const Shape& Tensor::shape() const { return checked(impl_).shape(); }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[lazy::existing_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
Device Tensor::device() const { return checked(impl_).device(); }
bool Tensor::is_pending() const { return checked(impl_).pending() != nullptr; }

Tensor Tensor::to(Device device) const {
  if (!(device == this->device())) return lazy::transfer(*this, device);
  return *this;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  return lazy::apply(ir::Op::Cast, {*this}, ir::CastAttr{dtype});
}

HostTensor Tensor::to_host(std::source_location site) const { return lazy::read(*this, "to_host", site); }

namespace {
}  // namespace

template <class T>
std::vector<T> Tensor::to_vector(std::source_location site) const {
  if (dtype() != dtype_of<T>())
    throw Error(std::string("to_vector: expected a tensor of dtype ") + dtype_name(dtype_of<T>()) +
                ", got " + dtype_name(dtype()));
  auto h = lazy::read(*this, "to_vector", site);
  if constexpr (std::is_same_v<T, bool>) {
    return std::vector<bool>(h.bytes.begin(), h.bytes.end());
  } else {
    std::vector<T> out(static_cast<std::size_t>(h.numel()));
    std::memcpy(out.data(), h.bytes.data(), h.bytes.size());
    return out;
  }
}

template <class T>
T Tensor::item(std::source_location site) const {
  if (numel() != 1)
    throw Error("item: expected a tensor with one element, got shape " + shape_str(shape()));
  auto h = lazy::read(*this, "item", site);
  if constexpr (std::is_same_v<T, bool>) {
    return h.at(0) != 0;
  } else if constexpr (std::is_integral_v<T>) {
    // An integer element is read as it is stored (through a double, int64 past 2^53 would
    // round); any value must fit in T (a fraction is cut toward zero, as a cast does).
    auto out_of_range = [&](const std::string& value) {
      return Error("item: the value " + value + " does not fit in " + dtype_name(dtype_of<T>()));
    };
    if (h.dtype == DType::Int64 || h.dtype == DType::Int32) {
      int64_t v = 0;
      if (h.dtype == DType::Int64) std::memcpy(&v, h.bytes.data(), sizeof v);
      else {
        int32_t w = 0;
        std::memcpy(&w, h.bytes.data(), sizeof w);
        v = w;
      }
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
        throw out_of_range(std::to_string(v));
      return static_cast<T>(v);
    }
    const double v = h.at(0);
    // [-2^63, 2^63) for int64 (2^63 itself does not fit), [-2^31, 2^31) for int32.
    const double bound = std::ldexp(1.0, std::numeric_limits<T>::digits);
    if (!(std::trunc(v) >= -bound && std::trunc(v) < bound)) {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", v);
      throw out_of_range(text);
    }
    return static_cast<T>(v);
  } else {
    return static_cast<T>(h.at(0));
  }
}

#define LOOM_INSTANTIATE_READS(T)                        \
  template std::vector<T> Tensor::to_vector<T>(std::source_location) const; \
  template T Tensor::item<T>(std::source_location) const;
LOOM_INSTANTIATE_READS(float)
LOOM_INSTANTIATE_READS(double)
LOOM_INSTANTIATE_READS(int64_t)
LOOM_INSTANTIATE_READS(int32_t)
LOOM_INSTANTIATE_READS(bool)
#undef LOOM_INSTANTIATE_READS

double HostTensor::at(int64_t i) const {
  switch (dtype) {
    case DType::Float32: return data<float>()[i];
    case DType::Float64: return data<double>()[i];
    case DType::Int64: return static_cast<double>(data<int64_t>()[i]);
    case DType::Int32: return data<int32_t>()[i];
    case DType::Bool: return bytes[i] ? 1 : 0;
    case DType::BFloat16: return static_cast<float>(data<bfloat16>()[i]);
  }
  return 0;
}

namespace {

void print_values(std::ostream& os, const HostTensor& h, std::size_t dim, int64_t& offset, int indent) {
  if (h.shape.empty()) {
    os << h.at(offset++);
    return;
  }
  os << '[';
  int64_t n = h.shape[dim];
  bool last = dim + 1 == h.shape.size();
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dimension
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge + 1 && i == kEdge) {
      os << "...";
      int64_t inner = 1;
      for (auto k = dim + 1; k < h.shape.size(); ++k) inner *= h.shape[k];
      offset += (n - 2 * kEdge) * inner;
      i = n - kEdge - 1;
      os << (last ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    if (last) {
      double v = h.at(offset++);
      if (h.dtype == DType::Bool) os << (v != 0 ? "True" : "False");
      else if (is_floating(h.dtype)) os << std::setprecision(4) << std::fixed << v << std::defaultfloat;
      else os << static_cast<int64_t>(v);
    } else {
      print_values(os, h, dim + 1, offset, indent + 1);
    }
    if (i + 1 < n) os << (last ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  auto h = lazy::read(t, "print", std::source_location::current());
  std::ostringstream body;
  int64_t offset = 0;
  print_values(body, h, 0, offset, 7);
  return os << "tensor(" << body.str() << ", dtype=" << dtype_name(h.dtype) << ')';
}

// ---- creation ----

Tensor scalar_tensor(double value, DType dtype, Device device) {
  return lazy::scalar(value, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  for (auto d : shape)
    if (d <= 0) throw Error("full: expected positive sizes, got " + shape_str(shape));
  auto s = lazy::scalar(value, dtype, device);
  if (shape.empty()) return s;
  return expand(reshape(s, Shape(shape.size(), 1)), shape);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1, dtype, device); }

Tensor iota(const Shape& shape, int64_t dim, DType dtype, Device device) {
  if (dtype == DType::Bool) throw Error("iota: expected a numeric dtype, got bool");
  dim = lazy::normalize_dim(dim, static_cast<int64_t>(shape.size()), "iota");
  return lazy::make_tensor(ir::make_leaf(ir::Op::Iota, dtype, shape, ir::DimAttr{dim}), device);
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  auto range = [&] {
    return "start " + std::to_string(start) + ", end " + std::to_string(end) + ", step " + std::to_string(step);
  };
  if (dtype == DType::Bool) throw Error("arange: expected a numeric dtype, got bool");
  if (!is_floating(dtype)) {
    // As PyTorch's int64 ranges (its int32 ones count in doubles): the bounds and step are
    // truncated to integers first, and the values counted and computed in int64 (through
    // doubles, values past 2^53 would round and repeat).
    for (double v : {start, end, step})
      if (!(v >= -0x1p63 && v < 0x1p63))
        throw Error("arange: expected start, end and step that fit in int64, got " + range());
    const auto s0 = static_cast<int64_t>(start), e0 = static_cast<int64_t>(end), st = static_cast<int64_t>(step);
    if (st == 0) throw Error("arange: expected a step that is not 0 as an integer, got " + range());
    // ceil((e0 - s0) / st) without overflow: the span and the step's size as unsigned.
    const bool up = st > 0;
    uint64_t count = 0;
    if (up ? e0 > s0 : e0 < s0) {
      const uint64_t span = up ? static_cast<uint64_t>(e0) - static_cast<uint64_t>(s0)
                               : static_cast<uint64_t>(s0) - static_cast<uint64_t>(e0);
      const uint64_t size = up ? static_cast<uint64_t>(st) : uint64_t{0} - static_cast<uint64_t>(st);
      count = span / size + (span % size != 0 ? 1 : 0);
    }
    if (!(count >= 1 && count < (uint64_t{1} << 62)))
      throw Error("arange: expected a non-empty range of fewer than 2^62 values, got " + range());
    Tensor values = iota({static_cast<int64_t>(count)}, 0, DType::Int64, device);
    if (st != 1) values = values * from_vector<int64_t>({st}, {}, device);
    if (s0 != 0) values = values + from_vector<int64_t>({s0}, {}, device);
    return values.to(dtype);
  }
  if (step == 0) throw Error("arange: expected a non-zero step, got 0");
  double count = std::ceil((end - start) / step);
  if (!(count >= 1 && count < 0x1p62))  // NaN and infinite counts fail here too
    throw Error("arange: expected a non-empty range of fewer than 2^62 values, got " + range());
  // In float64 and rounded once to the dtype, as PyTorch computes float ranges.
  Tensor values = iota({static_cast<int64_t>(count)}, 0, DType::Float64, device);
  if (step != 1) values = values * step;
  if (start != 0) values = values + start;
  return values.to(dtype);
}

Tensor arange(int64_t end, DType dtype, Device device) {
  if (end <= 0) throw Error("arange: expected a positive end, got " + std::to_string(end));
  return iota({end}, 0, dtype, device);
}

Tensor from_host(const void* data, DType dtype, const Shape& shape, Device device) {
  return lazy::make_device_tensor(data, dtype, shape, device);
}

std::shared_ptr<void> alloc_host(std::size_t bytes, Device device) {
  return runtime::backend(device).alloc_host(bytes);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    throw Error("from_vector: expected " + std::to_string(shape_numel(shape)) +
                " values for shape " + shape_str(shape) + ", got " + std::to_string(values.size()));
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(values.begin(), values.end());
    return from_host(bytes.data(), DType::Bool, shape, device);
  } else {
    return from_host(values.data(), dtype_of<T>(), shape, device);
  }
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Device);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, Device);

// ---- method forms ----
Tensor Tensor::sum(std::vector<int64_t> axes, bool keepdim) const { return loom::sum(*this, std::move(axes), keepdim); }
Tensor Tensor::mean(std::vector<int64_t> axes, bool keepdim) const { return loom::mean(*this, std::move(axes), keepdim); }
Tensor Tensor::max(std::vector<int64_t> axes, bool keepdim) const { return loom::amax(*this, std::move(axes), keepdim); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return loom::argmax(*this, dim, keepdim); }
Tensor Tensor::reshape(Shape shape) const { return loom::reshape(*this, std::move(shape)); }
Tensor Tensor::permute(std::vector<int64_t> perm) const { return loom::permute(*this, std::move(perm)); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return loom::transpose(*this, d0, d1); }
Tensor Tensor::expand(Shape shape) const { return loom::expand(*this, std::move(shape)); }

}  // namespace loom
