// Normalisation layers: BatchNorm2d, LayerNorm, RMSNorm.
#include <loom/nn/layers.h>

#include <loom/autograd.h>
#include <loom/compile.h>
#include <loom/error.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace loom::nn {
namespace {

// `weight`: the layer's weight (undefined for a LayerNorm without one), whose dtype the input
// must have.
void check_input(const char* layer, const Tensor& x, const Tensor& weight) {
  if (!x.defined()) throw Error(std::string(layer) + ": expected a defined input, got an empty handle");
  if (!is_floating(x.dtype()))
    throw Error(std::string(layer) + ": expected a floating-point input, got " + dtype_name(x.dtype()));
  if (weight.defined() && x.dtype() != weight.dtype())
    throw Error(std::string(layer) + ": expected a " + dtype_name(weight.dtype()) + " input (the layer's dtype), got " +
                dtype_name(x.dtype()) + "; convert the input (x.to(...)) or the layer");
}

}  // namespace

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum)
    : num_features(num_features), eps(eps), momentum(momentum) {
  if (num_features <= 0)
    throw Error("BatchNorm2d: expected num_features > 0, got " + std::to_string(num_features));
  if (eps < 0) throw Error("BatchNorm2d: expected eps >= 0, got " + std::to_string(eps));
  if (momentum < 0 || momentum > 1)
    throw Error("BatchNorm2d: expected momentum in [0, 1], got " + std::to_string(momentum));
  weight = register_parameter("weight", ones({num_features}, default_dtype()));
  bias = register_parameter("bias", zeros({num_features}, default_dtype()));
  running_mean = register_buffer("running_mean", zeros({num_features}, default_dtype()));
  running_var = register_buffer("running_var", ones({num_features}, default_dtype()));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::Int64));
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  check_input("BatchNorm2d", x, weight);
  if (x.dim() != 4 || x.size(1) != num_features)
    throw Error("BatchNorm2d: expected a 4-D input [N," + std::to_string(num_features) + ",H,W], got " +
                shape_str(x.shape()));
  const Shape per_channel{1, num_features, 1, 1};
  // The branch below is host control flow: a captured step is traced again when it turns.
  guard_settings("BatchNorm2d's training mode", [this] { return std::vector<double>{is_training() ? 1.0 : 0.0}; });
  guard_settings("BatchNorm2d's eps and momentum", [this] { return std::vector<double>{eps, momentum}; });
  if (!is_training()) {
    auto scale = rsqrt(running_var.reshape(per_channel) + eps) * weight.reshape(per_channel);
    return (x - running_mean.reshape(per_channel)) * scale + bias.reshape(per_channel);
  }
  const int64_t n = x.size(0) * x.size(2) * x.size(3);
  if (n <= 1)
    throw Error("BatchNorm2d: expected more than 1 value per channel when training, got input " +
                shape_str(x.shape()));
  auto mean = x.mean({0, 2, 3}, true);
  auto centered = x - mean;
  // Biased: normalisation uses it. The variance reads the mean detached: the same value, and
  // the same gradient, since the variance's derivative through the mean, -2 * mean(centered),
  // is zero. Its backward then needs sum(g) and sum(g * centered), which do not depend on each
  // other (one pass, compiler/stack_reductions.h), where the chain rule through the mean
  // would sum the whole input gradient after the variance's coefficient.
  auto centered_const_mean = x - mean.detach();
  auto var = (centered_const_mean * centered_const_mean).mean({0, 2, 3}, true);
  {
    // PyTorch's rule: the running variance takes the unbiased batch variance.
    NoGradGuard no_grad;
    auto batch_mean = mean.detach().reshape({num_features});
    auto batch_var = var.detach().reshape({num_features});
    const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
    running_mean.assign(running_mean * (1 - momentum) + batch_mean * momentum);
    running_var.assign(running_var * (1 - momentum) + batch_var * (momentum * unbias));
    num_batches_tracked.assign(num_batches_tracked + 1);
  }
  // One per-channel scale, as PyTorch's CPU kernel computes it: the per-element work is one
  // multiply and one add (and the backward one multiply fewer), not two multiplies and an add.
  auto scale = rsqrt(var + eps) * weight.reshape(per_channel);
  return centered * scale + bias.reshape(per_channel);
}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool with_bias)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
  if (this->normalized_shape.empty())
    throw Error("LayerNorm: expected a non-empty normalized_shape, got []");
  for (auto d : this->normalized_shape)
    if (d <= 0)
      throw Error("LayerNorm: expected positive sizes in normalized_shape, got " +
                  shape_str(this->normalized_shape));
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(this->normalized_shape, default_dtype()));
    if (with_bias) bias = register_parameter("bias", zeros(this->normalized_shape, default_dtype()));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input("LayerNorm", x, weight);
  const auto k = static_cast<int64_t>(normalized_shape.size());
  if (x.dim() < k || !std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k))
    throw Error("LayerNorm: expected an input [..., " + shape_str(normalized_shape).substr(1) + ", got " +
                shape_str(x.shape()));
  guard_settings("LayerNorm's normalized_shape and eps", [this] {
    std::vector<double> v(normalized_shape.begin(), normalized_shape.end());
    v.push_back(eps);
    return v;
  });
  std::vector<int64_t> axes;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) axes.push_back(d);
  auto mean = x.mean(axes, true);
  auto centered = x - mean;
  auto var = (centered * centered).mean(axes, true);
  auto y = centered * rsqrt(var + eps);
  if (weight.defined()) y = y * weight;
  if (bias.defined()) y = y + bias;
  return y;
}

RMSNorm::RMSNorm(int64_t dim, double eps) : dim(dim), eps(eps) {
  if (dim <= 0) throw Error("RMSNorm: expected dim > 0, got " + std::to_string(dim));
  weight = register_parameter("weight", ones({dim}, default_dtype()));
}

Tensor RMSNorm::forward(const Tensor& x) {
  check_input("RMSNorm", x, weight);
  if (x.dim() == 0 || x.size(-1) != dim)
    throw Error("RMSNorm: expected an input [..., " + std::to_string(dim) + "], got " + shape_str(x.shape()));
  guard_settings("RMSNorm's dim and eps", [this] { return std::vector<double>{static_cast<double>(dim), eps}; });
  return x * rsqrt((x * x).mean({-1}, true) + eps) * weight;
}

}  // namespace loom::nn
