#include "compiler/fuse_epilogue.h"

#include "compiler/dead_code.h"

#include <optional>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

bool is_activation(Op op) {
  return op == Op::Relu || op == Op::Sigmoid || op == Op::Tanh || op == Op::Silu ||
         op == Op::Gelu || op == Op::GeluTanh;
}

class EpilogueFuser {
 public:
  explicit EpilogueFuser(ir::Program& p)
      : p_(p),
        n_in_(static_cast<int>(p.inputs.size())),
        readers_(p.num_slots(), 0),
        reader_(p.num_slots(), -1),
        is_output_(p.num_slots(), false) {
    for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
      for (int a : p.instrs[i].args) ++readers_[a], reader_[a] = i;
    for (int o : p.outputs) is_output_[o] = true;
  }

  // Folds the Add at instruction i (and the activation reading it) into its product's
  // GEMM/conv; whether it did.
  bool fold(int i) {
    const ir::Instr& add = p_.instrs[i];
    if (add.op != Op::Add || add.fusion) return false;
    if (add.dtype != DType::Float32 && add.dtype != DType::Float64) return false;
    for (int side = 0; side < 2; ++side) {
      int product = add.args[side];
      const ir::Instr* in = producer(product);
      if (in && in->op == Op::Reshape && !in->fusion) {
        if (!only_reader(product)) continue;
        product = in->args[0];
        in = producer(product);
      }
      if (!in || (in->op != Op::Matmul && in->op != Op::Conv2d) || in->fusion ||
          in->epilogue.active() || in->dtype != add.dtype || !only_reader(product))
        continue;
      if (in->op == Op::Conv2d ? product != add.args[side] : in->shape.back() != add.shape.back())
        continue;
      auto bias = bias_vector(add.args[1 - side], *in, add);
      if (!bias) continue;
      ir::Instr folded{in->op, add.dtype, add.shape, in->attr, {in->args[0], in->args[1], *bias}};
      folded.epilogue.bias = 2;
      int last = i;
      const int sum = n_in_ + i;
      if (only_reader(sum)) {
        const ir::Instr& act = p_.instrs[reader_[sum]];
        if (is_activation(act.op) && !act.fusion && act.dtype == add.dtype) {
          folded.epilogue.activation = act.op;
          last = reader_[sum];
        }
      }
      // The absorbed instructions are now read by nothing and go with dead code.
      p_.instrs[last] = std::move(folded);
      return true;
    }
    return false;
  }

 private:
  const ir::Instr* producer(int slot) const {
    return slot < n_in_ ? nullptr : &p_.instrs[slot - n_in_];
  }
  bool only_reader(int slot) const { return readers_[slot] == 1 && !is_output_[slot]; }

  // The slot holding `operand`'s values as a flat bias vector for `product`, if `operand` is a
  // broadcast of one: [1, ..., 1, N] for a Matmul, [1, O, 1, 1] for a Conv2d, possibly expanded
  // over the sum's shape. Reshapes of the vector are looked through: they keep its order.
  std::optional<int> bias_vector(int operand, const ir::Instr& product, const ir::Instr& add) const {
    int src = operand;
    if (const ir::Instr* e = producer(src); e && e->op == Op::Expand && !e->fusion) src = e->args[0];
    const ir::SlotType t = p_.slot_type(src);
    const Shape& s = t.shape;
    const Shape& out = add.shape;
    if (t.dtype != add.dtype || s.size() != out.size()) return std::nullopt;
    if (product.op == Op::Conv2d) {
      if (s != Shape{1, out[1], 1, 1}) return std::nullopt;
    } else {
      for (std::size_t d = 0; d + 1 < s.size(); ++d)
        if (s[d] != 1) return std::nullopt;
      if (s.back() != out.back()) return std::nullopt;
    }
    for (const ir::Instr* r = producer(src); r && r->op == Op::Reshape && !r->fusion; r = producer(src))
      src = r->args[0];
    return src;
  }

  ir::Program& p_;
  int n_in_;
  std::vector<int> readers_;   // per slot: how many arguments read it
  std::vector<int> reader_;    // per slot: the last instruction that reads it
  std::vector<bool> is_output_;
};

}  // namespace

ir::Program fuse_epilogue(ir::Program p) {
  EpilogueFuser fuser(p);
  bool folded = false;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) folded = fuser.fold(i) || folded;
  return folded ? eliminate_dead_code(std::move(p)) : std::move(p);
}

}  // namespace loom::compiler
