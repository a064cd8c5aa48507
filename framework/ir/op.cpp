#include "ir/op.h"

#include <array>
#include <cassert>

namespace loom::ir {
namespace {

using G = OpGroup;

constexpr std::array<OpInfo, kOpCount> kTable{{
    {Op::DeviceData, "device_data", 0, G::Leaf, false},
    {Op::Constant, "constant", 0, G::Leaf, false},
    {Op::Iota, "iota", 0, G::Leaf, false},
    {Op::RandUniform, "rand", 1, G::Random, false},
    {Op::RandNormal, "randn", 1, G::Random, false},
    {Op::Neg, "neg", 1, G::Unary, true},
    {Op::Exp, "exp", 1, G::Unary, true},
    {Op::Log, "log", 1, G::Unary, true},
    {Op::Sqrt, "sqrt", 1, G::Unary, true},
    {Op::Rsqrt, "rsqrt", 1, G::Unary, true},
    {Op::Abs, "abs", 1, G::Unary, true},
    {Op::Relu, "relu", 1, G::Unary, true},
    {Op::Sigmoid, "sigmoid", 1, G::Unary, true},
    {Op::Tanh, "tanh", 1, G::Unary, true},
    {Op::Silu, "silu", 1, G::Unary, true},
    {Op::Gelu, "gelu", 1, G::Unary, true},
    {Op::GeluTanh, "gelu_tanh", 1, G::Unary, true},
    {Op::Erf, "erf", 1, G::Unary, true},
    {Op::Sin, "sin", 1, G::Unary, true},
    {Op::Cos, "cos", 1, G::Unary, true},
    {Op::LogicalNot, "logical_not", 1, G::Unary, false},
    {Op::Cast, "cast", 1, G::Unary, true},
    {Op::Add, "add", 2, G::Binary, true},
    {Op::Sub, "sub", 2, G::Binary, true},
    {Op::Mul, "mul", 2, G::Binary, true},
    {Op::Div, "div", 2, G::Binary, true},
    {Op::Pow, "pow", 2, G::Binary, true},
    {Op::Maximum, "maximum", 2, G::Binary, true},
    {Op::Minimum, "minimum", 2, G::Binary, true},
    {Op::Eq, "eq", 2, G::Binary, false},
    {Op::Ne, "ne", 2, G::Binary, false},
    {Op::Lt, "lt", 2, G::Binary, false},
    {Op::Le, "le", 2, G::Binary, false},
    {Op::Gt, "gt", 2, G::Binary, false},
    {Op::Ge, "ge", 2, G::Binary, false},
    {Op::Where, "where", 3, G::Ternary, true},
    {Op::Sum, "sum", 1, G::Reduce, true},
    {Op::Mean, "mean", 1, G::Reduce, true},
    {Op::Max, "amax", 1, G::Reduce, true},
    {Op::ArgMax, "argmax", 1, G::Reduce, false},
    {Op::Reshape, "reshape", 1, G::Movement, true},
    {Op::Permute, "permute", 1, G::Movement, true},
    {Op::Slice, "slice", 1, G::Movement, true},
    {Op::Expand, "expand", 1, G::Movement, true},
    {Op::Pad, "pad", 1, G::Movement, true},
    {Op::Concat, "concat", -1, G::Movement, true},
    {Op::Matmul, "matmul", 2, G::Compute, true},
    {Op::Conv2d, "conv2d", 2, G::Compute, true},
    {Op::MaxPool2d, "max_pool2d", 1, G::Compute, true},
    {Op::AvgPool2d, "avg_pool2d", 1, G::Compute, true},
    {Op::Conv2dGradInput, "conv2d_grad_input", 2, G::Compute, false},
    {Op::Conv2dGradWeight, "conv2d_grad_weight", 2, G::Compute, false},
    {Op::MaxPool2dGrad, "max_pool2d_grad", 2, G::Compute, false},
    {Op::AvgPool2dGrad, "avg_pool2d_grad", 1, G::Compute, false},
    {Op::Gather, "gather", 2, G::Index, true},
    {Op::IndexSelect, "index_select", 2, G::Index, true},
    {Op::ScatterAdd, "scatter_add", 3, G::Index, true},
    {Op::OneHot, "one_hot", 1, G::Index, false},
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
