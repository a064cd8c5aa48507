#include "compiler/fuse_reduce.h"

#include <vector>

namespace loom::compiler {

ir::Program fuse_reduce_prologue(ir::Program p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  std::vector<int> reads(p.num_slots(), 0);
  for (const auto& in : p.instrs)
    for (auto a : in.args) ++reads[a];
  for (auto o : p.outputs) ++reads[o];  // an output is read by the caller
  for (auto& in : p.instrs) {
    bool reduction = in.op == ir::Op::Sum || in.op == ir::Op::Mean || in.op == ir::Op::Max;
    if (!reduction || in.fusion || in.args[0] < n_in || reads[in.args[0]] != 1) continue;
    const ir::Instr& producer = p.instrs[in.args[0] - n_in];
    if (!producer.fusion || producer.dtype != in.dtype) continue;
    // The producer is now unread; dead-code elimination drops it.
    in.fusion = producer.fusion;
    in.args = producer.args;
  }
  return p;
}

}  // namespace loom::compiler
