#include "runtime/cuda/cuda_target.h"

namespace loom::runtime::cuda {

ir::Target cuda_target() {
  ir::Target t;
  t.name = "cuda";
  t.run_everything();
  for (ir::Op op : {ir::Op::Conv2d, ir::Op::Conv2dGradInput, ir::Op::Conv2dGradWeight,
                    ir::Op::Matmul})
    t.run_bfloat16(op);
  t.fuse_epilogue = t.fuse_elementwise = t.fuse_reduce_prologue = true;
  t.fold_transpose = t.plan_memory = true;
  return t;
}

}  // namespace loom::runtime::cuda
