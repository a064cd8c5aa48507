// A Program: what the compiler hands the backend. A straight list of instructions over
// numbered slots: slots [0, num_inputs) are the graph's inputs in Graph::inputs order, and
// instruction i writes slot num_inputs + i. Nothing in a Program refers to a particular
// buffer, so one Program serves every step whose graph has the same hash.
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <cstdint>
#include <vector>

namespace loom::compiler {

struct Instr {
  ir::Op op;
  DType dtype;
  Shape shape;
  ir::Attr attr;
  std::vector<int> args;       // slots read
  std::vector<int> free_after; // slots whose last reader this is (memory planning)
};

struct SlotType {
  DType dtype;
  Shape shape;
};

struct Program {
  uint64_t hash = 0;
  std::vector<SlotType> inputs;
  std::vector<Instr> instrs;
  std::vector<int> outputs;  // slots, one per graph output
  std::size_t graph_nodes = 0;

  int num_slots() const { return static_cast<int>(inputs.size() + instrs.size()); }
  const SlotType slot_type(int slot) const;
};

}  // namespace loom::compiler
