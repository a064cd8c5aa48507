#include "compiler/fold_transpose.h"

#include <cstdint>

namespace loom::compiler {
namespace {

// Whether perm swaps the last two dimensions and leaves the others in place.
bool swaps_last_two(const std::vector<int64_t>& perm) {
  const auto r = static_cast<int64_t>(perm.size());
  if (r < 2 || perm[r - 2] != r - 1 || perm[r - 1] != r - 2) return false;
  for (int64_t d = 0; d + 2 < r; ++d)
    if (perm[d] != d) return false;
  return true;
}

}  // namespace

ir::Program fold_transpose(ir::Program p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  for (auto& in : p.instrs) {
    if (in.op != ir::Op::Matmul) continue;
    auto& attr = in.attr.get<ir::MatmulAttr>();
    bool* transpose[] = {&attr.transpose_a, &attr.transpose_b};
    for (int k = 0; k < 2; ++k) {
      const int slot = in.args[k];
      if (slot < n_in) continue;
      const ir::Instr& producer = p.instrs[slot - n_in];
      if (producer.op != ir::Op::Permute ||
          !swaps_last_two(producer.attr.get<ir::PermuteAttr>().perm))
        continue;
      in.args[k] = producer.args[0];
      *transpose[k] = true;
    }
  }
  return p;
}

}  // namespace loom::compiler
