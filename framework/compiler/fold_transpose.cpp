#include "compiler/fold_transpose.h"

#include "compiler/dead_code.h"

#include <cstdint>
#include <utility>
#include <vector>

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

bool is_transpose(const ir::Instr& in) {
  return in.op == ir::Op::Permute && swaps_last_two(in.attr.get<ir::PermuteAttr>().perm);
}

// A transpose of a bfloat16 product that nothing else reads becomes the transposed product,
// (A B)^T = B^T A^T, its operands swapped and their transpose flags swapped and flipped. The
// product left unread is removed by dead_code.cpp. A product with an epilogue keeps its
// layout: its bias runs along the columns. Float32 and float64 products keep theirs too:
// Eigen's kernels sum a product and its swapped transpose in different orders, and a compiled
// step's values stay those of eager mode, which runs the product and the transpose apart.
void fold_transposed_products(ir::Program& p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  // Readers among the live instructions: the fusion passes leave the instructions they
  // absorbed in place, unread, for dead_code.cpp.
  const std::vector<bool> live = live_slots(p);
  std::vector<int> readers(p.num_slots(), 0);
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
    if (live[n_in + i])
      for (int a : p.instrs[i].args) ++readers[a];
  for (int o : p.outputs) ++readers[o];
  for (auto& in : p.instrs) {
    if (!is_transpose(in) || in.args[0] < n_in || readers[in.args[0]] != 1) continue;
    const ir::Instr& product = p.instrs[in.args[0] - n_in];
    if (product.op != ir::Op::Matmul || product.dtype != DType::BFloat16 ||
        product.epilogue.active())
      continue;
    const auto& m = product.attr.get<ir::MatmulAttr>();
    ir::MatmulAttr swapped = m;
    swapped.transpose_a = !m.transpose_b;
    swapped.transpose_b = !m.transpose_a;
    in.op = ir::Op::Matmul;
    in.args = {product.args[1], product.args[0]};
    in.attr = swapped;
    in.fusion = nullptr;
  }
}

}  // namespace

ir::Program fold_transpose(ir::Program p) {
  fold_transposed_products(p);
  const auto n_in = static_cast<int>(p.inputs.size());
  for (auto& in : p.instrs) {
    if (in.op != ir::Op::Matmul) continue;
    auto& attr = in.attr.get<ir::MatmulAttr>();
    bool* transpose[] = {&attr.transpose_a, &attr.transpose_b};
    for (int k = 0; k < 2; ++k) {
      const int slot = in.args[k];
      if (slot < n_in || !is_transpose(p.instrs[slot - n_in])) continue;
      in.args[k] = p.instrs[slot - n_in].args[0];
      *transpose[k] = !*transpose[k];
    }
  }
  return p;
}

}  // namespace loom::compiler
