#include "compiler/gather_first.h"

#include <map>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

// The most instructions one Gather may become: the elementwise chains it goes through are a
// handful of ops (log_softmax's subtraction and the widening of the logits).
constexpr int kMaxPicked = 32;

class GatherFirst {
 public:
  GatherFirst(ir::Program& p, const ir::Target& target)
      : p_(p), target_(target), n_in_(static_cast<int>(p.inputs.size())) {}

  void run() {
    std::vector<ir::Instr> old = std::move(p_.instrs);
    p_.instrs.clear();
    p_.instrs.reserve(old.size());
    std::vector<int> slot_map(static_cast<std::size_t>(n_in_) + old.size());
    for (int s = 0; s < n_in_; ++s) slot_map[s] = s;
    for (std::size_t i = 0; i < old.size(); ++i) {
      ir::Instr in = std::move(old[i]);
      for (auto& a : in.args) a = slot_map[a];
      const bool picks = in.op == Op::Gather;
      slot_map[static_cast<std::size_t>(n_in_) + i] =
          picks ? gather(std::move(in)) : emit(std::move(in));
    }
    for (auto& o : p_.outputs) o = slot_map[o];
  }

 private:
  // What one Gather picks: its index, the dimension, and the gathered value's shape.
  struct Pick {
    int index;
    std::size_t dim;
    Shape from, to;
  };

  const ir::Instr* producer(int slot) const {
    return slot >= n_in_ ? &p_.instrs[static_cast<std::size_t>(slot - n_in_)] : nullptr;
  }

  int emit(ir::Instr in) {
    p_.instrs.push_back(std::move(in));
    return n_in_ + static_cast<int>(p_.instrs.size()) - 1;
  }

  // A broadcast source that is one value along the gathered dimension and, elsewhere, either
  // one value or the gathered shape's size: picking from its broadcast is broadcasting it over
  // the index's shape.
  static bool spreads_over_pick(const Shape& source, const Pick& k) {
    if (source.size() != k.from.size() || source[k.dim] != 1) return false;
    for (std::size_t d = 0; d < source.size(); ++d)
      if (source[d] != 1 && source[d] != k.from[d]) return false;
    return true;
  }

  // Whether the value in `slot` can be picked through its elementwise producers; `budget`
  // counts the instructions that would take, `gathers` is set when a leaf would be gathered.
  bool can_pick(int slot, const Pick& k, int& budget, bool& gathers) const {
    if (--budget < 0) return false;
    const ir::Instr* src = producer(slot);
    if (src && src->op == Op::Expand) return spreads_over_pick(p_.slot_type(src->args[0]).shape, k);
    if (src && ir::is_elementwise(src->op)) {
      for (auto a : src->args)
        if (!can_pick(a, k, budget, gathers)) return false;
      return true;
    }
    gathers = true;
    return target_.runs(Op::Gather, p_.slot_type(slot).dtype);
  }

  // The picked elements of the value in `slot`, as a new slot (each source picked once).
  int pick(int slot, const Pick& k, std::map<int, int>& picked) {
    if (auto it = picked.find(slot); it != picked.end()) return it->second;
    const ir::Instr* src = producer(slot);
    int result;
    if (src && src->op == Op::Expand) {
      const int source = src->args[0];
      const DType dtype = src->dtype;
      result = p_.slot_type(source).shape == k.to
                   ? source
                   : emit({Op::Expand, dtype, k.to, ir::ShapeAttr{k.to}, {source}});
    } else if (src && ir::is_elementwise(src->op)) {
      ir::Instr copy = *src;
      copy.shape = k.to;
      copy.fusion = nullptr;
      for (auto& a : copy.args) a = pick(a, k, picked);
      result = emit(std::move(copy));
    } else {
      const DType dtype = p_.slot_type(slot).dtype;
      const ir::DimAttr along{static_cast<int64_t>(k.dim)};
      result = emit({Op::Gather, dtype, k.to, along, {slot, k.index}});
    }
    picked[slot] = result;
    return result;
  }

  // The Gather itself, or the same elements computed from gathered operands.
  int gather(ir::Instr in) {
    const int value = in.args[0];
    const ir::Instr* src = producer(value);
    Pick k{in.args[1], static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim),
           p_.slot_type(value).shape, in.shape};
    bool rows_match = k.from.size() == k.to.size();
    for (std::size_t d = 0; rows_match && d < k.to.size(); ++d)
      rows_match = d == k.dim || k.from[d] == k.to[d];
    int budget = kMaxPicked;
    bool gathers = false;
    // With no leaf gathered, nothing would read the index: one out of range would pass unseen.
    if (!src || !ir::is_elementwise(src->op) || !rows_match || !can_pick(value, k, budget, gathers) ||
        !gathers)
      return emit(std::move(in));
    std::map<int, int> picked;
    return pick(value, k, picked);
  }

  ir::Program& p_;
  const ir::Target& target_;
  const int n_in_;
};

}  // namespace

ir::Program gather_before_elementwise(ir::Program p, const ir::Target& target) {
  bool any = false;
  for (const auto& in : p.instrs) any = any || in.op == Op::Gather;
  if (any) GatherFirst(p, target).run();
  return p;
}

}  // namespace loom::compiler
