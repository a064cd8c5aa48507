// Parameter-free layers: Dropout, activations, pooling, Flatten.
#include <loom/nn/init.h>
#include <loom/nn/layers.h>

#include <loom/autograd.h>
#include <loom/compile.h>

#include <loom/error.h>

#include <string>
#include <vector>

namespace loom::nn {
namespace {

std::string pair_str(const std::array<int64_t, 2>& p) {
  return "(" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ")";
}

void check_defined(const char* layer, const Tensor& x) {
  if (!x.defined()) throw Error(std::string(layer) + ": expected a defined input, got an empty handle");
}

// A pooling layer's options for guard_settings.
std::vector<double> pool_settings(const Pool2dOptions& o) {
  std::vector<double> v;
  for (const auto* pair : {&o.kernel, &o.stride, &o.padding})
    for (int64_t e : *pair) v.push_back(static_cast<double>(e));
  v.push_back(o.count_include_pad ? 1 : 0);
  return v;
}

void check_4d(const char* layer, const Tensor& x) {
  check_defined(layer, x);
  if (x.dim() != 4)
    throw Error(std::string(layer) + ": expected a 4-D input [N,C,H,W], got " + shape_str(x.shape()));
}

Pool2dOptions pool_options(const char* layer, IntPair kernel, IntPair stride, IntPair padding) {
  Pool2dOptions o;
  o.kernel = kernel.value;
  o.stride = stride.value;
  o.padding = padding.value;
  for (int i = 0; i < 2; ++i) {
    if (o.kernel[i] <= 0)
      throw Error(std::string(layer) + ": expected a positive kernel_size, got " + pair_str(o.kernel));
    if (o.stride[i] < 0)
      throw Error(std::string(layer) + ": expected a non-negative stride (0 = kernel_size), got " +
                  pair_str(o.stride));
    if (o.padding[i] < 0 || 2 * o.padding[i] > o.kernel[i])
      throw Error(std::string(layer) + ": expected padding at most half the kernel size " +
                  pair_str(o.kernel) + ", got " + pair_str(o.padding));
  }
  return o;
}

// Means over PyTorch's adaptive windows [floor(i·n/out), ceil((i+1)·n/out)) along `dim`.
Tensor adaptive_mean(const Tensor& x, int64_t dim, int64_t out) {
  const int64_t n = x.size(dim);
  if (out == n) return x;
  if (n % out == 0) {
    // Uniform windows: one reshape and one mean instead of `out` slices.
    Shape s = x.shape();
    s[dim] = out;
    s.insert(s.begin() + dim + 1, n / out);
    return reshape(x, s).mean({dim + 1});
  }
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < out; ++i) {
    int64_t start = i * n / out;
    int64_t end = ((i + 1) * n + out - 1) / out;
    parts.push_back(slice(x, dim, start, end).mean({dim}, true));
  }
  return concat(parts, dim);
}

}  // namespace

Dropout::Dropout(double p, std::optional<uint64_t> seed) : p(p), seed_(seed ? *seed : next_seed()) {
  if (!(p >= 0 && p <= 1)) throw Error("Dropout: expected p in [0, 1], got " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) {
  check_defined("Dropout", x);
  // Host control flow: a captured step is traced again when the mode turns.
  guard_settings("Dropout's training mode", [this] { return std::vector<double>{is_training() ? 1.0 : 0.0}; });
  // p is read into the graph (the branches below, the mask's threshold, the scale): a change
  // between calls traces again (the value compared is p's bit pattern).
  guard_settings("Dropout's p", [this] { return std::vector<double>{p}; });
  if (!is_training() || p == 0) return x;
  if (!is_floating(x.dtype()))
    throw Error(std::string("Dropout: expected a floating-point input, got ") + dtype_name(x.dtype()));
  if (p == 1) return x * 0.0;
  // loom::rand mixes its seed, so consecutive seeds give unrelated masks. The seed is device
  // data advanced on the device, so a captured step draws a new mask at every replay.
  if (!seed_now_.defined() || !(seed_now_.device() == x.device()))
    seed_now_ = from_vector<int64_t>({static_cast<int64_t>(seed_ + calls_)}, {}, x.device());
  every_call([this] { ++calls_; });
  auto keep = ge(rand(x.shape(), seed_now_, x.dtype()), scalar_tensor(p, x.dtype(), x.device()));
  {
    NoGradGuard no_grad;
    seed_now_.assign(seed_now_ + 1);
  }
  return x * keep.to(x.dtype()) * (1 / (1 - p));
}

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor GELU::forward(const Tensor& x) {
  guard_settings("GELU's approximate", [this] { return std::vector<double>{approximate ? 1.0 : 0.0}; });
  return gelu(x, approximate);
}

MaxPool2d::MaxPool2d(IntPair kernel_size, IntPair stride, IntPair padding)
    : options(pool_options("MaxPool2d", kernel_size, stride, padding)) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  check_4d("MaxPool2d", x);
  guard_settings("MaxPool2d's options", [this] { return pool_settings(options); });
  return max_pool2d(x, options);
}

AvgPool2d::AvgPool2d(IntPair kernel_size, IntPair stride, IntPair padding, bool count_include_pad)
    : options(pool_options("AvgPool2d", kernel_size, stride, padding)) {
  options.count_include_pad = count_include_pad;
}

Tensor AvgPool2d::forward(const Tensor& x) {
  check_4d("AvgPool2d", x);
  guard_settings("AvgPool2d's options", [this] { return pool_settings(options); });
  return avg_pool2d(x, options);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(IntPair size) : output_size(size.value) {
  if (output_size[0] <= 0 || output_size[1] <= 0)
    throw Error("AdaptiveAvgPool2d: expected a positive output_size, got " + pair_str(output_size));
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  check_4d("AdaptiveAvgPool2d", x);
  guard_settings("AdaptiveAvgPool2d's output_size", [this] {
    return std::vector<double>{static_cast<double>(output_size[0]), static_cast<double>(output_size[1])};
  });
  if (output_size[0] == 1 && output_size[1] == 1) return x.mean({2, 3}, true);
  // A rectangular window's mean is the mean of its row means, so the two axes pool separately.
  return adaptive_mean(adaptive_mean(x, 2, output_size[0]), 3, output_size[1]);
}

Tensor Flatten::forward(const Tensor& x) {
  check_defined("Flatten", x);
  guard_settings("Flatten's dims", [this] {
    return std::vector<double>{static_cast<double>(start_dim), static_cast<double>(end_dim)};
  });
  return flatten(x, start_dim, end_dim);
}

}  // namespace loom::nn
