// A Program: what the compiler hands the backend. A straight list of instructions over
// numbered slots: slots [0, num_inputs) are the graph's inputs in Graph::inputs order, and
// instruction i writes slot num_inputs + i. Nothing in a Program refers to a particular
// buffer, so one Program serves every step whose graph has the same hash.
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::ir {

// A fused elementwise kernel (made by fuse_elementwise.cpp): a small straight-line program over
// values. Values [0, loads.size()) are read from the instruction's operands; value
// loads.size() + k is steps[k]'s result; the last step's value is the instruction's result.
// Every value is held in the compute type (Float32 or Float64); booleans are 0 or 1.
inline constexpr std::size_t kMaxFusedRank = 8;  // dimensions of a load, after merging

struct FusedLoad {
  int arg;                        // index into Instr::args
  DType dtype;                    // the operand's dtype; converted on load
  // The operand read over the result's index space, after merging dimensions: `sizes` splits
  // the flat result index row-major, `strides` (in operand elements, 0 = broadcast) places
  // each coordinate in the operand, from element `offset`. One size with stride 1 from
  // offset 0 (flat()): a plain contiguous read.
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;  // the operand element read at the result's first position (a slice's)
  // Element i of the result at element i of the operand: a plain contiguous read.
  bool flat() const { return sizes.size() == 1 && strides[0] == 1 && offset == 0; }
};

struct FusedStep {
  Op op;          // an elementwise op, or Constant (value = scalar)
  int a = -1, b = -1, c = -1;  // operand values
  double scalar = 0;  // Constant's value
  DType dtype;        // the IR node's result dtype (Cast: its target)
};

struct Fusion {
  DType compute;
  Shape shape;                     // the result's shape
  std::vector<FusedLoad> loads;
  std::vector<FusedStep> steps;
  int num_registers = 0;           // block-sized scratch registers the steps need
  std::vector<int> register_of;    // per value: scratch register, -1 for a direct read
};

// What a Matmul or Conv2d does to its result as it writes it (compiler/fuse_epilogue.h):
// result = activation(product + bias). The bias is a vector read flat: one value per column of
// a Matmul ([..., M, N]: N values), one per output channel of a Conv2d ([N, O, H, W]: O).
struct Epilogue {
  int bias = -1;                         // index into Instr::args, or -1: none
  Op activation = Op::Count_;    // Relu, Sigmoid, Tanh, Silu, Gelu, GeluTanh; Count_: none
  bool active() const { return bias >= 0 || activation != Op::Count_; }
};

struct Instr {
  Op op;
  DType dtype;
  Shape shape;
  Attr attr;
  std::vector<int> args;       // slots read
  int64_t arena_offset = -1;   // >= 0: the result lives at this byte offset in the arena
  // Set on an elementwise instruction: run this fusion instead (op is its last step's op).
  // Set on a reduction: the fusion computes the reduced operand (fuse_reduce.cpp).
  std::shared_ptr<const Fusion> fusion;
  // Set on a Sum or Mean by stack_reductions.h: further prologues over the same args, reduced
  // over the same axes in the same pass. The result is [1 + stacked.size(), reduced shape...]:
  // `fusion`'s reduction first, then one per entry here.
  std::vector<std::shared_ptr<const Fusion>> stacked;
  // For a result that leaves the program: input slots whose buffer may hold it instead of a
  // new allocation, best first, when at run time nothing else holds that buffer (a parameter
  // or optimizer state that the step overwrites). Each is no longer read once this
  // instruction starts, or read by it element for element (memory_plan.cpp).
  std::vector<int> donors;
  // Set on a Matmul or Conv2d by fuse_epilogue.cpp; the bias, if any, is an extra argument.
  Epilogue epilogue;
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
  int64_t arena_bytes = 0;   // one block for every intermediate (memory_plan.cpp)

  int num_slots() const { return static_cast<int>(inputs.size() + instrs.size()); }
  const SlotType slot_type(int slot) const;
};

// One line per input and instruction (fused ones list their steps), for dumps and tests.
std::string to_text(const Program& p);

// Whether every line of the index in `slot` along its dims after `dim` holds one value: the
// slot is an Expand of something of size 1 in all of those dims (the embedding gradient's
// index [T] expanded to [T, D]), or there is no inner extent at all. A ScatterAdd over such an
// index adds whole rows of its source (both backends' kernels take that path).
bool index_uniform_inner(const Program& p, int slot, std::size_t dim);

// The name of an instruction's kernel in profiler traces, the same on every backend: its op
// ("conv2d", "conv2d_grad_weight", ...), "fused" for a fused elementwise kernel (a fused
// reduction keeps the reduction's name).
const char* kernel_name(const Instr& in);

// What a backend was allocating when the allocation failed, for its error: "the result of
// <kernel> (<dtype>[<shape>], <size>)" for an instruction's own buffer, or "the program's
// <size> of intermediates" for its arena (in null).
std::string allocation_str(const Instr* in, std::size_t bytes);

}  // namespace loom::ir
