// Layers with weight matrices: Linear, Conv2d, Embedding.
#include <loom/nn/init.h>
#include <loom/nn/layers.h>

#include <loom/error.h>

#include <cmath>
#include <string>
#include <vector>

namespace loom::nn {
namespace {

std::string pair_str(const std::array<int64_t, 2>& p) {
  return "(" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ")";
}

void check_positive(const char* layer, const char* what, int64_t v) {
  if (v <= 0)
    throw Error(std::string(layer) + ": expected " + what + " > 0, got " + std::to_string(v));
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features(in_features), out_features(out_features) {
  check_positive("Linear", "in_features", in_features);
  check_positive("Linear", "out_features", out_features);
  // PyTorch's reset_parameters: kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  weight = register_parameter("weight", zeros({out_features, in_features}, default_dtype()));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    double bound = 1 / std::sqrt(static_cast<double>(in_features));
    bias = register_parameter("bias", zeros({out_features}, default_dtype()));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) {
  if (!input.defined()) throw Error("Linear: expected a defined input, got an empty handle");
  if (input.dim() == 0 || input.size(-1) != in_features)
    throw Error("Linear: expected an input [..., " + std::to_string(in_features) + "], got " +
                shape_str(input.shape()));
  guard_settings("Linear's in_features", [this] { return std::vector<double>{static_cast<double>(in_features)}; });
  auto y = matmul(input, transpose(weight, 0, 1));
  if (!bias.defined()) return y;
  // Under autocast a float32 input with bfloat16 parameters gives a float32 product: the bias
  // is added in float32, as conv2d adds it.
  return y + (bias.dtype() == y.dtype() ? bias : bias.to(y.dtype()));
}

Conv2d::Conv2d(const Conv2dOptions& o) : options(o) {
  check_positive("Conv2d", "in_channels", o.in_channels());
  check_positive("Conv2d", "out_channels", o.out_channels());
  check_positive("Conv2d", "groups", o.groups());
  for (int i = 0; i < 2; ++i) {
    if (o.kernel_size()[i] <= 0)
      throw Error("Conv2d: expected a positive kernel_size, got " + pair_str(o.kernel_size()));
    if (o.stride()[i] <= 0) throw Error("Conv2d: expected a positive stride, got " + pair_str(o.stride()));
    if (o.padding()[i] < 0)
      throw Error("Conv2d: expected a non-negative padding, got " + pair_str(o.padding()));
    if (o.dilation()[i] <= 0)
      throw Error("Conv2d: expected a positive dilation, got " + pair_str(o.dilation()));
  }
  if (o.in_channels() % o.groups() != 0 || o.out_channels() % o.groups() != 0)
    throw Error("Conv2d: expected in_channels and out_channels divisible by groups, got in_channels=" +
                std::to_string(o.in_channels()) + ", out_channels=" + std::to_string(o.out_channels()) +
                ", groups=" + std::to_string(o.groups()));
  auto k = o.kernel_size();
  int64_t fan_in = o.in_channels() / o.groups() * k[0] * k[1];
  weight = register_parameter(
      "weight", zeros({o.out_channels(), o.in_channels() / o.groups(), k[0], k[1]}, default_dtype()));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (o.bias()) {
    double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    bias = register_parameter("bias", zeros({o.out_channels()}, default_dtype()));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  if (!input.defined()) throw Error("Conv2d: expected a defined input, got an empty handle");
  if (input.dim() != 4)
    throw Error("Conv2d: expected a 4-D input [N,C,H,W], got " + shape_str(input.shape()));
  if (input.size(1) != options.in_channels())
    throw Error("Conv2d: expected an input with " + std::to_string(options.in_channels()) +
                " channels [N," + std::to_string(options.in_channels()) + ",H,W], got " +
                shape_str(input.shape()));
  guard_settings("Conv2d's options", [this] {
    const auto& o = options;
    std::vector<double> v{static_cast<double>(o.in_channels()), static_cast<double>(o.out_channels()),
                          static_cast<double>(o.groups()), o.bias() ? 1.0 : 0.0};
    for (const auto& pair : {o.kernel_size(), o.stride(), o.padding(), o.dilation()})
      for (int64_t e : pair) v.push_back(static_cast<double>(e));
    return v;
  });
  loom::Conv2dParams op;
  op.stride = options.stride();
  op.padding = options.padding();
  op.dilation = options.dilation();
  op.groups = options.groups();
  return conv2d(input, weight, bias, op);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  check_positive("Embedding", "num_embeddings", num_embeddings);
  check_positive("Embedding", "embedding_dim", embedding_dim);
  weight = register_parameter("weight", zeros({num_embeddings, embedding_dim}, default_dtype()));
  init::normal_(weight, 0, 1);
}

Tensor Embedding::forward(const Tensor& indices) {
  if (!indices.defined()) throw Error("Embedding: expected defined indices, got an empty handle");
  if (indices.dtype() != DType::Int64)
    throw Error(std::string("Embedding: expected int64 indices, got ") + dtype_name(indices.dtype()));
  return embedding(weight, indices);
}

}  // namespace loom::nn
