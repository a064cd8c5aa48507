// Elementwise ops: broadcasting happens here, as explicit expands, so every elementwise
// node in the IR has operands of one shape.
#include "lazy/ops_util.h"

#include "autograd/grad_node.h"
#include "lazy/executor.h"

#include <cstdlib>

namespace loom {
namespace lazy {

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

Tensor scalar(double value, DType dtype, Device device) {
  // Read on every call (a getenv is cheap next to a transfer), so tests can flip it.
  const char* off = std::getenv("LOOM_NO_SPECIAL_SCALARS");
  bool special = !(off && *off && std::string(off) != "0");
  bool baked = special && (value == 0 || value == 1);
  if (baked)
    return make_tensor(ir::make_leaf(ir::Op::Constant, dtype, {}, {{}, value}), device);
  switch (dtype) {
    case DType::Float32: { float v = static_cast<float>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Float64: return make_device_tensor(&value, dtype, {}, device);
    case DType::Int64: { auto v = static_cast<int64_t>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Int32: { auto v = static_cast<int32_t>(value); return make_device_tensor(&v, dtype, {}, device); }
    case DType::Bool: { unsigned char v = value != 0; return make_device_tensor(&v, dtype, {}, device); }
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
  int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= std::max<int64_t>(rank, 1) || (rank == 0 && dim != 0 && dim != -1))
    fail(op, "expected a dimension in [" + std::to_string(-rank) + ", " + std::to_string(rank) +
                 "), got " + std::to_string(dim));
  return d;
}

namespace {

Tensor unary(ir::Op op, const Tensor& x) { return apply(op, {x}); }

Tensor binary(ir::Op op, const Tensor& a, const Tensor& b) {
  const char* name = ir::op_name(op);
  if (!a.defined() || !b.defined()) fail(name, "expected defined tensors, got an empty handle");
  if (a.dtype() != b.dtype())
    fail(name, std::string("expected operands of one dtype, got ") + dtype_name(a.dtype()) +
                   " and " + dtype_name(b.dtype()));
  Shape out = broadcast_shapes(a.shape(), b.shape(), name);
  return apply(op, {broadcast_to(a, out), broadcast_to(b, out)});
}

}  // namespace
}  // namespace lazy

using lazy::binary;
using lazy::unary;
using ir::Op;

Tensor neg(const Tensor& x) { return unary(Op::Neg, x); }
Tensor exp(const Tensor& x) { return unary(Op::Exp, x); }
Tensor log(const Tensor& x) { return unary(Op::Log, x); }
Tensor sqrt(const Tensor& x) { return unary(Op::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(Op::Rsqrt, x); }
Tensor abs(const Tensor& x) { return unary(Op::Abs, x); }
Tensor relu(const Tensor& x) { return unary(Op::Relu, x); }
Tensor sigmoid(const Tensor& x) { return unary(Op::Sigmoid, x); }
Tensor tanh(const Tensor& x) { return unary(Op::Tanh, x); }
Tensor silu(const Tensor& x) { return unary(Op::Silu, x); }
Tensor gelu(const Tensor& x, bool approximate) { return unary(approximate ? Op::GeluTanh : Op::Gelu, x); }
Tensor sin(const Tensor& x) { return unary(Op::Sin, x); }
Tensor cos(const Tensor& x) { return unary(Op::Cos, x); }
Tensor logical_not(const Tensor& x) { return unary(Op::LogicalNot, x); }

Tensor add(const Tensor& a, const Tensor& b) { return binary(Op::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(Op::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(Op::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(Op::Div, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(Op::Pow, a, b); }
Tensor pow(const Tensor& a, double e) { return pow(a, lazy::scalar(e, a.dtype(), a.device())); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(Op::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(Op::Minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(Op::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary(Op::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(Op::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary(Op::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(Op::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary(Op::Ge, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (!cond.defined() || !a.defined() || !b.defined())
    lazy::fail("where", "expected defined tensors, got an empty handle");
  if (a.dtype() != b.dtype())
    lazy::fail("where", std::string("expected a and b of one dtype, got ") + dtype_name(a.dtype()) +
                            " and " + dtype_name(b.dtype()));
  Shape out = lazy::broadcast_shapes(lazy::broadcast_shapes(cond.shape(), a.shape(), "where"),
                                     b.shape(), "where");
  return lazy::apply(Op::Where, {broadcast_to(cond, out), broadcast_to(a, out), broadcast_to(b, out)});
}

namespace {
Tensor scalar_like(const Tensor& t, double v) {
  if (!t.defined()) lazy::fail("scalar op", "expected a defined tensor, got an empty handle");
  return lazy::scalar(v, t.dtype(), t.device());
}
}  // namespace

Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like(b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like(b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like(b, a), b); }
Tensor& operator+=(Tensor& a, const Tensor& b) { return a = add(a, b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a = sub(a, b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a = mul(a, b); }

}  // namespace loom
