// Elementwise ops: broadcasting happens here, as explicit expands, so every elementwise
// node in the IR has operands of one shape.
#include "lazy/ops_util.h"

#include <cmath>
#include <cstdio>

namespace loom {
namespace lazy {

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
// The scalar operand of `op` in t's dtype. A fractional scalar has no value in an integer or
// bool dtype (PyTorch would promote the result to float; loom does not promote).
Tensor scalar_like(const char* op, const Tensor& t, double v) {
  if (!t.defined()) lazy::fail(op, "expected a defined tensor, got an empty handle");
  if (!is_floating(t.dtype()) && !(v == std::trunc(v))) {
    char text[32];
    std::snprintf(text, sizeof text, "%.10g", v);
    lazy::fail(op, std::string("the scalar ") + text + " is not a whole number, and a scalar takes the tensor's dtype (" +
                       dtype_name(t.dtype()) + "): convert the tensor first (x.to(DType::Float32))");
  }
  return lazy::scalar(v, t.dtype(), t.device());
}
}  // namespace

Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like("add", a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like("sub", a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like("mul", a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like("div", a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like("add", b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like("sub", b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like("mul", b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like("div", b, a), b); }
Tensor& operator+=(Tensor& a, const Tensor& b) { return a = add(a, b); }
Tensor& operator-=(Tensor& a, const Tensor& b) { return a = sub(a, b); }
Tensor& operator*=(Tensor& a, const Tensor& b) { return a = mul(a, b); }

}  // namespace loom
