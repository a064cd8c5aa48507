// Helpers shared by the files that implement the public ops (ops_*.cpp).
#pragma once

#include "ir/node.h"
#include "lazy/tensor_impl.h"

#include <string>

namespace loom::lazy {

// The IR value of a tensor used as an operand; throws for an undefined tensor.
ir::NodePtr node_of(const Tensor& t, const char* op);
// Builds (and in eager mode runs) a node of `op` over `operands`, on `device`.
Tensor apply(ir::Op op, const std::vector<Tensor>& operands, ir::Attr attr = {});
// A 0-d scalar: a baked-in constant for 0 and 1 (not -0; unless LOOM_NO_SPECIAL_SCALARS=1),
// otherwise device data, so a new value never recompiles.
Tensor scalar(double value, DType dtype, Device device);
// Throws, naming `op`, when `value` has no integer value in `dtype` (an integer dtype): NaN,
// or outside its range once truncated toward zero. Float dtypes take any value.
void check_fits(const char* op, double value, DType dtype);
// Whether scalar() bakes `value` into the graph (0 and 1, not -0; unless
// LOOM_NO_SPECIAL_SCALARS=1).
bool bakes_scalar(double value);
// `value` as 0-d device data, never baked in.
Tensor scalar_data(double value, DType dtype, Device device);
// NumPy broadcasting of two shapes; throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// A dimension index in [0, rank), negatives counting from the end. A 0-d tensor (rank 0)
// takes 0 and -1, as in PyTorch, for ops that are defined on it.
int64_t normalize_dim(int64_t dim, int64_t rank, const char* op);
// The same for an op that reads the size of dimension `dim`: throws naming `op` for a 0-d
// tensor, which has none.
int64_t existing_dim(int64_t dim, int64_t rank, const char* op);

[[noreturn]] void fail(const char* op, const std::string& what);

// Whether matmul/conv2d on these operands computes in bfloat16: inside an Autocast scope
// (include/loom/autocast.h) with float32 operands (autocast.cpp).
bool autocasts(const Tensor& a, const Tensor& b);

}  // namespace loom::lazy
