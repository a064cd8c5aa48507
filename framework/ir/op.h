// The op enum and the op table: one row per op with its name, arity and group.
// Shape inference (shape_infer.cpp) and kernels (runtime/kernels.cpp) are exhaustive
// switches over Op, so a new op that misses either fails to compile (-Werror=switch).
//
// Operand and attribute conventions, which shape inference checks and kernels rely on:
//   DeviceData        leaf bound to a device buffer (payload), hashed by dtype and shape.
//   Constant          leaf; attr.scalar is the value, filled over the node's shape.
//   Iota              leaf; attr.ints = {dim}: out[idx] = idx[dim].
//   RandUniform/Normal  operand 0 = seed (int64, 0-d); out[i] is a function of (seed, i) only;
//                     attr.ints = result shape, attr.scalar = result DType as a number.
//   unary             one operand, same dtype and shape as the result.
//   Cast              one operand of any dtype; attr.ints = {result DType as a number}.
//   binary            two operands with identical shape and dtype (the API broadcasts first);
//                     comparisons produce Bool.
//   Where             (cond Bool, a, b), all one shape; a and b one dtype.
//   Sum/Mean/Max      attr.ints = sorted unique axes; reduced axes keep size 1 (keepdim).
//   ArgMax            attr.ints = {axis}; int64 result, axis kept with size 1; first max wins.
//   Reshape           same element count; row-major order unchanged.
//   Permute           attr.ints = perm; out.shape[i] = in.shape[perm[i]].
//   Slice             attr.ints = {start_0..start_{r-1}, step_0..step_{r-1}, size_0..size_{r-1}}
//                     (steps > 0); out[idx] = in[start + idx*step] per dim; sizes = out shape.
//   Expand            same rank; each input dim is 1 or equal to the output's.
//   Pad               attr.ints = {lo_0, hi_0, lo_1, hi_1, ...} (>= 0), attr.scalar = value.
//   Concat            n >= 1 operands, attr.ints = {axis}.
//   Matmul            [B..., M, K] x [B..., K, N] -> [B..., M, N]; rank >= 2, equal batch dims.
//   Conv2d            input [N,C,H,W], weight [O,C/g,kh,kw];
//                     attr.ints = {stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups}.
//   MaxPool2d         [N,C,H,W]; attr.ints = {kh, kw, sh, sw, ph, pw}; padding never wins.
//   AvgPool2d         as MaxPool2d plus a 7th int count_include_pad (0/1).
//   Conv2dGradInput   (grad_out [N,O,Ho,Wo], weight [O,C/g,kh,kw]) -> [N,C,H,W]: the gradient
//                     of Conv2d's input; attr.ints = Conv2d's 7 ints + {H, W}.
//   Conv2dGradWeight  (input [N,C,H,W], grad_out [N,O,Ho,Wo]) -> [O,C/g,kh,kw]: the gradient
//                     of Conv2d's weight; attr.ints = Conv2d's 7 ints + {kh, kw}.
//   MaxPool2dGrad     (input [N,C,H,W], grad_out [N,C,Ho,Wo]) -> [N,C,H,W]: each window's
//                     gradient goes to its first maximum; attr.ints = MaxPool2d's.
//   AvgPool2dGrad     (grad_out [N,C,Ho,Wo]) -> [N,C,H,W]; attr.ints = AvgPool2d's 7 + {H, W}.
//   Gather            (x, index int64) same rank; attr.ints = {dim}; result shape = index's.
//   IndexSelect       (x, index int64 1-D); attr.ints = {dim}.
//   ScatterAdd        (self, index int64, src) with index.shape == src.shape; attr.ints = {dim}.
//   OneHot            (indices int64); attr.ints = {num_classes}; int64 result [..., C].
#pragma once

#include <cstdint>

namespace loom::ir {

enum class Op : uint8_t {
  // leaves
  DeviceData, Constant, Iota,
  // random (seeded)
  RandUniform, RandNormal,
  // unary
  Neg, Exp, Log, Sqrt, Rsqrt, Abs, Relu, Sigmoid, Tanh, Silu, Gelu, GeluTanh, Erf, Sin, Cos,
  LogicalNot, Cast,
  // binary
  Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge,
  // ternary
  Where,
  // reductions
  Sum, Mean, Max, ArgMax,
  // movement
  Reshape, Permute, Slice, Expand, Pad, Concat,
  // compute
  Matmul, Conv2d, MaxPool2d, AvgPool2d,
  Conv2dGradInput, Conv2dGradWeight, MaxPool2dGrad, AvgPool2dGrad,
  // indexing
  Gather, IndexSelect, ScatterAdd, OneHot,
  Count_
};

inline constexpr int kOpCount = static_cast<int>(Op::Count_);

enum class OpGroup : uint8_t { Leaf, Random, Unary, Binary, Ternary, Reduce, Movement, Compute, Index };

struct OpInfo {
  Op op;
  const char* name;  // PyTorch's name where one exists
  int arity;         // -1: variadic
  OpGroup group;
  bool differentiable;  // has a gradient rule (autograd/grad_rules.cpp)
};

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }

}  // namespace loom::ir
