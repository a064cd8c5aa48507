// run_kernel: the one exhaustive switch from an op to its CPU kernel. The kernels live in
// kernels_<group>.cpp; this file only routes operands and attributes to them, so a new op
// that lacks a kernel fails to compile here (-Werror=switch).
#include "runtime/cpu/kernels.h"

#include "ir/unreachable.h"
#include "runtime/cpu/kernels_fused.h"
#include "runtime/cpu/kernels_impl.h"

#include <cassert>

namespace loom::runtime {

void run_kernel(ir::Op op, const ir::Attr& attr, std::span<const TensorView> in,
                const TensorView& out) {
  using ir::Op;
  assert((ir::op_info(op).arity < 0 || in.size() == static_cast<std::size_t>(ir::op_info(op).arity)) &&
         "run_kernel: wrong number of operands");
  switch (op) {
    case Op::DeviceData:  // bound to a buffer, never computed
    case Op::Count_:
      LOOM_UNREACHABLE("run_kernel: device data and Count_ have no kernel");

    case Op::Constant: return fill_value(out, attr.get<ir::ScalarAttr>().value);
    case Op::Iota: return iota_kernel(attr, out);

    case Op::RandUniform: return rand_uniform_kernel(in[0], out);
    case Op::RandNormal: return rand_normal_kernel(in[0], out);

    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Abs:
    case Op::Relu:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::Silu:
    case Op::Gelu:
    case Op::GeluTanh:
    case Op::Erf:
    case Op::Sin:
    case Op::Cos:
    case Op::LogicalNot:
      return elementwise_kernel(op, in, out);
    case Op::Cast: return cast_kernel(in[0], out);

    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Pow:
    case Op::Maximum:
    case Op::Minimum:
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
    case Op::Where:
      return elementwise_kernel(op, in, out);

    case Op::Sum:
    case Op::Mean:
    case Op::Max:
      return reduce_kernel(op, attr, in[0], out);
    case Op::ArgMax: return argmax_kernel(attr, in[0], out);

    case Op::Reshape: return reshape_kernel(in[0], out);
    case Op::Permute: return permute_kernel(attr, in[0], out);
    case Op::Slice: return slice_kernel(attr, in[0], out);
    case Op::Expand: return expand_kernel(in[0], out);
    case Op::Pad: return pad_kernel(attr, in[0], out);
    case Op::Concat: return concat_kernel(attr, in, out);

    case Op::Matmul: return matmul_kernel(attr, in[0], in[1], out);
    case Op::Conv2d: return conv2d_kernel(attr, in[0], in[1], out);
    case Op::MaxPool2d: return max_pool2d_kernel(attr, in[0], out);
    case Op::AvgPool2d: return avg_pool2d_kernel(attr, in[0], out);
    case Op::Conv2dGradInput: return conv2d_grad_input_kernel(attr, in[0], in[1], out);
    case Op::Conv2dGradWeight: return conv2d_grad_weight_kernel(attr, in[0], in[1], out);
    case Op::MaxPool2dGrad: return max_pool2d_grad_kernel(attr, in[0], in[1], out);
    case Op::AvgPool2dGrad: return avg_pool2d_grad_kernel(attr, in[0], out);
    case Op::Im2col: return im2col_kernel(attr, in[0], out);

    case Op::Gather: return gather_kernel(attr, in[0], in[1], out);
    case Op::IndexSelect: return index_select_kernel(attr, in[0], in[1], out);
    case Op::ScatterAdd: return scatter_add_kernel(attr, in[0], in[1], in[2], out);
    case Op::OneHot: return one_hot_kernel(attr, in[0], out);
  }
  LOOM_UNREACHABLE("run_kernel: op out of range");
}

}  // namespace loom::runtime
