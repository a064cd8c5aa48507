// Lazy tensors: every op below records an IR node; nothing runs until a step barrier
// (loom::mark_step) or a read (item, to_host, printing) needs a value.
//
//   auto x = loom::from_vector<float>({1, 2, 3, 4}, {2, 2});
//   auto y = loom::relu(x * 2.0 - 3.0).sum();   // traced, not run
//   float v = y.item<float>();                  // runs y's subgraph, one transfer
//
// Binary ops broadcast like NumPy; both operands must have the same dtype (scalars take the
// tensor's dtype, so a fractional scalar with an integer or bool tensor is an error: there
// is no promotion to float as in PyTorch). Scalars 0 and 1 (not -0) are baked into the graph as
// constants; any other scalar becomes device data, so changing it does not recompile
// (LOOM_NO_SPECIAL_SCALARS=1 makes 0 and 1 device data too).
#pragma once

#include <loom/dtype.h>
#include <loom/error.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

namespace loom {

class TensorImpl;  // framework/lazy/tensor_impl.h

// Values copied back to the host: contiguous, row-major.
struct HostTensor {
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<unsigned char> bytes;

  template <class T>
  const T* data() const { return reinterpret_cast<const T*>(bytes.data()); }
  int64_t numel() const { return shape_numel(shape); }
  // Element i converted to double (bool → 0/1).
  double at(int64_t i) const;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl);

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const;
  const Shape& shape() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  Device device() const;

  // The tensor on `device`: itself if it is there already, else a copy of its value (its
  // graph runs first if it is pending), directly between the devices where the target's
  // backend reaches the source's memory and through the host otherwise. The copy is a new
  // leaf: autograd does not flow back through it, so move parameters and data, not
  // intermediate results. Throws naming the registered devices for an unknown one.
  Tensor to(Device device) const;
  // Casts the elements.
  Tensor to(DType dtype) const;

  // Synchronous reads: run only the subgraph this tensor needs, count one
  // TransferFromDevice, and wait for the value.
  // `site` (the caller's line) is what transfer warnings name.
  HostTensor to_host(std::source_location site = std::source_location::current()) const;
  template <class T>
  std::vector<T> to_vector(std::source_location site = std::source_location::current()) const;
  template <class T>
  T item(std::source_location site = std::source_location::current()) const;

  // True when the value is pending IR (not yet given a device buffer).
  bool is_pending() const;

  // ---- autograd (see loom/autograd.h) ----
  bool requires_grad() const;
  // Marks a floating-point leaf as needing a gradient; returns *this.
  Tensor& requires_grad_(bool on = true);
  // The gradient accumulated by backward(); undefined until backward reaches this tensor.
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  // Gradients of this tensor with respect to every leaf that requires grad, accumulated into
  // their grad(). `gradient` may be omitted for a one-element tensor (it is then 1). Frees
  // the graph's saved values: a second backward through it throws.
  void backward(const Tensor& gradient = {}) const;
  // The same value with no autograd history.
  Tensor detach() const;
  // In-place update keeping identity (parameters, optimizer state): every handle to this
  // tensor sees `value` from now on. dtype and shape must match. A value on another device
  // moves the tensor to that device (and drops its gradient).
  void assign(const Tensor& value) const;

  // Method forms of the free functions below.
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor reshape(Shape shape) const;
  Tensor permute(std::vector<int64_t> perm) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor expand(Shape shape) const;

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- creation ----
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = {});
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = {});
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32, Device device = {});
// [start, end) with the given step, like torch.arange.
Tensor arange(double start, double end, double step = 1, DType dtype = DType::Int64,
              Device device = {});
Tensor arange(int64_t end, DType dtype = DType::Int64, Device device = {});
// Indices along `dim` broadcast over `shape` (for masks).
Tensor iota(const Shape& shape, int64_t dim, DType dtype = DType::Int64, Device device = {});
// Copies host values to the device (one TransferToDevice).
Tensor from_host(const void* data, DType dtype, const Shape& shape, Device device = {});
// Host memory for from_host to copy to `device` from: what that device copies fastest
// (page-locked on a GPU, copied in one transfer on its copy stream; plain memory aligned to
// 64 bytes on the CPU). Its last reference frees it or gives it back to the device for reuse.
// The DeviceLoader collates each batch into it.
std::shared_ptr<void> alloc_host(std::size_t bytes, Device device = {});
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = {});
// Counter-based random numbers: element i depends only on (seed, i). The seed is device
// data, so a new seed does not recompile.
Tensor rand(const Shape& shape, uint64_t seed, DType dtype = DType::Float32, Device device = {});
Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::Float32, Device device = {});
// The same with the seed a 0-d int64 tensor (on the device the values are made on): a seed
// kept on the device and advanced there (seed.assign(seed + 1)) gives a captured step a new
// draw at every replay (loom/compile.h).
Tensor rand(const Shape& shape, const Tensor& seed, DType dtype = DType::Float32);
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed,
               DType dtype = DType::Float32, Device device = {});
Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed,
              DType dtype = DType::Float32, Device device = {});
// A 0-d tensor holding `value` (a constant for 0 and 1, else device data).
Tensor scalar_tensor(double value, DType dtype = DType::Float32, Device device = {});

// ---- elementwise ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor silu(const Tensor& x);
// approximate = false: x·Φ(x) with erf; true: the tanh approximation (PyTorch's "tanh").
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor logical_not(const Tensor& x);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);

// ---- reductions (empty axes = all axes; negative axes count from the end) ----
// The sum of an int32 or bool tensor is int64, as in PyTorch; of other dtypes, the dtype's.
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor logsumexp(const Tensor& x, std::vector<int64_t> axes, bool keepdim = false);

// ---- movement ----
// One dimension may be -1 (inferred).
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, std::vector<int64_t> perm);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// Elements start, start+step, ... < end along dim (end is clamped, negatives count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Broadcasts size-1 dimensions (and new leading ones); -1 keeps a size.
Tensor expand(const Tensor& x, Shape shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// Pads like torch.nn.functional.pad: {last_lo, last_hi, prev_lo, prev_hi, ...}.
Tensor pad(const Tensor& x, std::vector<int64_t> pads, double value = 0);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);

// ---- linear algebra, convolution, pooling ----
// NumPy matmul: 1-D operands are promoted, batch dimensions broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);

// The op's parameters (torch.nn.functional.conv2d's). Not nn::Conv2dOptions, which also holds
// the channels and kernel size from which an nn::Conv2d module makes its weight.
struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};
// input [N,C,H,W], weight [O,C/groups,kh,kw], optional bias [O].
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const Conv2dParams& params = {});

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  // 0 = the kernel size, as in PyTorch
  std::array<int64_t, 2> padding{0, 0};
  bool count_include_pad = true;        // avg_pool2d only
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);

// ---- indexing ----
// torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] for dim = 1; index is int64.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// torch.index_select with a 1-D int64 index.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Rows of weight [V, D] for int64 indices of any shape: result indices.shape + [D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// torch.scatter_add: out = self; out[...index...] += src (index and src have one shape).
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// int64 indices → int64 [..., num_classes].
Tensor one_hot(const Tensor& indices, int64_t num_classes);

}  // namespace loom
