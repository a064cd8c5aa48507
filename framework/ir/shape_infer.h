// Shape and dtype inference for every op, with the user-facing errors of bad input.
#pragma once

#include "ir/node.h"

namespace loom::ir {

struct TypeAndShape {
  DType dtype;
  Shape shape;
};

// Throws loom::Error naming the op, what it expected and what it got.
TypeAndShape infer(Op op, const std::vector<NodePtr>& operands, const Attr& attr);

}  // namespace loom::ir
