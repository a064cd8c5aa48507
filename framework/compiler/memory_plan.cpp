#include "compiler/memory_plan.h"

#include <vector>

namespace loom::compiler {

Program plan_memory(Program p) {
  auto n_in = static_cast<int>(p.inputs.size());
  std::vector<int> last_reader(p.num_slots(), -1);
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
    for (auto a : p.instrs[i].args) last_reader[a] = i;
  std::vector<bool> keep(p.num_slots(), false);
  for (auto o : p.outputs) keep[o] = true;
  for (int s = n_in; s < p.num_slots(); ++s) {
    if (keep[s]) continue;
    // A slot nobody reads dies right after it is written.
    int at = last_reader[s] >= 0 ? last_reader[s] : s - n_in;
    p.instrs[at].free_after.push_back(s);
  }
  return p;
}

}  // namespace loom::compiler
