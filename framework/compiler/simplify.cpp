#include "compiler/simplify.h"

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
    for (auto& in : p_.instrs) rewrite(in);
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
      case Op::Cast:
        if (same_type(in, in.args[0])) alias(in, in.args[0]);
        return;
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
      default: return;
    }
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
