// Fusion of elementwise chains.
//
// Rewrites each floating-point elementwise instruction (unary, binary, where, cast, and
// comparisons of floats) into a fused instruction (Instr::fusion) that also computes every
// elementwise producer feeding only it, so a chain like sin(cos(x)) or BatchNorm's
// normalise-scale-shift reads each input once and writes one result. Constants and
// broadcasts (Expand) that feed a fused instruction are folded into it: a constant becomes a
// step, a broadcast becomes a strided load of the Expand's source. Those instructions stay in
// place for any other reader; dead_code.cpp removes the ones nobody reads any more.
//
// Lone elementwise instructions become one-step fusions too, so every floating-point
// elementwise op runs through the same kernel in every execution mode.
//
// Assumes: instructions in topological order; elementwise operands have the result's shape.
// A producer read by several instructions, or one that is a program output, is not merged
// into its readers (it would be computed twice); it heads a fusion of its own.
#pragma once

#include "ir/program.h"

namespace loom::compiler {

ir::Program fuse_elementwise(ir::Program p);

}  // namespace loom::compiler
