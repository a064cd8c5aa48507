// Layers: the building blocks of models, named and initialised like torch.nn.
//
//   namespace nn = loom::nn;
//   nn::manual_seed(0);
//   auto net = std::make_shared<nn::Sequential>();
//   net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)));
//   net->push_back(std::make_shared<nn::BatchNorm2d>(16));
//   net->push_back(std::make_shared<nn::ReLU>());
//   net->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
//   net->push_back(std::make_shared<nn::Flatten>());
//   net->push_back(std::make_shared<nn::Linear>(16, 10));
//   // state_dict keys: 0.weight, 1.weight, 1.bias, 1.running_mean, 1.running_var,
//   //                  1.num_batches_tracked, 5.weight, 5.bias
//   auto logits = net->forward(images);   // traced; runs at the next mark_step
//
// Parameters are created with nn::default_dtype() and initialised as PyTorch does (same
// distributions; seeds from nn::next_seed, see loom/nn/init.h). They start *pending*: their
// initial values are lazy IR that the first mark_step (or read) computes, so constructing a
// model transfers nothing and runs nothing.
//
// Modules whose behaviour depends on train/eval (BatchNorm2d, Dropout) read is_training().
#pragma once

#include <loom/nn/module.h>
#include <loom/tensor.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

namespace loom::nn {

// A pair of ints given as one value (both) or as {h, w}, like libtorch's ExpandingArray<2>.
struct IntPair {
  IntPair(int64_t v) : value{v, v} {}  // NOLINT: implicit on purpose, `.stride(2)`
  IntPair(int64_t h, int64_t w) : value{h, w} {}
  std::array<int64_t, 2> value;
};

// y = x · weightᵀ + bias; weight [out, in], bias [out].
// Init: weight and bias U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;

  Tensor weight, bias;  // bias is undefined without one
  int64_t in_features, out_features;
};

// Options for Conv2d with chaining setters:
//   Conv2dOptions(3, 16, 3).stride(2).padding(1).bias(false)
// Validated by the Conv2d constructor.
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, IntPair kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size.value) {}

  Conv2dOptions& stride(IntPair v) { stride_ = v.value; return *this; }
  Conv2dOptions& padding(IntPair v) { padding_ = v.value; return *this; }
  Conv2dOptions& dilation(IntPair v) { dilation_ = v.value; return *this; }
  Conv2dOptions& groups(int64_t v) { groups_ = v; return *this; }
  Conv2dOptions& bias(bool v) { bias_ = v; return *this; }

  int64_t in_channels() const { return in_channels_; }
  int64_t out_channels() const { return out_channels_; }
  std::array<int64_t, 2> kernel_size() const { return kernel_size_; }
  std::array<int64_t, 2> stride() const { return stride_; }
  std::array<int64_t, 2> padding() const { return padding_; }
  std::array<int64_t, 2> dilation() const { return dilation_; }
  int64_t groups() const { return groups_; }
  bool bias() const { return bias_; }

 private:
  int64_t in_channels_, out_channels_;
  std::array<int64_t, 2> kernel_size_;
  std::array<int64_t, 2> stride_{1, 1};
  std::array<int64_t, 2> padding_{0, 0};
  std::array<int64_t, 2> dilation_{1, 1};
  int64_t groups_ = 1;
  bool bias_ = true;
};

// 2-D convolution over [N, C, H, W]; weight [out, in/groups, kh, kw], bias [out].
// Init: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in/groups·kh·kw.
class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Tensor forward(const Tensor& input) override;

  Conv2dOptions options;
  Tensor weight, bias;
};

// Batch normalisation over [N, C, H, W] per channel.
// Train mode: normalises with the batch mean and biased variance, then updates in place
//   running_mean = (1 - momentum)·running_mean + momentum·mean
//   running_var  = (1 - momentum)·running_var  + momentum·var·n/(n-1)   (n = N·H·W)
//   num_batches_tracked += 1
// Eval mode: normalises with the running statistics.
// Parameters weight (1) and bias (0); buffers running_mean (0), running_var (1) and
// num_batches_tracked (int64, 0-d), as PyTorch's state_dict has them.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& input) override;

  int64_t num_features;
  double eps, momentum;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

// Normalises over the trailing `normalized_shape` dims (biased variance).
// With elementwise_affine: weight (1) and bias (0) of normalized_shape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& input) override;

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // undefined without elementwise_affine (bias: also without bias)
};

// Llama's RMSNorm over the last dim: y = x · rsqrt(mean(x², -1) + eps) · weight; weight (1).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& input) override;

  int64_t dim;
  double eps;
  Tensor weight;
};

// Looks up rows of weight [num_embeddings, embedding_dim] for int64 indices of any shape.
// Init: weight N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

// Zeroes each element with probability p in train mode and scales the rest by 1/(1-p);
// the identity in eval mode. Each call draws a fresh mask with loom::rand under a seed that
// advances per call (the seed is device data, so a new mask does not recompile). The first
// seed is `seed`, or the next one of the global generator (nn::next_seed) when not given.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, std::optional<uint64_t> seed = std::nullopt);
  Tensor forward(const Tensor& input) override;

  double p;

 private:
  uint64_t seed_;
  uint64_t calls_ = 0;
  Tensor seed_now_;  // seed_ + calls_ as device data, advanced in place on the device
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
};

// approximate = true: the tanh approximation (PyTorch's approximate="tanh").
class GELU : public Module {
 public:
  explicit GELU(bool approximate = false) : approximate(approximate) {}
  Tensor forward(const Tensor& input) override;

  bool approximate;
};

// stride 0 (the default) means the kernel size, as in PyTorch.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(IntPair kernel_size, IntPair stride = 0, IntPair padding = 0);
  Tensor forward(const Tensor& input) override;

  Pool2dOptions options;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(IntPair kernel_size, IntPair stride = 0, IntPair padding = 0,
                     bool count_include_pad = true);
  Tensor forward(const Tensor& input) override;

  Pool2dOptions options;
};

// Averages [N, C, H, W] down to [N, C, oh, ow] over PyTorch's adaptive windows
// [floor(i·H/oh), ceil((i+1)·H/oh)). Output 1x1 is one mean over H and W; sizes that divide
// H and W are one reshape and mean per axis; other sizes take a slice per output row/column.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(IntPair output_size);
  Tensor forward(const Tensor& input) override;

  std::array<int64_t, 2> output_size;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override;

  int64_t start_dim, end_dim;
};

// Runs its children in order through Module::forward; they are named "0", "1", ... as in
// torch.nn.Sequential, so their parameters are "0.weight", "1.bias", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // Appends a module named after its position; returns it.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(module);
    return module;
  }
  Tensor forward(const Tensor& input) override;

  std::size_t size() const { return modules_.size(); }
  // Throws loom::Error for an index out of range.
  const std::shared_ptr<Module>& operator[](std::size_t i) const;
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace loom::nn
