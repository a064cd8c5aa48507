#include "ir/shape_infer.h"

#include "ir/unreachable.h"

#include <loom/error.h>

#include <string>

namespace loom::ir {
namespace {

[[noreturn]] void fail(Op op, const std::string& what) {
  throw Error(std::string(op_name(op)) + ": " + what);
}

// a + b and a * b of sizes, padding and strides, or an error naming `op` where the result
// does not fit in int64 (a user's huge padding or dilation, which would wrap to a size).
int64_t add(Op op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(op, "sizes too large: " + std::to_string(a) + " + " + std::to_string(b) + " overflows int64");
  return r;
}
int64_t mul(Op op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(op, "sizes too large: " + std::to_string(a) + " * " + std::to_string(b) + " overflows int64");
  return r;
}

std::string dtypes_of(const std::vector<NodePtr>& xs) {
  std::string s;
  for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? " and " : "") + std::string(dtype_name(xs[i]->dtype()));
  return s;
}

std::string shapes_of(const std::vector<NodePtr>& xs) {
  std::string s;
  for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? " and " : "") + shape_str(xs[i]->shape());
  return s;
}

void expect_float(Op op, const NodePtr& x) {
  if (!is_floating(x->dtype()))
    fail(op, std::string("expected a floating-point tensor (float32 or float64), got ") +
                 dtype_name(x->dtype()));
}

void expect_numeric(Op op, const NodePtr& x) {
  if (x->dtype() == DType::Bool) fail(op, "expected a numeric tensor, got bool");
}

void expect_int64(Op op, const NodePtr& x, const char* role) {
  if (x->dtype() != DType::Int64)
    fail(op, std::string("expected ") + role + " of dtype int64, got " + dtype_name(x->dtype()));
}

void expect_rank(Op op, const NodePtr& x, std::size_t rank, const char* layout) {
  if (x->shape().size() != rank)
    fail(op, "expected a " + std::to_string(rank) + "-D input " + layout + ", got " +
                 shape_str(x->shape()));
}

void expect_same(Op op, const std::vector<NodePtr>& xs, std::size_t first, std::size_t count) {
  for (std::size_t i = first + 1; i < first + count; ++i) {
    if (xs[i]->dtype() != xs[first]->dtype())
      fail(op, "expected operands of one dtype, got " + dtypes_of(xs));
    if (xs[i]->shape() != xs[first]->shape())
      fail(op, "expected operands of one shape, got " + shapes_of(xs));
  }
}

int64_t axis_of(Op op, const Attr& attr, std::size_t rank) {
  const int64_t dim = attr.get<DimAttr>().dim;
  if (dim < 0 || dim >= static_cast<int64_t>(rank))
    fail(op, "expected one dimension in [0, " + std::to_string(rank) + ")");
  return dim;
}

Shape pool_shape(Op op, const NodePtr& x, const Pool2dAttr& a) {
  expect_float(op, x);
  expect_rank(op, x, 4, "[N,C,H,W]");
  const auto& s = x->shape();
  Shape out = s;
  for (int i = 0; i < 2; ++i) {
    int64_t k = a.kernel[i], st = a.stride[i], p = a.padding[i];
    if (k <= 0 || st <= 0 || p < 0)
      fail(op, "expected positive kernel and stride and non-negative padding, got kernel " +
                   std::to_string(k) + ", stride " + std::to_string(st) + ", padding " +
                   std::to_string(p));
    if (p > k / 2)
      fail(op, "expected padding at most half the kernel size, got padding " +
                   std::to_string(p) + " for kernel " + std::to_string(k));
    const int64_t padded = add(op, s[2 + i], 2 * p);  // 2 * p <= k: no overflow
    int64_t o = (padded - k) / st + 1;
    if (padded < k || o <= 0)
      fail(op, "kernel " + std::to_string(k) + " is larger than the padded input " +
                   shape_str(s));
    out[2 + i] = o;
  }
  return out;
}

}  // namespace

TypeAndShape infer(Op op, const std::vector<NodePtr>& xs, const Attr& attr) {
  const OpInfo& info = op_info(op);
  if (info.arity >= 0 && xs.size() != static_cast<std::size_t>(info.arity))
    fail(op, "expected " + std::to_string(info.arity) + " operands, got " +
                 std::to_string(xs.size()));
  for (auto& x : xs)
    if (!x) fail(op, "got an undefined tensor");

  switch (op) {
    case Op::DeviceData:
    case Op::Constant:
    case Op::Iota:
    case Op::Count_:
      fail(op, "is a leaf; it is not built from operands");

    case Op::RandUniform:
    case Op::RandNormal:
      expect_int64(op, xs[0], "a seed");
      if (!xs[0]->shape().empty()) fail(op, "expected a 0-d seed, got " + shape_str(xs[0]->shape()));
      {
        const auto& r = attr.get<RandomAttr>();
        if (!is_floating(r.dtype))
          fail(op, std::string("expected a floating-point dtype, got ") + dtype_name(r.dtype));
        return {r.dtype, r.shape};
      }

    case Op::Neg:
    case Op::Abs:
    case Op::Relu:
      expect_numeric(op, xs[0]);
      return {xs[0]->dtype(), xs[0]->shape()};
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Rsqrt:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::Silu:
    case Op::Gelu:
    case Op::GeluTanh:
    case Op::Erf:
    case Op::Sin:
    case Op::Cos:
      expect_float(op, xs[0]);
      return {xs[0]->dtype(), xs[0]->shape()};
    case Op::LogicalNot:
      return {DType::Bool, xs[0]->shape()};
    case Op::Cast:
      return {attr.get<CastAttr>().to, xs[0]->shape()};

    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Maximum:
    case Op::Minimum:
      expect_same(op, xs, 0, 2);
      expect_numeric(op, xs[0]);
      return {xs[0]->dtype(), xs[0]->shape()};
    case Op::Div:
    case Op::Pow:
      expect_same(op, xs, 0, 2);
      expect_float(op, xs[0]);
      return {xs[0]->dtype(), xs[0]->shape()};
    case Op::Eq:
    case Op::Ne:
      expect_same(op, xs, 0, 2);
      return {DType::Bool, xs[0]->shape()};
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
      expect_same(op, xs, 0, 2);
      expect_numeric(op, xs[0]);
      return {DType::Bool, xs[0]->shape()};

    case Op::Where:
      if (xs[0]->dtype() != DType::Bool)
        fail(op, std::string("expected a bool condition, got ") + dtype_name(xs[0]->dtype()));
      if (xs[0]->shape() != xs[1]->shape()) fail(op, "expected operands of one shape, got " + shapes_of(xs));
      expect_same(op, xs, 1, 2);
      return {xs[1]->dtype(), xs[1]->shape()};

    case Op::Sum:
    case Op::Mean:
    case Op::Max: {
      if (op == Op::Mean) expect_float(op, xs[0]);
      else expect_numeric(op, xs[0]);
      Shape out = xs[0]->shape();
      int64_t prev = -1;
      for (auto a : attr.get<AxesAttr>().axes) {
        if (a <= prev || a >= static_cast<int64_t>(out.size()))
          fail(op, "expected sorted unique axes within rank " + std::to_string(out.size()));
        if (op == Op::Max && out[a] == 0) fail(op, "cannot reduce an empty dimension");
        out[a] = 1;
        prev = a;
      }
      return {xs[0]->dtype(), out};
    }
    case Op::ArgMax: {
      expect_numeric(op, xs[0]);
      Shape out = xs[0]->shape();
      auto a = axis_of(op, attr, out.size());
      if (out[a] == 0) fail(op, "cannot reduce an empty dimension");
      out[a] = 1;
      return {DType::Int64, out};
    }

    case Op::Reshape: {
      const Shape& out = attr.get<ShapeAttr>().shape;
      if (shape_numel(out) != shape_numel(xs[0]->shape()))
        fail(op, "cannot view " + shape_str(xs[0]->shape()) + " as " + shape_str(out));
      return {xs[0]->dtype(), out};
    }
    case Op::Permute: {
      const auto& s = xs[0]->shape();
      const auto& perm = attr.get<PermuteAttr>().perm;
      if (perm.size() != s.size())
        fail(op, "expected a permutation of " + std::to_string(s.size()) + " dimensions");
      std::vector<bool> seen(s.size());
      Shape out;
      for (auto p : perm) {
        if (p < 0 || p >= static_cast<int64_t>(s.size()) || seen[p])
          fail(op, "expected a permutation of " + std::to_string(s.size()) + " dimensions");
        seen[p] = true;
        out.push_back(s[p]);
      }
      return {xs[0]->dtype(), out};
    }
    case Op::Slice: {
      const auto& s = xs[0]->shape();
      std::size_t r = s.size();
      const auto& a = attr.get<SliceAttr>();
      if (a.starts.size() != r || a.steps.size() != r || a.sizes.size() != r)
        fail(op, "expected start, step and size per dimension");
      Shape out(r);
      for (std::size_t d = 0; d < r; ++d) {
        int64_t start = a.starts[d], step = a.steps[d], n = a.sizes[d];
        if (step <= 0) fail(op, "expected a positive step, got " + std::to_string(step));
        if (start < 0 || n < 0 || (n > 0 && start + (n - 1) * step >= s[d]))
          fail(op, "slice out of range for dimension " + std::to_string(d) + " of size " +
                       std::to_string(s[d]));
        out[d] = n;
      }
      return {xs[0]->dtype(), out};
    }
    case Op::Expand: {
      const auto& s = xs[0]->shape();
      const auto& out = attr.get<ShapeAttr>().shape;
      if (out.size() != s.size())
        fail(op, "expected the same rank, got " + shape_str(s) + " to " + shape_str(out));
      for (std::size_t d = 0; d < s.size(); ++d)
        if (s[d] != 1 && s[d] != out[d])
          fail(op, "cannot expand " + shape_str(s) + " to " + shape_str(out));
      return {xs[0]->dtype(), out};
    }
    case Op::Pad: {
      const auto& s = xs[0]->shape();
      const auto& a = attr.get<PadAttr>();
      if (a.lo.size() != s.size() || a.hi.size() != s.size())
        fail(op, "expected two pad sizes per dimension");
      Shape out = s;
      for (std::size_t d = 0; d < s.size(); ++d) {
        if (a.lo[d] < 0 || a.hi[d] < 0) fail(op, "expected non-negative padding");
        out[d] = add(op, add(op, out[d], a.lo[d]), a.hi[d]);
      }
      return {xs[0]->dtype(), out};
    }
    case Op::Concat: {
      if (xs.empty()) fail(op, "expected at least one tensor");
      Shape out = xs[0]->shape();
      auto axis = axis_of(op, attr, out.size());
      for (std::size_t i = 1; i < xs.size(); ++i) {
        const auto& s = xs[i]->shape();
        if (xs[i]->dtype() != xs[0]->dtype())
          fail(op, "expected tensors of one dtype, got " + dtypes_of(xs));
        bool ok = s.size() == out.size();
        for (std::size_t d = 0; ok && d < s.size(); ++d)
          ok = static_cast<int64_t>(d) == axis || s[d] == out[d];
        if (!ok)
          fail(op, "expected shapes that match except in dimension " + std::to_string(axis) +
                       ", got " + shapes_of(xs));
        out[axis] += s[axis];
      }
      return {xs[0]->dtype(), out};
    }

    case Op::Matmul: {
      const auto& a = xs[0]->shape();
      const auto& b = xs[1]->shape();
      expect_float(op, xs[0]);
      if (xs[0]->dtype() != xs[1]->dtype())
        fail(op, "expected operands of one dtype, got " + dtypes_of(xs));
      bool ok = a.size() >= 2 && a.size() == b.size() && a[a.size() - 1] == b[b.size() - 2];
      for (std::size_t d = 0; ok && d + 2 < a.size(); ++d) ok = a[d] == b[d];
      if (!ok)
        fail(op, "expected a [..., M, K] x [..., K, N] product, got " + shapes_of(xs));
      Shape out = a;
      out.back() = b.back();
      return {xs[0]->dtype(), out};
    }
    case Op::Conv2d: {
      expect_float(op, xs[0]);
      expect_rank(op, xs[0], 4, "[N,C,H,W]");
      if (xs[1]->dtype() != xs[0]->dtype())
        fail(op, "expected input and weight of one dtype, got " + dtypes_of(xs));
      if (xs[1]->shape().size() != 4)
        fail(op, "expected a 4-D weight [O,C/groups,kh,kw], got " + shape_str(xs[1]->shape()));
      const auto& a = attr.get<Conv2dAttr>();
      const auto& x = xs[0]->shape();
      const auto& w = xs[1]->shape();
      int64_t groups = a.groups;
      if (groups <= 0) fail(op, "expected groups >= 1, got " + std::to_string(groups));
      if (x[1] % groups != 0 || w[0] % groups != 0 || w[1] * groups != x[1])
        fail(op, "expected weight [O,C/groups,kh,kw] with C = " + std::to_string(x[1]) +
                     " and groups = " + std::to_string(groups) + ", got weight " + shape_str(w));
      Shape out{x[0], w[0], 0, 0};
      for (int i = 0; i < 2; ++i) {
        int64_t st = a.stride[i], p = a.padding[i], dil = a.dilation[i];
        if (st <= 0 || p < 0 || dil <= 0)
          fail(op, "expected positive stride and dilation and non-negative padding");
        const int64_t span = add(op, mul(op, dil, w[2 + i] - 1), 1);
        const int64_t padded = add(op, x[2 + i], mul(op, 2, p));
        if (padded < span)
          fail(op, "kernel " + shape_str(w) + " is larger than the padded input " + shape_str(x));
        out[2 + i] = (padded - span) / st + 1;
      }
      return {xs[0]->dtype(), out};
    }
    case Op::MaxPool2d:
    case Op::AvgPool2d:
      return {xs[0]->dtype(), pool_shape(op, xs[0], attr.get<Pool2dAttr>())};
    case Op::Conv2dGradInput:
    case Op::Conv2dGradWeight: {
      // Built by autograd from a checked Conv2d, so these checks guard internal misuse.
      const auto& a = attr.get<Conv2dGradAttr>();
      expect_float(op, xs[0]);
      if (xs[0]->dtype() != xs[1]->dtype()) fail(op, "expected operands of one dtype, got " + dtypes_of(xs));
      if (xs[0]->shape().size() != 4 || xs[1]->shape().size() != 4)
        fail(op, "expected 4-D operands, got " + shapes_of(xs));
      int64_t groups = a.conv.groups;
      if (op == Op::Conv2dGradInput) {
        const auto& g = xs[0]->shape();
        const auto& w = xs[1]->shape();
        return {xs[0]->dtype(), {g[0], w[1] * groups, a.size[0], a.size[1]}};
      }
      const auto& x = xs[0]->shape();
      const auto& g = xs[1]->shape();
      return {xs[0]->dtype(), {g[1], x[1] / groups, a.size[0], a.size[1]}};
    }
    case Op::Im2col: {
      // Made by compiler/conv_im2col.cpp from a checked Conv2d: these checks guard misuse.
      const auto& a = attr.get<Conv2dGradAttr>();
      expect_rank(op, xs[0], 4, "[N,C,H,W]");
      if (a.conv.groups != 1 || a.conv.channels_last)
        fail(op, "expected a conv of one group over [N,C,H,W]");
      const auto& x = xs[0]->shape();
      int64_t positions = x[0];
      for (int i = 0; i < 2; ++i) {
        const int64_t st = a.conv.stride[i], p = a.conv.padding[i], dil = a.conv.dilation[i];
        const int64_t span = dil * (a.size[i] - 1) + 1;
        if (st <= 0 || p < 0 || dil <= 0 || a.size[i] <= 0 || x[2 + i] + 2 * p < span)
          fail(op, "expected a window that fits the padded input " + shape_str(x));
        positions *= (x[2 + i] + 2 * p - span) / st + 1;
      }
      return {xs[0]->dtype(), {x[1] * a.size[0] * a.size[1], positions}};
    }
    case Op::MaxPool2dGrad: {
      auto expected = pool_shape(op, xs[0], attr.get<Pool2dAttr>());
      if (xs[1]->shape() != expected || xs[1]->dtype() != xs[0]->dtype())
        fail(op, "expected a gradient of the pooled shape " + shape_str(expected) + ", got " +
                     shape_str(xs[1]->shape()));
      return {xs[0]->dtype(), xs[0]->shape()};
    }
    case Op::AvgPool2dGrad: {
      expect_float(op, xs[0]);
      expect_rank(op, xs[0], 4, "[N,C,Ho,Wo]");
      const auto& a = attr.get<Pool2dGradAttr>();
      const auto& g = xs[0]->shape();
      return {xs[0]->dtype(), {g[0], g[1], a.size[0], a.size[1]}};
    }

    case Op::Gather: {
      expect_int64(op, xs[1], "an index");
      const auto& s = xs[0]->shape();
      const auto& idx = xs[1]->shape();
      auto dim = axis_of(op, attr, s.size());
      bool ok = idx.size() == s.size();
      for (std::size_t d = 0; ok && d < s.size(); ++d)
        ok = static_cast<int64_t>(d) == dim || idx[d] <= s[d];
      if (!ok)
        fail(op, "expected an index of the input's rank, no larger outside dimension " +
                     std::to_string(dim) + ", got input " + shape_str(s) + " and index " +
                     shape_str(idx));
      return {xs[0]->dtype(), idx};
    }
    case Op::IndexSelect: {
      expect_int64(op, xs[1], "an index");
      if (xs[1]->shape().size() != 1)
        fail(op, "expected a 1-D index, got " + shape_str(xs[1]->shape()));
      Shape out = xs[0]->shape();
      auto dim = axis_of(op, attr, out.size());
      out[dim] = xs[1]->shape()[0];
      return {xs[0]->dtype(), out};
    }
    case Op::ScatterAdd: {
      expect_int64(op, xs[1], "an index");
      expect_numeric(op, xs[0]);
      const auto& s = xs[0]->shape();
      auto dim = axis_of(op, attr, s.size());
      if (xs[2]->dtype() != xs[0]->dtype())
        fail(op, "expected self and src of one dtype, got " + dtypes_of(xs));
      bool ok = xs[1]->shape() == xs[2]->shape() && xs[1]->shape().size() == s.size();
      for (std::size_t d = 0; ok && d < s.size(); ++d)
        ok = static_cast<int64_t>(d) == dim || xs[1]->shape()[d] <= s[d];
      if (!ok)
        fail(op, "expected index and src of one shape, of self's rank, got " + shapes_of(xs));
      return {xs[0]->dtype(), s};
    }
    case Op::OneHot: {
      expect_int64(op, xs[0], "indices");
      const int64_t classes = attr.get<OneHotAttr>().num_classes;
      if (classes <= 0) fail(op, "expected a positive number of classes");
      Shape out = xs[0]->shape();
      out.push_back(classes);
      return {DType::Int64, out};
    }
  }
  LOOM_UNREACHABLE("infer: op out of range");
}

}  // namespace loom::ir
