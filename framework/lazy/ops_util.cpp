// The helpers of ops_util.h: building a node from tensors (and recording its gradient), 0-d
// scalars, broadcasting and dimension checks.
#include "lazy/ops_util.h"

#include "autograd/grad_node.h"
#include "lazy/executor.h"

#include <loom/bfloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace loom::lazy {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw Error(std::string(op) + ": " + what);
}

ir::NodePtr node_of(const Tensor& t, const char* op) {
  if (!t.defined()) fail(op, "expected a defined tensor, got an empty handle");
  return t.impl()->node();
}

Tensor apply(ir::Op op, const std::vector<Tensor>& operands, ir::Attr attr) {
  const char* name = ir::op_name(op);
  // Before reading the operands' IR: a cut materializes them, and the op must build on that.
  note_traced_op();
  std::vector<ir::NodePtr> nodes;
  nodes.reserve(operands.size());
  for (const auto& t : operands) nodes.push_back(node_of(t, name));
  Device device = operands.empty() ? Device{} : operands.front().device();
  for (const auto& t : operands) {
    if (!(t.device() == device))
      fail(name, "expected operands on one device, got " + device_str(device) + " and " +
                     device_str(t.device()));
  }
  auto out = make_tensor(ir::make_node(op, nodes, attr), device);
  autograd::record(op, attr, operands, nodes, out);
  return out;
}

bool bakes_scalar(double value) {
  // -0.0 is data: its sign shows (1 / x, x * s), and a captured step's guard (class_of) tells
  // the baked values apart as 0 or 1 only, so it would replay a baked +0 for it.
  if ((value != 0 && value != 1) || std::signbit(value)) return false;
  // Read on every call (a getenv is cheap next to a transfer), so tests can flip it.
  const char* off = std::getenv("LOOM_NO_SPECIAL_SCALARS");
  return !(off && *off && std::string(off) != "0");
}

Tensor scalar(double value, DType dtype, Device device) {
  if (bakes_scalar(value))
    return make_tensor(ir::make_leaf(ir::Op::Constant, dtype, {}, ir::ScalarAttr{value}), device);
  return scalar_data(value, dtype, device);
}

void check_fits(const char* op, double value, DType dtype) {
  // An integer value is `value` truncated toward zero; NaN or a value outside the dtype's
  // range has none (its conversion would be undefined).
  const double limit = dtype == DType::Int64 ? 0x1p63 : 0x1p31;
  if ((dtype == DType::Int64 || dtype == DType::Int32) && !(value >= -limit && value < limit))
    fail(op, "the value " + std::to_string(value) + " does not fit in " + dtype_name(dtype));
}

Tensor scalar_data(double value, DType dtype, Device device) {
  check_fits("scalar", value, dtype);
  switch (dtype) {
    case DType::Float32: { float v = static_cast<float>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Float64: return make_device_tensor(&value, dtype, {}, device);
    case DType::Int64: { auto v = static_cast<int64_t>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Int32: { auto v = static_cast<int32_t>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Bool: { unsigned char v = value != 0; return make_device_tensor(&v, dtype, {}, device); }
    case DType::BFloat16: {
      bfloat16 v(static_cast<float>(value));
      return make_device_tensor(&v, dtype, {}, device);
    }
  }
  fail("scalar", "unknown dtype");
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(op, "expected shapes that broadcast, got " + shape_str(a) + " and " + shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalize_dim(int64_t dim, int64_t rank, const char* op) {
  const int64_t wrap = std::max<int64_t>(rank, 1);  // a 0-d tensor takes 0 and -1
  const int64_t d = dim < 0 ? dim + wrap : dim;
  if (d < 0 || d >= wrap)
    fail(op, "expected a dimension in [" + std::to_string(-wrap) + ", " + std::to_string(wrap) +
                 "), got " + std::to_string(dim));
  return d;
}

int64_t existing_dim(int64_t dim, int64_t rank, const char* op) {
  if (rank == 0)
    fail(op, "expected a tensor with at least one dimension, got a 0-d tensor (dimension " +
                 std::to_string(dim) + ")");
  return normalize_dim(dim, rank, op);
}

}  // namespace loom::lazy
