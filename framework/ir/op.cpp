#include "ir/op.h"

#include <array>
#include <cassert>

namespace loom::ir {
namespace {

using G = OpGroup;

constexpr std::array<OpInfo, kOpCount> kTable{{
    {Op::DeviceData, "device_data", 0, G::Leaf},
    {Op::Constant, "constant", 0, G::Leaf},
    {Op::Iota, "iota", 0, G::Leaf},
    {Op::RandUniform, "rand", 1, G::Random},
    {Op::RandNormal, "randn", 1, G::Random},
    {Op::Neg, "neg", 1, G::Unary},
    {Op::Exp, "exp", 1, G::Unary},
    {Op::Log, "log", 1, G::Unary},
    {Op::Sqrt, "sqrt", 1, G::Unary},
    {Op::Rsqrt, "rsqrt", 1, G::Unary},
    {Op::Abs, "abs", 1, G::Unary},
    {Op::Relu, "relu", 1, G::Unary},
    {Op::Sigmoid, "sigmoid", 1, G::Unary},
    {Op::Tanh, "tanh", 1, G::Unary},
    {Op::Silu, "silu", 1, G::Unary},
    {Op::Gelu, "gelu", 1, G::Unary},
    {Op::GeluTanh, "gelu_tanh", 1, G::Unary},
    {Op::Sin, "sin", 1, G::Unary},
    {Op::Cos, "cos", 1, G::Unary},
    {Op::LogicalNot, "logical_not", 1, G::Unary},
    {Op::Cast, "cast", 1, G::Unary},
    {Op::Add, "add", 2, G::Binary},
    {Op::Sub, "sub", 2, G::Binary},
    {Op::Mul, "mul", 2, G::Binary},
    {Op::Div, "div", 2, G::Binary},
    {Op::Pow, "pow", 2, G::Binary},
    {Op::Maximum, "maximum", 2, G::Binary},
    {Op::Minimum, "minimum", 2, G::Binary},
    {Op::Eq, "eq", 2, G::Binary},
    {Op::Ne, "ne", 2, G::Binary},
    {Op::Lt, "lt", 2, G::Binary},
    {Op::Le, "le", 2, G::Binary},
    {Op::Gt, "gt", 2, G::Binary},
    {Op::Ge, "ge", 2, G::Binary},
    {Op::Where, "where", 3, G::Ternary},
    {Op::Sum, "sum", 1, G::Reduce},
    {Op::Mean, "mean", 1, G::Reduce},
    {Op::Max, "amax", 1, G::Reduce},
    {Op::ArgMax, "argmax", 1, G::Reduce},
    {Op::Reshape, "reshape", 1, G::Movement},
    {Op::Permute, "permute", 1, G::Movement},
    {Op::Slice, "slice", 1, G::Movement},
    {Op::Expand, "expand", 1, G::Movement},
    {Op::Pad, "pad", 1, G::Movement},
    {Op::Concat, "concat", -1, G::Movement},
    {Op::Matmul, "matmul", 2, G::Compute},
    {Op::Conv2d, "conv2d", 2, G::Compute},
    {Op::MaxPool2d, "max_pool2d", 1, G::Compute},
    {Op::AvgPool2d, "avg_pool2d", 1, G::Compute},
    {Op::Gather, "gather", 2, G::Index},
    {Op::IndexSelect, "index_select", 2, G::Index},
    {Op::ScatterAdd, "scatter_add", 3, G::Index},
    {Op::OneHot, "one_hot", 1, G::Index},
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
