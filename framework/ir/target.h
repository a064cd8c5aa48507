// A Target: what a backend tells the compiler about itself, so that one graph compiles
// differently per device. compiler::compile(graph, target) checks that the device runs every
// op at its dtype and runs only the rewrites the target asks for; the pass order itself is
// fixed (compiler/pipeline.cpp).
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::ir {

struct Target {
  std::string name;  // the device kind, for messages and dumps

  // Per op, a bit per DType (1 << int(dtype)) that the device runs it at.
  std::array<uint8_t, kOpCount> dtypes{};

  // Rewrites that the device's kernels take (each pass's header says what it makes).
  bool fuse_epilogue = false;      // Matmul/Conv2d with bias and activation: fuse_epilogue.h
  bool fuse_elementwise = false;   // elementwise chains as one kernel: fuse_elementwise.h
  bool fuse_reduce_prologue = false;  // a reduction over a fused operand: fuse_reduce.h
  bool fold_transpose = false;     // Matmul reading a transposed operand: fold_transpose.h
  // Where set, sibling sums and means over operands of one shape run in one pass
  // (compiler/stack_reductions.h) where this says the device's kernel reads them together:
  // asked with the prologue's shape and the reduced axes.
  bool (*stack_reductions)(const Shape& operand, const std::vector<int64_t>& axes) = nullptr;
  bool plan_memory = false;        // intermediates in one arena per program: memory_plan.h
  // Whether a fused kernel's costly steps (exp, log, division, square roots, sigmoid and the
  // like) are cheap beside the memory traffic they can save, as on a GPU: fuse_elementwise.h
  // then computes a value made of them again in each of its readers, as it does a value of
  // cheap steps, instead of storing it once and loading it back (a softmax's exponentials,
  // read by its sum and by its gradient). Unset (the CPU, where an exp costs more than the
  // float it would load), such values are computed once.
  bool recompute_costly_steps = false;
  // A bit per DType (1 << int(dtype)): convs of that dtype run on channels-last activations,
  // and the layout spreads to their neighbours (compiler/channels_last.h).
  uint8_t channels_last_convs = 0;
  // Where set, which of those convs do: asked with a conv's dtype, its forward attribute and
  // its forward shapes (input [N,C,H,W], weight [O,C/g,kh,kw], output [N,O,Ho,Wo]), the same
  // question for all three passes of one conv, so they agree. Unset: all of them.
  bool (*channels_last_conv)(DType dtype, const Conv2dAttr& attr, const Shape& input,
                             const Shape& weight, const Shape& output) = nullptr;
  // Where set, the forward convs (one group, [N,C,H,W]) for which it says so run as Im2col and
  // one Matmul (compiler/conv_im2col.h); asked as channels_last_conv is.
  bool (*conv_as_matmul)(DType dtype, const Conv2dAttr& attr, const Shape& input,
                         const Shape& weight, const Shape& output) = nullptr;

  bool runs(Op op, DType dtype) const {
    return (dtypes[static_cast<int>(op)] >> static_cast<int>(dtype)) & 1;
  }
  // Every op at every dtype, but bfloat16 only where the op moves or converts elements
  // (moves_elements): bfloat16 arithmetic is then widened to float32 (compiler/widen.h). A
  // device whose kernels compute in bfloat16 adds those ops with run_bfloat16.
  void run_everything() {
    constexpr auto bf16 = 1u << static_cast<int>(DType::BFloat16);
    for (int op = 0; op < kOpCount; ++op)
      dtypes[op] = static_cast<uint8_t>(((1u << kDTypeCount) - 1) &
                                        ~(moves_elements(static_cast<Op>(op)) ? 0u : bf16));
  }
  void run_bfloat16(Op op) { dtypes[static_cast<int>(op)] |= 1u << static_cast<int>(DType::BFloat16); }

  // The ops whose kernels only copy or convert elements: a bfloat16 passes through them bit
  // for bit (or is converted, by Cast).
  static constexpr bool moves_elements(Op op) {
    switch (op) {
      case Op::DeviceData: case Op::Cast: case Op::Reshape: case Op::Permute: case Op::Slice:
      case Op::Expand: case Op::Concat: case Op::Gather: case Op::IndexSelect: case Op::Im2col:
        return true;
      default:
        return false;
    }
  }
};

}  // namespace loom::ir
