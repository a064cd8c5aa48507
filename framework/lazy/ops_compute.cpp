// Compute ops: matmul, convolution and pooling. matmul and conv2d compute in bfloat16 inside
// an Autocast scope (autocast.cpp).
#include "lazy/ops_util.h"

namespace loom {

using ir::Op;
using lazy::apply;
using lazy::fail;

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) fail("matmul", "expected defined tensors, got an empty handle");
  // Autocast: the product of the bfloat16 casts, rounded to bfloat16, handed back as float32.
  if (lazy::autocasts(a, b))
    return matmul(a.to(DType::BFloat16), b.to(DType::BFloat16)).to(DType::Float32);
  if (a.dim() == 0 || b.dim() == 0)
    fail("matmul", "expected operands of at least 1 dimension, got " + shape_str(a.shape()) +
                       " and " + shape_str(b.shape()));
  if (a.dtype() != b.dtype())
    fail("matmul", std::string("expected operands of one dtype, got ") + dtype_name(a.dtype()) +
                       " and " + dtype_name(b.dtype()));
  // NumPy rules: a 1-D left operand is a row, a 1-D right operand a column; both are
  // dropped from the result.
  Tensor x = a.dim() == 1 ? reshape(a, {1, a.shape()[0]}) : a;
  Tensor y = b.dim() == 1 ? reshape(b, {b.shape()[0], 1}) : b;
  int64_t k = x.shape().back();
  if (y.shape()[y.dim() - 2] != k)
    fail("matmul", "expected a [..., M, K] x [..., K, N] product, got " + shape_str(a.shape()) +
                       " and " + shape_str(b.shape()));
  // A batch of rows times one matrix (a Linear layer on [B, S, K]) is one [B*S, K] x [K, N]
  // product, not B products against B copies of the matrix: one large GEMM, and a weight
  // gradient that is one GEMM too instead of B of them summed over the batch.
  if (x.dim() > 2 && y.dim() == 2) {
    Shape out(x.shape().begin(), x.shape().end() - 1);
    int64_t rows = 1;
    for (auto d : out) rows *= d;
    if (b.dim() > 1) out.push_back(y.shape().back());
    return reshape(apply(Op::Matmul, {reshape(x, {rows, k}), y}, ir::MatmulAttr{}), out);
  }
  Shape xb(x.shape().begin(), x.shape().end() - 2);
  Shape yb(y.shape().begin(), y.shape().end() - 2);
  Shape batch = lazy::broadcast_shapes(xb, yb, "matmul");
  Shape xs = batch, ys = batch;
  xs.insert(xs.end(), x.shape().end() - 2, x.shape().end());
  ys.insert(ys.end(), y.shape().end() - 2, y.shape().end());
  auto r = apply(Op::Matmul, {expand(x, xs), expand(y, ys)}, ir::MatmulAttr{});
  Shape out = batch;
  if (a.dim() > 1) out.push_back(x.shape()[x.dim() - 2]);
  if (b.dim() > 1) out.push_back(y.shape().back());
  return reshape(r, out);
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& o) {
  if (!input.defined() || !weight.defined()) fail("conv2d", "expected defined input and weight");
  const ir::Conv2dAttr attr{.stride = {o.stride[0], o.stride[1]},
                            .padding = {o.padding[0], o.padding[1]},
                            .dilation = {o.dilation[0], o.dilation[1]},
                            .groups = o.groups};
  // Autocast: as matmul, the convolution of the bfloat16 casts, back as float32 (the bias is
  // added in float32).
  const bool cast = lazy::autocasts(input, weight);
  auto y = cast ? apply(Op::Conv2d, {input.to(DType::BFloat16), weight.to(DType::BFloat16)}, attr)
                      .to(DType::Float32)
                : apply(Op::Conv2d, {input, weight}, attr);
  if (!bias.defined()) return y;
  if (bias.shape() != Shape{weight.shape()[0]})
    fail("conv2d", "expected a bias of shape [" + std::to_string(weight.shape()[0]) + "], got " +
                       shape_str(bias.shape()));
  const Tensor b = cast && bias.dtype() == DType::BFloat16 ? bias.to(DType::Float32) : bias;
  return y + reshape(b, {1, weight.shape()[0], 1, 1});
}

namespace {
Tensor pool(Op op, const Tensor& x, const Pool2dOptions& o) {
  if (!x.defined()) fail(ir::op_name(op), "expected a defined tensor, got an empty handle");
  int64_t sh = o.stride[0] ? o.stride[0] : o.kernel[0];
  int64_t sw = o.stride[1] ? o.stride[1] : o.kernel[1];
  ir::Pool2dAttr attr{.kernel = {o.kernel[0], o.kernel[1]}, .stride = {sh, sw},
                      .padding = {o.padding[0], o.padding[1]}};
  if (op == Op::AvgPool2d) attr.count_include_pad = o.count_include_pad;
  return apply(op, {x}, attr);
}
}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) { return pool(Op::MaxPool2d, x, o); }
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) { return pool(Op::AvgPool2d, x, o); }

}  // namespace loom
