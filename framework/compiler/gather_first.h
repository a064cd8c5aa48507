// Gathering before elementwise work: a Gather that picks a few elements out of an elementwise
// result picks them out of its operands instead, and the elementwise ops run on the picked
// elements only.
//
//   %3 = Sub f32[N,V] (%1, %2)  (%2: Expand of a [N,1] column)
//   %4 = Gather f32[N,1] (%3, %idx) [dim=1]
//     →  %a = Gather f32[N,1] (%1, %idx); %4 = Sub f32[N,1] (%a, %2's column)
//
// The case it is for: cross-entropy picks each row's target out of log_softmax(logits), which
// would otherwise be computed and stored whole ([tokens, vocabulary] floats) for a column of
// it. The rewrite goes down through every elementwise producer of the gathered value; at its
// leaves a value computed by anything else is gathered itself, and a broadcast along the
// gathered dimension (a per-row shift such as the log-sum-exp) is broadcast over the index's
// shape instead. It is exact: each picked element is computed by the same ops, in the same
// dtypes, from the same operand values.
//
// It applies only where the index has the gathered value's size in every dimension but the
// gathered one (each picked element comes from its own row), where every leaf can be gathered
// at its dtype on the target, where every broadcast leaf is one value along the gathered
// dimension (any other would have to be stored whole to be gathered), and where some leaf is gathered (that Gather checks the
// index; with every leaf broadcast, an index out of range would pass unseen); otherwise the
// Gather is left as it was. The original
// elementwise instructions stay for any other reader; dead_code.cpp removes them when none is
// left. Assumes lowering's program: instructions in topological order, elementwise operands of
// the result's shape.
#pragma once

#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

ir::Program gather_before_elementwise(ir::Program p, const ir::Target& target);

}  // namespace loom::compiler
