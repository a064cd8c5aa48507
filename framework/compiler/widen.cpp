#include "compiler/widen.h"

#include <loom/bfloat16.h>

#include <algorithm>
#include <vector>

namespace loom::compiler {
namespace {

// Whether `in` must run in float32: it reads or makes bfloat16 and the target cannot.
bool needs_widening(const ir::Program& p, const ir::Instr& in, const ir::Target& target) {
  if (target.runs(in.op, DType::BFloat16)) return false;
  if (in.dtype == DType::BFloat16) return true;
  return std::any_of(in.args.begin(), in.args.end(),
                     [&](int a) { return p.slot_type(a).dtype == DType::BFloat16; });
}

ir::Instr cast(int slot, DType to, const Shape& shape) {
  ir::Instr c;
  c.op = ir::Op::Cast;
  c.dtype = to;
  c.shape = shape;
  c.attr = ir::CastAttr{to};
  c.args = {slot};
  return c;
}

}  // namespace

ir::Program widen_bfloat16(ir::Program p, const ir::Target& target) {
  const auto n_in = static_cast<int>(p.inputs.size());
  bool any = false;
  for (const auto& in : p.instrs) any = any || needs_widening(p, in, target);
  if (!any) return p;

  std::vector<ir::Instr> out;
  out.reserve(p.instrs.size() * 2);
  std::vector<int> slot_map(p.num_slots());        // old slot → new slot
  std::vector<int> widened(p.num_slots(), -1);     // old bf16 slot → its float32 cast
  std::vector<ir::SlotType> types(p.inputs.begin(), p.inputs.end());  // new slots' types
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  auto emit = [&](ir::Instr in) {
    types.push_back({in.dtype, in.shape});
    out.push_back(std::move(in));
    return n_in + static_cast<int>(out.size()) - 1;
  };

  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    ir::Instr in = std::move(p.instrs[i]);
    const bool widen = needs_widening(p, in, target);
    for (auto& a : in.args) {
      const int old = a;
      a = slot_map[old];
      if (!widen || types[a].dtype != DType::BFloat16) continue;
      if (widened[old] < 0) widened[old] = emit(cast(a, DType::Float32, types[a].shape));
      a = widened[old];
    }
    const bool narrow = widen && in.dtype == DType::BFloat16;
    if (narrow) {
      in.dtype = DType::Float32;
      if (in.attr.is<ir::RandomAttr>()) {
        auto r = in.attr.get<ir::RandomAttr>();
        r.dtype = DType::Float32;
        in.attr = r;
      }
    }
    const Shape shape = in.shape;
    int slot = emit(std::move(in));
    // A later widened reader casts the rounded bfloat16 back: the unrounded float32 value
    // is not what this instruction means.
    if (narrow) slot = emit(cast(slot, DType::BFloat16, shape));
    slot_map[n_in + i] = slot;
  }
  p.instrs = std::move(out);
  for (auto& o : p.outputs) o = slot_map[o];
  return p;
}

ir::Program move_casts_across_movement(ir::Program p, const ir::Target& target) {
  const auto n_in = static_cast<int>(p.inputs.size());
  auto movement = [](ir::Op op) {
    return op == ir::Op::Reshape || op == ir::Op::Permute || op == ir::Op::Slice;
  };
  bool any = false;
  for (const auto& in : p.instrs) any = any || (movement(in.op) && in.dtype != DType::BFloat16);
  if (!any) return p;

  std::vector<ir::Instr> out;
  out.reserve(p.instrs.size() + p.instrs.size() / 4);
  std::vector<int> slot_map(p.num_slots());
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  auto type_of = [&](int slot) -> ir::SlotType {
    if (slot < n_in) return p.inputs[static_cast<std::size_t>(slot)];
    const auto& in = out[static_cast<std::size_t>(slot - n_in)];
    return {in.dtype, in.shape};
  };
  auto emit = [&](ir::Instr in) {
    out.push_back(std::move(in));
    return n_in + static_cast<int>(out.size()) - 1;
  };
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    ir::Instr in = std::move(p.instrs[i]);
    for (auto& a : in.args) a = slot_map[a];
    // The operand, in the new program: a cast of a bfloat16 value to a float type?
    const ir::Instr* src = movement(in.op) && in.args[0] >= n_in
                               ? &out[static_cast<std::size_t>(in.args[0] - n_in)]
                               : nullptr;
    if (src && src->op == ir::Op::Cast && (src->dtype == DType::Float32 || src->dtype == DType::Float64) &&
        type_of(src->args[0]).dtype == DType::BFloat16 && target.runs(in.op, DType::BFloat16)) {
      const DType wide = src->dtype;
      ir::Instr move = std::move(in);
      move.args[0] = src->args[0];
      move.dtype = DType::BFloat16;
      const Shape shape = move.shape;
      slot_map[n_in + i] = emit(cast(emit(std::move(move)), wide, shape));
      continue;
    }
    // A rounding to bfloat16 of a permuted or reshaped float: round the source, then move.
    const ir::Op moved = in.op == ir::Op::Cast && in.dtype == DType::BFloat16 && in.args[0] >= n_in
                             ? out[static_cast<std::size_t>(in.args[0] - n_in)].op
                             : ir::Op::Cast;
    if ((moved == ir::Op::Permute || moved == ir::Op::Reshape) &&
        target.runs(moved, DType::BFloat16)) {
      ir::Instr move = out[static_cast<std::size_t>(in.args[0] - n_in)];
      const int source = move.args[0];
      move.args[0] = emit(cast(source, DType::BFloat16, type_of(source).shape));
      move.dtype = DType::BFloat16;
      slot_map[n_in + i] = emit(std::move(move));
      continue;
    }
    slot_map[n_in + i] = emit(std::move(in));
  }
  p.instrs = std::move(out);
  for (auto& o : p.outputs) o = slot_map[o];
  return p;
}

ir::Program read_exact_roundings(ir::Program p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  const auto n = static_cast<int>(p.instrs.size());
  auto is_float = [](DType t) { return t == DType::Float32 || t == DType::Float64; };
  // Per instruction: every value it makes is a bfloat16 value (so rounding it changes nothing).
  std::vector<bool> exact(static_cast<std::size_t>(n), false);
  auto exact_slot = [&](int slot) {
    return slot >= n_in && exact[static_cast<std::size_t>(slot - n_in)];
  };
  std::vector<int> roundings(static_cast<std::size_t>(n), 0), others(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    const ir::Instr& in = p.instrs[static_cast<std::size_t>(i)];
    bool e = false;
    if (is_float(in.dtype)) {
      switch (in.op) {
        case ir::Op::Cast: e = p.slot_type(in.args[0]).dtype == DType::BFloat16; break;
        case ir::Op::Constant: {
          const double v = in.attr.get<ir::ScalarAttr>().value;
          e = static_cast<double>(round_to_bfloat16(static_cast<float>(v))) == v;
          break;
        }
        case ir::Op::Relu: case ir::Op::Neg: case ir::Op::Abs: case ir::Op::Reshape:
        case ir::Op::Permute: case ir::Op::Slice: case ir::Op::Expand:
          e = exact_slot(in.args[0]);
          break;
        case ir::Op::Maximum: case ir::Op::Minimum:
          e = exact_slot(in.args[0]) && exact_slot(in.args[1]);
          break;
        case ir::Op::Where: e = exact_slot(in.args[1]) && exact_slot(in.args[2]); break;
        default: break;
      }
    }
    exact[static_cast<std::size_t>(i)] = e;
    for (int a : in.args) {
      if (a < n_in) continue;
      const bool rounds = in.op == ir::Op::Cast && in.dtype == DType::BFloat16;
      ++(rounds ? roundings : others)[static_cast<std::size_t>(a - n_in)];
    }
  }
  // Worth it where an elementwise value with a rounding also has other readers.
  auto rewritten = [&](int i) {
    const auto k = static_cast<std::size_t>(i);
    return exact[k] && roundings[k] > 0 && others[k] > 0 &&
           ir::is_elementwise(p.instrs[k].op);
  };
  bool any = false;
  for (int i = 0; i < n && !any; ++i) any = rewritten(i);
  if (!any) return p;

  std::vector<ir::Instr> out;
  out.reserve(p.instrs.size() + 8);
  std::vector<int> slot_map(p.num_slots());
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  auto emit = [&](ir::Instr in) {
    out.push_back(std::move(in));
    return n_in + static_cast<int>(out.size()) - 1;
  };
  for (int i = 0; i < n; ++i) {
    ir::Instr in = std::move(p.instrs[static_cast<std::size_t>(i)]);
    for (auto& a : in.args) a = slot_map[a];
    const DType dtype = in.dtype;
    const Shape shape = in.shape;
    const int slot = emit(std::move(in));
    slot_map[n_in + i] = slot;
    if (!rewritten(i)) continue;
    // Every later reader reads the rounding widened back; the rounding itself then becomes a
    // round trip, which simplify.h folds into the rounding made here.
    slot_map[n_in + i] = emit(cast(emit(cast(slot, DType::BFloat16, shape)), dtype, shape));
  }
  p.instrs = std::move(out);
  for (auto& o : p.outputs) o = slot_map[o];
  return p;
}

}  // namespace loom::compiler
