// The op enum and the op table: one row per op with its name, arity, group and attribute kind.
// Shape inference (shape_infer.cpp) and kernels (runtime/kernels.cpp) are exhaustive
// switches over Op, so a new op that misses either fails to compile (-Werror=switch).
//
// Operand conventions, which shape inference checks and kernels rely on. Each op's attribute
// struct is named in its op table row (op.cpp) and documented in attr.h.
//   DeviceData        leaf bound to a device buffer (payload), hashed by dtype and shape.
//   Constant          leaf; ScalarAttr's value filled over the node's shape.
//   Iota              leaf; DimAttr: out[idx] = idx[dim].
//   RandUniform/Normal  operand 0 = seed (int64, 0-d); out[i] is a function of (seed, i) only;
//                     RandomAttr: the result's shape and dtype.
//   unary             one operand, same dtype and shape as the result.
//   Cast              one operand of any dtype; CastAttr: the result's dtype.
//   binary            two operands with identical shape and dtype (the API broadcasts first);
//                     comparisons produce Bool.
//   Where             (cond Bool, a, b), all one shape; a and b one dtype.
//   Sum/Mean/Max      AxesAttr: sorted unique axes; reduced axes keep size 1 (keepdim).
//   ArgMax            DimAttr; int64 result, the axis kept with size 1; first max wins.
//   Reshape           ShapeAttr; same element count; row-major order unchanged.
//   Permute           PermuteAttr; out.shape[i] = in.shape[perm[i]].
//   Slice             SliceAttr (steps > 0); out[idx] = in[start + idx*step] per dim.
//   Expand            ShapeAttr; same rank; each input dim is 1 or equal to the output's.
//   Pad               PadAttr (lo, hi >= 0 per dim, and the fill value).
//   Concat            n >= 1 operands, DimAttr.
//   Matmul            [B..., M, K] x [B..., K, N] -> [B..., M, N]; rank >= 2, equal batch dims;
//                     MatmulAttr (operands read transposed; only the compiler sets it).
//   Conv2d            input [N,C,H,W], weight [O,C/g,kh,kw]; Conv2dAttr.
//   MaxPool2d         [N,C,H,W]; Pool2dAttr; padding never wins.
//   AvgPool2d         as MaxPool2d; Pool2dAttr's count_include_pad picks the divisor.
//   Conv2dGradInput   (grad_out [N,O,Ho,Wo], weight [O,C/g,kh,kw]) -> [N,C,H,W]: the gradient
//                     of Conv2d's input; Conv2dGradAttr: Conv2d's attribute and (H, W).
//   Conv2dGradWeight  (input [N,C,H,W], grad_out [N,O,Ho,Wo]) -> [O,C/g,kh,kw]: the gradient
//                     of Conv2d's weight; Conv2dGradAttr: Conv2d's attribute and (kh, kw).
//   MaxPool2dGrad     (input [N,C,H,W], grad_out [N,C,Ho,Wo]) -> [N,C,H,W]: each window's
//                     gradient goes to its first maximum; MaxPool2d's Pool2dAttr.
//   AvgPool2dGrad     (grad_out [N,C,Ho,Wo]) -> [N,C,H,W]; Pool2dGradAttr: AvgPool2d's and (H, W).
//   Im2col            input [N,C,H,W] -> [C*kh*kw, N*Ho*Wo]: column (n, y, x) holds what the
//                     conv's window at output (y, x) of image n reads, row (c, i, j) the
//                     window's tap (i, j) of channel c, zero in the padding; Conv2dGradAttr:
//                     the conv's attribute (groups 1, [N,C,H,W]) and (kh, kw). Made by the
//                     compiler only (compiler/conv_im2col.h): the conv is then one Matmul.
//   Gather            (x, index int64) same rank; DimAttr; result shape = index's.
//   IndexSelect       (x, index int64 1-D); DimAttr.
//   ScatterAdd        (self, index int64, src) with index.shape == src.shape; DimAttr.
//   OneHot            (indices int64); OneHotAttr; int64 result [..., C].
#pragma once

#include "ir/attr.h"

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
  Conv2dGradInput, Conv2dGradWeight, MaxPool2dGrad, AvgPool2dGrad, Im2col,
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
  AttrKind attr;        // the attribute struct it takes (attr.h); make_node checks it
};

const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
// Unary, binary and ternary (Where) ops: each result element from the operands' elements at
// the same position.
inline bool is_elementwise(Op op) {
  const auto g = op_info(op).group;
  return g == OpGroup::Unary || g == OpGroup::Binary || g == OpGroup::Ternary;
}

}  // namespace loom::ir
