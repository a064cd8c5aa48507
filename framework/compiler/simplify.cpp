#include "compiler/simplify.h"

#include "ir/unreachable.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

class Simplifier {
 public:
  explicit Simplifier(ir::Program& p) : p_(p), n_in_(static_cast<int>(p.inputs.size())) {}

  void run() {
    for (auto& in : p_.instrs) {
      rewrite(in);
      forward_aliases(in);
    }
  }

 private:
  ir::Instr* producer(int slot) { return slot >= n_in_ ? &p_.instrs[slot - n_in_] : nullptr; }

  // The scalar of a constant operand (possibly reshaped and broadcast).
  std::optional<double> constant(int slot) {
    const ir::Instr* src = producer(slot);
    while (src && (src->op == Op::Expand || src->op == Op::Reshape)) src = producer(src->args[0]);
    if (src && src->op == Op::Constant) return src->attr.get<ir::ScalarAttr>().value;
    return std::nullopt;
  }

  bool same_type(const ir::Instr& in, int slot) const {
    const ir::SlotType t = p_.slot_type(slot);
    return t.dtype == in.dtype && t.shape == in.shape;
  }

  // `in` becomes a view of `slot`, which holds its value: a reshape of what slot's own chain
  // of reshapes starts from (reshapes compose, and all of them share that memory).
  void alias(ir::Instr& in, int slot) {
    for (const ir::Instr* src = producer(slot); src && src->op == Op::Reshape; src = producer(slot))
      slot = src->args[0];
    in.op = Op::Reshape;
    in.args = {slot};
    in.attr = ir::ShapeAttr{in.shape};
    in.fusion = nullptr;
  }

  // An operand that is a Reshape to its own operand's shape (what alias() leaves, or a
  // reshape the trace asked for to the same shape) is read as that operand: the value and its
  // layout are the same, and an elementwise reader then fuses with its producer (an SGD
  // update's decayed gradient, times a dampening factor of 1, is computed inside the momentum
  // update instead of being stored and loaded back). Program outputs keep their slots.
  void forward_aliases(ir::Instr& in) {
    for (auto& a : in.args)
      for (const ir::Instr* src = producer(a);
           src && src->op == Op::Reshape && same_type(*src, src->args[0]); src = producer(a))
        a = src->args[0];
  }

  static bool identity(const std::vector<int64_t>& perm) {
    for (std::size_t i = 0; i < perm.size(); ++i)
      if (perm[i] != static_cast<int64_t>(i)) return false;
    return true;
  }

  void rewrite(ir::Instr& in) {
    switch (in.op) {
      case Op::Reshape: {
        const ir::Instr* src = producer(in.args[0]);
        if (src && src->op == Op::Reshape) in.args = {src->args[0]};
        return;
      }
      case Op::Permute: {
        const ir::Instr* src = producer(in.args[0]);
        auto& perm = in.attr.get<ir::PermuteAttr>().perm;
        if (src && src->op == Op::Permute) {  // out[i] = x[inner[outer[i]]]
          const auto& inner = src->attr.get<ir::PermuteAttr>().perm;
          std::vector<int64_t> composed(perm.size());
          for (std::size_t i = 0; i < composed.size(); ++i)
            composed[i] = inner[static_cast<std::size_t>(perm[i])];
          in.args = {src->args[0]};
          perm = std::move(composed);
        }
        if (identity(perm)) alias(in, in.args[0]);
        return;
      }
      case Op::Expand:
        if (same_type(in, in.args[0])) alias(in, in.args[0]);
        return;
      case Op::Cast: {
        if (same_type(in, in.args[0])) {
          alias(in, in.args[0]);
          return;
        }
        // A round trip through a wider float type: bfloat16 → float → bfloat16 is the value.
        const ir::Instr* src = producer(in.args[0]);
        if (src && src->op == Op::Cast && same_type(in, src->args[0]) &&
            in.dtype == DType::BFloat16 &&
            (src->dtype == DType::Float32 || src->dtype == DType::Float64))
          alias(in, src->args[0]);
        return;
      }
      case Op::Slice: {  // out[i] = inner[s2 + i * st2] = x[s1 + (s2 + i * st2) * st1]
        const ir::Instr* src = producer(in.args[0]);
        if (!src || src->op != Op::Slice) return;
        const auto& inner = src->attr.get<ir::SliceAttr>();
        auto& outer = in.attr.get<ir::SliceAttr>();
        for (std::size_t d = 0; d < outer.starts.size(); ++d) {
          outer.starts[d] = inner.starts[d] + outer.starts[d] * inner.steps[d];
          outer.steps[d] *= inner.steps[d];
        }
        in.args = {src->args[0]};
        return;
      }
      case Op::Neg: {
        const ir::Instr* src = producer(in.args[0]);
        if (src && src->op == Op::Neg) alias(in, src->args[0]);
        return;
      }
      case Op::Mul:
        for (int k = 0; k < 2; ++k)
          if (constant(in.args[k]) == 1.0 && same_type(in, in.args[1 - k])) {
            alias(in, in.args[1 - k]);
            return;
          }
        return;
      case Op::Div:
        if (constant(in.args[1]) == 1.0 && same_type(in, in.args[0])) alias(in, in.args[0]);
        return;
      case Op::Sub: {  // x - (+0) is x, -0 included; x - (-0) is x + 0, which is not
        const auto c = constant(in.args[1]);
        if (c == 0.0 && !std::signbit(*c) && same_type(in, in.args[0])) alias(in, in.args[0]);
        return;
      }
      // Nothing to simplify (a new op joins this list or gets a rule above).
      case Op::DeviceData: case Op::Constant: case Op::Iota:
      case Op::RandUniform: case Op::RandNormal:
      case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Abs: case Op::Relu:
      case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Gelu: case Op::GeluTanh:
      case Op::Erf: case Op::Sin: case Op::Cos: case Op::LogicalNot:
      case Op::Add: case Op::Pow: case Op::Maximum: case Op::Minimum:
      case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
      case Op::Where: case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
      case Op::Pad: case Op::Concat:
      case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
      case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
      case Op::AvgPool2dGrad: case Op::Im2col:
      case Op::Gather: case Op::IndexSelect: case Op::ScatterAdd: case Op::OneHot:
        return;
      case Op::Count_: LOOM_UNREACHABLE("simplify: Count_ is not an op");
    }
    LOOM_UNREACHABLE("simplify: op out of range");
  }

  ir::Program& p_;
  const int n_in_;
};

}  // namespace

ir::Program simplify(ir::Program p) {
  Simplifier(p).run();
  return p;
}

}  // namespace loom::compiler
