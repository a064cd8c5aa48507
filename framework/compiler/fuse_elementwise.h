// Fusion of elementwise chains.
//
// Rewrites each floating-point elementwise instruction (unary, binary, where, cast, and
// comparisons of floats) into a fused instruction (Instr::fusion) that also computes every
// elementwise producer feeding only it, so a chain like sin(cos(x)) or BatchNorm's
// normalise-scale-shift reads each input once and writes one result. Constants, broadcasts
// (Expand), slices and permutes that keep the innermost dimension innermost (attention's
// [B,T,H,D] <-> [B,H,T,D]) that feed a fused instruction are folded into it: a constant
// becomes a step, a broadcast a strided load of its source, and a chain of such slices and
// permutes one strided load of the chain's source, at an offset (FusedLoad::offset: a rotary
// embedding's halves of each head). A permute that moves the innermost dimension (a layout
// change) keeps its own kernel, which moves tiles where a load would gather element by
// element. Those instructions stay in place for any other reader; dead_code.cpp removes the
// ones nobody reads any more.
//
// Lone elementwise instructions become one-step fusions too, so every floating-point
// elementwise op runs through the same kernel in every execution mode.
//
// A producer read by several fusions is computed again in each of them when that is cheap: an
// arithmetic op (no transcendental function, a few steps) whose recomputation reads no more
// bytes per element than loading its result would (a small broadcast, a per-channel vector,
// counts as read from cache). The widening cast of a bfloat16 tensor is
// the common case (its readers load the 2-byte values, not a 4-byte copy), and with it a
// BatchNorm's centring and normalising over a bfloat16 conv output, which then never goes to
// memory in float32. Such a producer is still stored where something else reads it (an
// instruction that is not a fusion, or the caller); a reduction reading it takes it as its
// prologue (fuse_reduce.h). A producer of cheap steps that fails that test is still computed
// in each reader where that moves fewer bytes in all than storing it and loading it back: its
// readers already load most of what it is computed from (a BatchNorm's float32 input
// gradient, read by its sum and by the rounding for the conv, both of which load the bfloat16
// conv output and gradient it is computed from). Any other producer read by several
// instructions, or that is a program output, heads a fusion of its own and is computed once.
//
// On a target with recompute_costly_steps (ir/target.h), "cheap" takes in the transcendental
// steps and division too: a softmax's exponentials, computed from the bfloat16 logits, are
// then computed in its sum's prologue and in its gradient instead of going to memory in
// float32 and coming back twice. LOOM_RECOMPUTE_COSTLY=0|1 overrides the target's choice (to
// compare the two on one device).
//
// Assumes: instructions in topological order; elementwise operands have the result's shape.
#pragma once

#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

ir::Program fuse_elementwise(ir::Program p, const ir::Target& target);

}  // namespace loom::compiler
