#include "compiler/pipeline.h"

#include "compiler/dead_code.h"
#include "compiler/fold_transpose.h"
#include "compiler/fuse_epilogue.h"
#include "compiler/fuse_elementwise.h"
#include "compiler/fuse_reduce.h"
#include "compiler/lower.h"
#include "compiler/memory_plan.h"
#include "compiler/simplify.h"

#include <cstdlib>
#include <iostream>

namespace loom::compiler {

ir::Program compile(const ir::Graph& graph) {
  static const bool dump = std::getenv("LOOM_DUMP_PASSES") != nullptr;
  auto after = [&](const char* pass, const ir::Program& p) {
    if (dump) std::cerr << "== after " << pass << '\n' << to_text(p);
  };
  if (dump) std::cerr << "== input\n" << ir::to_text(graph);
  ir::Program p = lower(graph);
  after("lower", p);
  p = simplify(std::move(p));
  after("simplify", p);
  p = fuse_epilogue(std::move(p));
  after("fuse_epilogue", p);
  p = fuse_elementwise(std::move(p));
  after("fuse_elementwise", p);
  p = fuse_reduce_prologue(std::move(p));
  after("fuse_reduce_prologue", p);
  p = fold_transpose(std::move(p));
  after("fold_transpose", p);
  p = eliminate_dead_code(std::move(p));
  after("eliminate_dead_code", p);
  p = plan_memory(std::move(p));
  after("plan_memory", p);
  return p;
}

}  // namespace loom::compiler
