#include "compiler/dead_code.h"

#include <vector>

namespace loom::compiler {

std::vector<bool> live_slots(const ir::Program& p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  std::vector<bool> live(p.num_slots(), false);
  for (auto o : p.outputs) live[o] = true;
  for (int i = static_cast<int>(p.instrs.size()); i-- > 0;)
    if (live[n_in + i])
      for (auto a : p.instrs[i].args) live[a] = true;
  return live;
}

ir::Program eliminate_dead_code(ir::Program p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  const std::vector<bool> live = live_slots(p);
  std::vector<int> slot_map(p.num_slots(), -1);
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  std::vector<ir::Instr> kept;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    if (!live[n_in + i]) continue;
    ir::Instr in = std::move(p.instrs[i]);
    for (auto& a : in.args) a = slot_map[a];
    slot_map[n_in + i] = n_in + static_cast<int>(kept.size());
    kept.push_back(std::move(in));
  }
  p.instrs = std::move(kept);
  for (auto& o : p.outputs) o = slot_map[o];
  return p;
}

}  // namespace loom::compiler
