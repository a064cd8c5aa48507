#include "ir/program.h"

#include <cstdio>
#include <sstream>

namespace loom::ir {

const SlotType Program::slot_type(int slot) const {
  auto n = static_cast<int>(inputs.size());
  if (slot < n) return inputs[slot];
  const auto& in = instrs[slot - n];
  return {in.dtype, in.shape};
}

namespace {

// "{cos(l0) sin(v1)}": the steps of a fusion, each naming its operand values (l: a load).
void write_fusion(std::ostream& os, const Fusion& f) {
  const auto n_loads = static_cast<int>(f.loads.size());
  auto value = [&](std::ostream& out, int v) -> std::ostream& {
    return out << (v < n_loads ? 'l' : 'v') << v;
  };
  os << " {";
  for (std::size_t k = 0; k < f.steps.size(); ++k) {
    const auto& s = f.steps[k];
    os << (k ? " " : "") << op_name(s.op) << '(';
    if (s.op == Op::Constant) os << s.scalar;
    const char* sep = "";
    for (int v : {s.a, s.b, s.c})
      if (v >= 0) value(os << sep, v), sep = ", ";
    os << ')';
  }
  os << '}';
}

}  // namespace

const char* kernel_name(const Instr& in) {
  return in.fusion && op_info(in.op).group != OpGroup::Reduce ? "fused" : op_name(in.op);
}

std::string allocation_str(const Instr* in, std::size_t bytes) {
  char size[32];
  const double b = static_cast<double>(bytes);
  if (b >= 0x1p30) std::snprintf(size, sizeof size, "%.1f GiB", b / 0x1p30);
  else if (b >= 0x1p20) std::snprintf(size, sizeof size, "%.1f MiB", b / 0x1p20);
  else std::snprintf(size, sizeof size, "%zu bytes", bytes);
  if (!in) return std::string("the program's ") + size + " of intermediates";
  std::string s = "the result of ";
  s += kernel_name(*in);
  s += " (";
  s += dtype_name(in->dtype);
  s += shape_str(in->shape);
  s += ", ";
  s += size;
  s += ")";
  return s;
}

bool index_uniform_inner(const Program& p, int slot, std::size_t dim) {
  const Shape& is = p.slot_type(slot).shape;
  int64_t inner = 1;
  for (std::size_t d = dim + 1; d < is.size(); ++d) inner *= is[d];
  if (inner == 1) return true;
  const int inputs = static_cast<int>(p.inputs.size());
  if (slot < inputs) return false;
  const auto& e = p.instrs[static_cast<std::size_t>(slot - inputs)];
  if (e.op != Op::Expand) return false;
  const Shape& from = p.slot_type(e.args[0]).shape;
  if (from.size() != is.size()) return false;
  for (std::size_t d = dim + 1; d < from.size(); ++d)
    if (from[d] != 1) return false;
  return true;
}

std::string to_text(const Program& p) {
  std::ostringstream os;
  os << "program " << std::hex << p.hash << std::dec << " (" << p.inputs.size() << " inputs, "
     << p.instrs.size() << " instructions, arena " << p.arena_bytes << " bytes)\n";
  for (std::size_t i = 0; i < p.inputs.size(); ++i)
    os << "  $" << i << " = input " << dtype_name(p.inputs[i].dtype) << shape_str(p.inputs[i].shape)
       << '\n';
  for (std::size_t i = 0; i < p.instrs.size(); ++i) {
    const auto& in = p.instrs[i];
    os << "  $" << p.inputs.size() + i << " = " << (in.fusion ? "fused " : "")
       << op_name(in.op) << ' ' << dtype_name(in.dtype) << shape_str(in.shape) << '(';
    for (std::size_t k = 0; k < in.args.size(); ++k) os << (k ? ", $" : "$") << in.args[k];
    os << ')';
    if (auto attr = attr_str(in.attr); !attr.empty()) os << " [" << attr << ']';
    if (in.fusion) write_fusion(os, *in.fusion);
    for (const auto& f : in.stacked) write_fusion(os, *f);
    if (in.epilogue.active()) {
      os << " epilogue{";
      if (in.epilogue.bias >= 0) os << "bias $" << in.args[in.epilogue.bias];
      if (in.epilogue.activation != Op::Count_)
        os << (in.epilogue.bias >= 0 ? " " : "") << op_name(in.epilogue.activation);
      os << '}';
    }
    if (in.arena_offset >= 0) os << "  @" << in.arena_offset;
    if (!in.donors.empty()) {
      os << "  donors";
      for (auto d : in.donors) os << " $" << d;
    }
    os << '\n';
  }
  os << "  outputs:";
  for (auto o : p.outputs) os << " $" << o;
  os << '\n';
  return os.str();
}

}  // namespace loom::ir
