#include "compiler/pipeline.h"

#include "compiler/channels_last.h"
#include "compiler/conv_im2col.h"
#include "compiler/dead_code.h"
#include "compiler/fold_transpose.h"
#include "compiler/fuse_epilogue.h"
#include "compiler/fuse_elementwise.h"
#include "compiler/fuse_reduce.h"
#include "compiler/gather_first.h"
#include "compiler/lower.h"
#include "compiler/memory_plan.h"
#include "compiler/simplify.h"
#include "compiler/stack_reductions.h"
#include "compiler/widen.h"

#include <loom/error.h>

#include <cstdlib>
#include <iostream>

namespace loom::compiler {
namespace {

// Every instruction's op at its dtype must be one the device runs; the first that is not is
// named, with the device kind.
void check_supported(const ir::Program& p, const ir::Target& target) {
  for (const auto& in : p.instrs)
    if (!target.runs(in.op, in.dtype))
      throw Error(std::string("compile: the ") + target.name + " device does not run " +
                  ir::op_name(in.op) + " producing " + dtype_name(in.dtype));
}

}  // namespace

// The pass order, stated here once: lower, widen_bfloat16, move_casts_across_movement,
// read_exact_roundings, check_supported, simplify, gather_before_elementwise, convs_as_matmuls,
// eliminate_dead_code, fuse_epilogue,
// assign_channels_last, fuse_elementwise, fuse_reduce_prologue, stack_reductions,
// fold_transpose, eliminate_dead_code, plan_memory.
// A target skips the rewrites it does not take; lowering, the check, simplification, gathering
// first and dead code elimination always run, and so does widening, which is a no-op without
// bfloat16.
ir::Program compile(const ir::Graph& graph, const ir::Target& target) {
  static const bool dump = std::getenv("LOOM_DUMP_PASSES") != nullptr;
  auto after = [&](const char* pass, const ir::Program& p) {
    if (dump) std::cerr << "== after " << pass << '\n' << to_text(p);
  };
  if (dump) std::cerr << "== input\n" << ir::to_text(graph);
  ir::Program p = lower(graph);
  after("lower", p);
  p = widen_bfloat16(std::move(p), target);
  after("widen_bfloat16", p);
  p = move_casts_across_movement(std::move(p), target);
  after("move_casts_across_movement", p);
  p = read_exact_roundings(std::move(p));
  after("read_exact_roundings", p);
  check_supported(p, target);
  p = simplify(std::move(p));
  after("simplify", p);
  p = gather_before_elementwise(std::move(p), target);
  after("gather_before_elementwise", p);
  if (target.conv_as_matmul) {
    p = convs_as_matmuls(std::move(p), target);
    after("convs_as_matmuls", p);
  }
  // The rewrites so far leave what they replaced in place: removed now, an instruction nobody
  // reads does not keep the fusions below from taking its operand in (fuse_elementwise.h).
  p = eliminate_dead_code(std::move(p));
  after("eliminate_dead_code", p);
  if (target.fuse_epilogue) {
    p = fuse_epilogue(std::move(p));
    after("fuse_epilogue", p);
  }
  if (target.channels_last_convs) {
    p = assign_channels_last(std::move(p), target);
    after("assign_channels_last", p);
  }
  if (target.fuse_elementwise) {
    p = fuse_elementwise(std::move(p), target);
    after("fuse_elementwise", p);
  }
  if (target.fuse_reduce_prologue) {
    p = fuse_reduce_prologue(std::move(p));
    after("fuse_reduce_prologue", p);
  }
  if (target.stack_reductions) {
    p = stack_reductions(std::move(p), target);
    after("stack_reductions", p);
  }
  if (target.fold_transpose) {
    p = fold_transpose(std::move(p));
    after("fold_transpose", p);
  }
  p = eliminate_dead_code(std::move(p));
  after("eliminate_dead_code", p);
  if (target.plan_memory) {
    p = plan_memory(std::move(p));
    after("plan_memory", p);
  }
  return p;
}

}  // namespace loom::compiler
