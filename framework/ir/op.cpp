#include "ir/op.h"

#include <array>
#include <cassert>

namespace loom::ir {
namespace {

using G = OpGroup;
using K = AttrKind;

constexpr std::array<OpInfo, kOpCount> kTable{{
    {Op::DeviceData, "device_data", 0, G::Leaf, false, K::None},
    {Op::Constant, "constant", 0, G::Leaf, false, K::Scalar},
    {Op::Iota, "iota", 0, G::Leaf, false, K::Dim},
    {Op::RandUniform, "rand", 1, G::Random, false, K::Random},
    {Op::RandNormal, "randn", 1, G::Random, false, K::Random},
    {Op::Neg, "neg", 1, G::Unary, true, K::None},
    {Op::Exp, "exp", 1, G::Unary, true, K::None},
    {Op::Log, "log", 1, G::Unary, true, K::None},
    {Op::Sqrt, "sqrt", 1, G::Unary, true, K::None},
    {Op::Rsqrt, "rsqrt", 1, G::Unary, true, K::None},
    {Op::Abs, "abs", 1, G::Unary, true, K::None},
    {Op::Relu, "relu", 1, G::Unary, true, K::None},
    {Op::Sigmoid, "sigmoid", 1, G::Unary, true, K::None},
    {Op::Tanh, "tanh", 1, G::Unary, true, K::None},
    {Op::Silu, "silu", 1, G::Unary, true, K::None},
    {Op::Gelu, "gelu", 1, G::Unary, true, K::None},
    {Op::GeluTanh, "gelu_tanh", 1, G::Unary, true, K::None},
    {Op::Erf, "erf", 1, G::Unary, true, K::None},
    {Op::Sin, "sin", 1, G::Unary, true, K::None},
    {Op::Cos, "cos", 1, G::Unary, true, K::None},
    {Op::LogicalNot, "logical_not", 1, G::Unary, false, K::None},
    {Op::Cast, "cast", 1, G::Unary, true, K::Cast},
    {Op::Add, "add", 2, G::Binary, true, K::None},
    {Op::Sub, "sub", 2, G::Binary, true, K::None},
    {Op::Mul, "mul", 2, G::Binary, true, K::None},
    {Op::Div, "div", 2, G::Binary, true, K::None},
    {Op::Pow, "pow", 2, G::Binary, true, K::None},
    {Op::Maximum, "maximum", 2, G::Binary, true, K::None},
    {Op::Minimum, "minimum", 2, G::Binary, true, K::None},
    {Op::Eq, "eq", 2, G::Binary, false, K::None},
    {Op::Ne, "ne", 2, G::Binary, false, K::None},
    {Op::Lt, "lt", 2, G::Binary, false, K::None},
    {Op::Le, "le", 2, G::Binary, false, K::None},
    {Op::Gt, "gt", 2, G::Binary, false, K::None},
    {Op::Ge, "ge", 2, G::Binary, false, K::None},
    {Op::Where, "where", 3, G::Ternary, true, K::None},
    {Op::Sum, "sum", 1, G::Reduce, true, K::Axes},
    {Op::Mean, "mean", 1, G::Reduce, true, K::Axes},
    {Op::Max, "amax", 1, G::Reduce, true, K::Axes},
    {Op::ArgMax, "argmax", 1, G::Reduce, false, K::Dim},
    {Op::Reshape, "reshape", 1, G::Movement, true, K::Shape},
    {Op::Permute, "permute", 1, G::Movement, true, K::Permute},
    {Op::Slice, "slice", 1, G::Movement, true, K::Slice},
    {Op::Expand, "expand", 1, G::Movement, true, K::Shape},
    {Op::Pad, "pad", 1, G::Movement, true, K::Pad},
    {Op::Concat, "concat", -1, G::Movement, true, K::Dim},
    {Op::Matmul, "matmul", 2, G::Compute, true, K::Matmul},
    {Op::Conv2d, "conv2d", 2, G::Compute, true, K::Conv2d},
    {Op::MaxPool2d, "max_pool2d", 1, G::Compute, true, K::Pool2d},
    {Op::AvgPool2d, "avg_pool2d", 1, G::Compute, true, K::Pool2d},
    {Op::Conv2dGradInput, "conv2d_grad_input", 2, G::Compute, false, K::Conv2dGrad},
    {Op::Conv2dGradWeight, "conv2d_grad_weight", 2, G::Compute, false, K::Conv2dGrad},
    {Op::MaxPool2dGrad, "max_pool2d_grad", 2, G::Compute, false, K::Pool2d},
    {Op::AvgPool2dGrad, "avg_pool2d_grad", 1, G::Compute, false, K::Pool2dGrad},
    {Op::Im2col, "im2col", 1, G::Compute, false, K::Conv2dGrad},
    {Op::Gather, "gather", 2, G::Index, true, K::Dim},
    {Op::IndexSelect, "index_select", 2, G::Index, true, K::Dim},
    {Op::ScatterAdd, "scatter_add", 3, G::Index, true, K::Dim},
    {Op::OneHot, "one_hot", 1, G::Index, false, K::OneHot},
}};

constexpr bool table_in_enum_order() {
  for (int i = 0; i < kOpCount; ++i)
    if (static_cast<int>(kTable[i].op) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "op table rows must follow the Op enum order");

}  // namespace

const OpInfo& op_info(Op op) {
  auto i = static_cast<int>(op);
  assert(i >= 0 && i < kOpCount && "op out of range");
  return kTable[i];
}

}  // namespace loom::ir
