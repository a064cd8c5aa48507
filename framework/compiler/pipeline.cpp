#include "compiler/pipeline.h"

#include "compiler/lower.h"
#include "compiler/memory_plan.h"

#include <cstdlib>
#include <iostream>

namespace loom::compiler {

Program compile(const ir::Graph& graph) {
  static const bool dump = std::getenv("LOOM_DUMP_PASSES") != nullptr;
  if (dump) std::cerr << "== input\n" << ir::to_text(graph);
  Program p = lower(graph);
  p = plan_memory(std::move(p));
  return p;
}

}  // namespace loom::compiler
