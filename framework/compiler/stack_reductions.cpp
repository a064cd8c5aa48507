#include "compiler/stack_reductions.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

const std::vector<int64_t>& axes_of(const ir::Instr& in) {
  return in.attr.get<ir::AxesAttr>().axes;
}

// What a member reduces: its prologue's shape and compute type, or those of its operand in
// memory (a float32 or float64 tensor of the result's dtype, read through a copy step).
struct Reduced {
  Shape shape;
  DType compute;
};

std::optional<Reduced> reduced_of(const ir::Program& p, const ir::Instr& in) {
  if ((in.op != Op::Sum && in.op != Op::Mean) || !in.stacked.empty() || in.epilogue.active())
    return std::nullopt;
  if (in.fusion) return Reduced{in.fusion->shape, in.fusion->compute};
  const ir::SlotType t = p.slot_type(in.args[0]);
  if (t.dtype != in.dtype || (t.dtype != DType::Float32 && t.dtype != DType::Float64))
    return std::nullopt;
  return Reduced{t.shape, t.dtype};
}

// A member's prologue: its own, or a copy of its operand (of the shape and dtype `reduced`).
std::shared_ptr<ir::Fusion> prologue_of(const ir::Instr& in, const Reduced& reduced) {
  if (in.fusion) return std::make_shared<ir::Fusion>(*in.fusion);
  auto f = std::make_shared<ir::Fusion>();
  f->compute = reduced.compute;
  f->shape = reduced.shape;
  f->loads.push_back({0, reduced.compute, {shape_numel(reduced.shape)}, {1}});
  f->steps.push_back({Op::Cast, 0, -1, -1, 0, reduced.compute});
  f->num_registers = 1;
  f->register_of = {-1, 0};  // the load read in place, the copy into a register
  return f;
}

struct Group {
  int first = 0;             // the first member's instruction
  Reduced reduced;           // what every member reduces
  std::vector<int> members;  // instructions, in program order
  std::vector<int> args;     // the union of their operand slots, the first member's first
  // The stacked sum runs before instruction `at`: after every member's operands are
  // computed (lo) and before any member is read (hi).
  int lo = 0, hi = 0;
};

int index_in(const std::vector<int>& v, int x) {
  return static_cast<int>(std::distance(v.begin(), std::find(v.begin(), v.end(), x)));
}

// The group's one instruction, its prologues reading the union of the members' operands. Only
// the members' own fields are read: instructions before them may have been moved out of `p`.
ir::Instr stacked_instr(const ir::Program& p, const Group& g, const std::vector<int>& slot_map) {
  const ir::Instr& first = p.instrs[g.first];
  ir::Instr s{first.op, first.dtype, first.shape, first.attr, {}};
  s.shape.insert(s.shape.begin(), static_cast<int64_t>(g.members.size()));
  for (int a : g.args) s.args.push_back(slot_map[a]);
  for (int m : g.members) {
    const ir::Instr& in = p.instrs[m];
    auto f = prologue_of(in, g.reduced);
    for (auto& l : f->loads) l.arg = index_in(g.args, in.args[l.arg]);
    if (!s.fusion) s.fusion = std::move(f);
    else s.stacked.push_back(std::move(f));
  }
  return s;
}

}  // namespace

ir::Program stack_reductions(ir::Program p, const ir::Target& target) {
  if (!target.stack_reductions) return p;
  const auto n_in = static_cast<int>(p.inputs.size());
  const auto n = static_cast<int>(p.instrs.size());

  // Per slot, the first instruction that reads its value (n: only the caller, or nobody). A
  // Reshape is no reader of its own: it moves after the stack with what it reshapes.
  std::vector<int> first_reader(p.num_slots(), n);
  for (int i = n; i-- > 0;) {
    const ir::Instr& in = p.instrs[i];
    const int reads = in.op == Op::Reshape ? first_reader[n_in + i] : i;
    for (int a : in.args) first_reader[a] = std::min(first_reader[a], reads);
  }

  // Per slot, the value it reshapes (itself where it is no Reshape).
  std::vector<int> root(p.num_slots());
  for (int s = 0; s < p.num_slots(); ++s) {
    const bool reshape = s >= n_in && p.instrs[s - n_in].op == Op::Reshape;
    root[s] = reshape ? root[p.instrs[s - n_in].args[0]] : s;
  }

  // Groups, in program order: an instruction joins the latest group it may, else starts one.
  std::vector<Group> groups;
  std::vector<int> group_of(n, -1);
  for (int i = 0; i < n; ++i) {
    const ir::Instr& in = p.instrs[i];
    const auto reduced = reduced_of(p, in);
    if (!reduced || !target.stack_reductions(reduced->shape, axes_of(in))) continue;
    const int64_t numel = shape_numel(reduced->shape);
    int ready = 0;  // the stack may run once this member's operands are computed
    for (int a : in.args) ready = std::max(ready, a - n_in + 1);
    const int needed = first_reader[n_in + i];
    auto joins = [&](const Group& g) {
      const ir::Instr& first = p.instrs[g.first];
      if (static_cast<int>(g.members.size()) >= kMaxStacked || first.op != in.op ||
          first.dtype != in.dtype || first.shape != in.shape || axes_of(first) != axes_of(in) ||
          g.reduced.shape != reduced->shape || g.reduced.compute != reduced->compute ||
          std::max(g.lo, ready) > std::min(g.hi, needed))
        return false;
      // Not reading a member through reshapes (other readers come after hi).
      for (int a : in.args)
        if (root[a] >= n_in && std::find(g.members.begin(), g.members.end(), root[a] - n_in) !=
                                   g.members.end())
          return false;
      // Sharing a whole-size operand (a reshape of one is the same bytes).
      return std::any_of(in.args.begin(), in.args.end(), [&](int a) {
        return shape_numel(p.slot_type(a).shape) == numel &&
               std::any_of(g.args.begin(), g.args.end(), [&](int b) { return root[b] == root[a]; });
      });
    };
    int g = static_cast<int>(groups.size());
    while (g-- > 0 && !joins(groups[g])) {}
    if (g < 0) {
      g = static_cast<int>(groups.size());
      groups.push_back({i, *reduced, {}, {}, ready, needed});
    }
    Group& group = groups[g];
    group.members.push_back(i);
    group.lo = std::max(group.lo, ready);
    group.hi = std::min(group.hi, needed);
    for (int a : in.args)
      if (std::find(group.args.begin(), group.args.end(), a) == group.args.end())
        group.args.push_back(a);
    group_of[i] = g;
  }
  // Each stack runs as early as it may: before instruction lo.
  std::vector<std::vector<int>> stacks_before(n + 1);
  for (int g = 0; g < static_cast<int>(groups.size()); ++g)
    if (groups[g].members.size() > 1) stacks_before[groups[g].lo].push_back(g);

  std::vector<int> slot_map(p.num_slots(), -1);
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  std::vector<ir::Instr> out;
  auto emit = [&](ir::Instr in) {
    out.push_back(std::move(in));
    return n_in + static_cast<int>(out.size()) - 1;
  };
  // Reshapes of a member met before its stack ran, by the member's (or reshape's) old slot.
  std::vector<std::vector<int>> deferred(p.num_slots());
  std::vector<int> ready;  // old slots just given a new one, whose deferred reshapes may follow
  auto place = [&](int old_slot, int new_slot) {
    slot_map[old_slot] = new_slot;
    ready.push_back(old_slot);
    while (!ready.empty()) {
      const int s = ready.back();
      ready.pop_back();
      for (int r : deferred[s]) {
        ir::Instr& in = p.instrs[r];
        in.args[0] = slot_map[in.args[0]];
        slot_map[n_in + r] = emit(std::move(in));
        ready.push_back(n_in + r);
      }
      deferred[s].clear();
    }
  };
  for (int i = 0; i < n; ++i) {
    for (int g : stacks_before[i]) {
      // The members are unchanged until here (each comes at or after lo).
      const int stack = emit(stacked_instr(p, groups[g], slot_map));
      for (std::size_t row = 0; row < groups[g].members.size(); ++row) {
        const ir::Instr& member = p.instrs[groups[g].members[row]];
        Shape sliced = member.shape;
        sliced.insert(sliced.begin(), 1);
        ir::SliceAttr slice{std::vector<int64_t>(sliced.size(), 0),
                            std::vector<int64_t>(sliced.size(), 1), sliced};
        slice.starts[0] = static_cast<int64_t>(row);
        const int part = emit({Op::Slice, member.dtype, sliced, slice, {stack}});
        place(n_in + groups[g].members[row],
              emit({Op::Reshape, member.dtype, member.shape, ir::ShapeAttr{member.shape}, {part}}));
      }
    }
    const int g = group_of[i];
    if (g >= 0 && groups[g].members.size() > 1) continue;  // computed by its stack
    ir::Instr& in = p.instrs[i];
    if (in.op == Op::Reshape && slot_map[in.args[0]] < 0) {  // a member's, before its stack
      deferred[in.args[0]].push_back(i);
      continue;
    }
    for (auto& a : in.args) a = slot_map[a];
    place(n_in + i, emit(std::move(in)));
  }
  p.instrs = std::move(out);
  for (auto& o : p.outputs) o = slot_map[o];
  return p;
}

}  // namespace loom::compiler
