// Every gradient rule, in one exhaustive switch over ir::Op. Rules build ordinary lazy ops,
// so the backward pass joins the forward pass in the step's graph. Elementwise nodes have
// operands of one shape (the API inserted explicit expands), so their rules need no
// broadcasting; the Expand rule sums the gradient back to the smaller shape.
#include "autograd/grad_node.h"
#include "ir/unreachable.h"
#include "lazy/ops_util.h"

#include <cmath>
#include <numbers>
#include <numeric>
#include <optional>

namespace loom::autograd {
namespace {

using ir::Op;

Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor as(const Tensor& mask, const Tensor& like) { return mask.to(like.dtype()); }

// The gradient of a gather that picks one element per line along `dim` (an index of size 1
// there and of x's size elsewhere: a classifier's targets in cross_entropy) as elementwise
// ops: g where a line's position equals its index, zero elsewhere, which then fuses with what
// reads it, where scattering into a zero tensor of x's size would fill, copy and scatter.
// 0 + g is what the scatter adds, so the bits are the same (-0 included). Positions and
// indices are compared in g's dtype, exact up to 2^24 (float32) or 2^53 positions; otherwise,
// and for other dtypes, nullopt (the scatter then runs).
std::optional<Tensor> one_per_line_gather_grad(const Tensor& x, const Tensor& idx, int64_t dim,
                                               const Tensor& g) {
  const Shape& xs = x.shape();
  const Shape& is = idx.shape();
  const auto d = static_cast<std::size_t>(dim);
  if (is.size() != xs.size() || is[d] != 1 || xs[d] <= 1) return std::nullopt;
  for (std::size_t k = 0; k < xs.size(); ++k)
    if (k != d && is[k] != xs[k]) return std::nullopt;
  const DType t = g.dtype();
  const int64_t exact = t == DType::Float32 ? int64_t{1} << 24 : int64_t{1} << 53;
  if ((t != DType::Float32 && t != DType::Float64) || xs[d] > exact) return std::nullopt;
  Shape line(xs.size(), 1);
  line[d] = xs[d];
  auto hit = eq(expand(iota(line, dim, t, g.device()), xs), expand(idx.to(t), xs));
  auto zero = zeros({}, t, g.device());
  return where(hit, expand(zero + g, xs), expand(zero, xs));
}

// Whether an operand's edge leads to a transpose: a Permute swapping the last two dimensions
// and keeping the others in place.
bool made_by_transpose(const Edge& e) {
  if (!e.fn || e.fn->op != Op::Permute) return false;
  const auto& perm = e.fn->attr.get<ir::PermuteAttr>().perm;
  const auto rank = static_cast<int64_t>(perm.size());
  if (rank < 2 || perm[rank - 1] != rank - 2 || perm[rank - 2] != rank - 1) return false;
  for (int64_t d = 0; d + 2 < rank; ++d)
    if (perm[d] != d) return false;
  return true;
}

// Scatters g back into a zero tensor of `in` shape at start + i*step per dimension.
Tensor slice_backward(Tensor g, const Shape& in, const ir::SliceAttr& a) {
  auto r = in.size();
  for (std::size_t d = 0; d < r; ++d) {
    int64_t start = a.starts[d], step = a.steps[d], n = a.sizes[d];
    if (step > 1) {
      // [.., n, ..] -> [.., n, step] (zeros after each element) -> [.., n*step, ..]
      Shape s = g.shape();
      Shape wide = s;
      wide.insert(wide.begin() + d + 1, 1);
      std::vector<int64_t> pads(2 * wide.size(), 0);
      auto g2 = reshape(g, wide);
      std::vector<int64_t> fpads;  // F.pad order: last dimension first
      for (std::size_t k = wide.size(); k-- > 0;) {
        fpads.push_back(0);
        fpads.push_back(k == d + 1 ? step - 1 : 0);
      }
      g2 = pad(g2, fpads);
      s[d] = n * step;
      g = reshape(g2, s);
    }
    int64_t len = g.shape()[d];
    int64_t keep = std::min(len, in[d] - start);
    if (keep < len) g = slice(g, static_cast<int64_t>(d), 0, keep);
    std::vector<int64_t> fpads(2 * r, 0);
    std::size_t k = r - 1 - d;
    fpads[2 * k] = start;
    fpads[2 * k + 1] = in[d] - start - keep;
    g = pad(g, fpads);
  }
  return g;
}

// Sums g over the dimensions that an Expand from `in` broadcast.
Tensor expand_backward(const Tensor& g, const Shape& in) {
  std::vector<int64_t> axes;
  for (std::size_t d = 0; d < in.size(); ++d)
    if (in[d] == 1 && g.shape()[d] != 1) axes.push_back(static_cast<int64_t>(d));
  return axes.empty() ? g : sum(g, axes, true);
}

// Expands a keepdim-shaped reduction result back over `in`.
Tensor unreduce(const Tensor& g, const Shape& in) { return expand(g, in); }

Tensor conv_input_grad(const Tensor& g, const Tensor& w, const ir::Conv2dAttr& conv, const Shape& in) {
  return lazy::apply(Op::Conv2dGradInput, {g, w}, ir::Conv2dGradAttr{conv, {in[2], in[3]}});
}

Tensor conv_weight_grad(const Tensor& x, const Tensor& g, const ir::Conv2dAttr& conv, const Shape& w) {
  return lazy::apply(Op::Conv2dGradWeight, {x, g}, ir::Conv2dGradAttr{conv, {w[2], w[3]}});
}

}  // namespace

std::vector<Tensor> grad_rule(const GradNode& node, const Tensor& g) {
  auto in = [&](std::size_t k) { return lazy::make_tensor(node.inputs[k], node.device); };
  auto out = [&] { return lazy::make_tensor(node.output, node.device); };
  auto needs = [&](std::size_t k) { return node.next[k].needed(); };

  switch (node.op) {
    case Op::DeviceData: case Op::Constant: case Op::Iota:
    case Op::RandUniform: case Op::RandNormal:
    case Op::LogicalNot: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
    case Op::Ge: case Op::ArgMax: case Op::OneHot: case Op::Count_:
    // Gradient ops are not recorded (no double backward): op_info(op).differentiable.
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col:
      return std::vector<Tensor>(node.inputs.size());

    case Op::Neg: return {-g};
    case Op::Exp: return {g * out()};
    case Op::Log: return {g / in(0)};
    case Op::Sqrt: return {g / (out() * 2.0)};
    case Op::Rsqrt: { auto y = out(); return {g * y * y * y * -0.5}; }
    case Op::Abs: { auto x = in(0); return {g * (as(gt(x, zeros_like(x)), x) - as(lt(x, zeros_like(x)), x))}; }
    // From the output (y > 0 exactly where x > 0), as PyTorch does: the backward then keeps no
    // pre-activation, which can fuse into the ReLU (BatchNorm's shift + ReLU). A NaN input gets
    // no gradient here (PyTorch's passes it through; the step is NaN either way).
    case Op::Relu: { auto y = out(); return {g * as(gt(y, zeros_like(y)), y)}; }
    case Op::Sigmoid: { auto y = out(); return {g * y * (1.0 - y)}; }
    case Op::Tanh: { auto y = out(); return {g * (1.0 - y * y)}; }
    case Op::Silu: {
      auto x = in(0);
      auto s = sigmoid(x);
      return {g * s * (1.0 + x * (1.0 - s))};
    }
    case Op::Gelu: {
      // d/dx x·Φ(x) = Φ(x) + x·φ(x)
      auto x = in(0);
      auto cdf = (lazy::apply(Op::Erf, {x * (1 / std::numbers::sqrt2)}) + 1.0) * 0.5;
      auto pdf = exp(x * x * -0.5) * (1 / std::sqrt(2 * std::numbers::pi));
      return {g * (cdf + x * pdf)};
    }
    case Op::GeluTanh: {
      constexpr double k = 0.7978845608028654;  // sqrt(2/pi)
      constexpr double c = 0.044715;
      auto x = in(0);
      auto t = tanh((x + x * x * x * c) * k);
      auto dt = (1.0 - t * t) * ((x * x * (3 * c) + 1.0) * k);
      return {g * ((t + 1.0) * 0.5 + x * dt * 0.5)};
    }
    case Op::Erf: {
      auto x = in(0);
      return {g * exp(-(x * x)) * (2 / std::sqrt(std::numbers::pi))};
    }
    case Op::Sin: return {g * cos(in(0))};
    case Op::Cos: return {-(g * sin(in(0)))};
    case Op::Cast: {
      auto x = in(0);
      if (!is_floating(x.dtype())) return {Tensor()};
      return {g.to(x.dtype())};
    }

    case Op::Add: return {g, g};
    case Op::Sub: return {g, needs(1) ? -g : Tensor()};
    case Op::Mul: return {needs(0) ? g * in(1) : Tensor(), needs(1) ? g * in(0) : Tensor()};
    case Op::Div: {
      auto b = in(1);
      return {needs(0) ? g / b : Tensor(), needs(1) ? -(g * out() / b) : Tensor()};
    }
    case Op::Pow: {
      // As PyTorch: no gradient to the base where the exponent is 0 (b·a^(b-1) is 0·inf at
      // a = 0), none to the exponent where the base is 0 and the exponent >= 0 (a^b·log a is
      // 0·-inf or 1·-inf there).
      auto a = in(0), b = in(1);
      auto z = zeros_like(g);
      Tensor ga, gb;
      if (needs(0)) ga = where(eq(b, zeros_like(b)), z, g * b * pow(a, b - 1.0));
      if (needs(1)) {
        auto base_zero = as(eq(a, zeros_like(a)), a) * as(ge(b, zeros_like(b)), a);
        gb = where(gt(base_zero, zeros_like(base_zero)), z, g * out() * log(a));
      }
      return {ga, gb};
    }
    case Op::Maximum:
    case Op::Minimum: {
      // Ties split the gradient evenly, as PyTorch does. Where an operand is NaN neither gets
      // a gradient (PyTorch gives both the whole of it).
      auto a = in(0), b = in(1);
      auto win = node.op == Op::Maximum ? gt(a, b) : lt(a, b);
      auto lose = node.op == Op::Maximum ? lt(a, b) : gt(a, b);
      auto tie = as(eq(a, b), a) * 0.5;
      return {g * (as(win, a) + tie), g * (as(lose, a) + tie)};
    }
    case Op::Where: {
      auto c = in(0);
      auto z = zeros_like(g);
      return {Tensor(), needs(1) ? where(c, g, z) : Tensor(), needs(2) ? where(c, z, g) : Tensor()};
    }

    case Op::Sum: return {unreduce(g, node.inputs[0]->shape())};
    case Op::Mean: {
      const auto& s = node.inputs[0]->shape();
      int64_t count = 1;
      for (auto a : node.attr.get<ir::AxesAttr>().axes) count *= s[a];
      return {unreduce(g, s) * (1.0 / static_cast<double>(count))};
    }
    case Op::Max: {
      // Ties share the gradient evenly (torch.amax).
      auto x = in(0);
      auto mask = as(eq(x, unreduce(out(), x.shape())), x);
      auto count = sum(mask, node.attr.get<ir::AxesAttr>().axes, true);
      return {mask * unreduce(g / count, x.shape())};
    }

    case Op::Reshape: return {reshape(g, node.inputs[0]->shape())};
    case Op::Permute: {
      const auto& perm = node.attr.get<ir::PermuteAttr>().perm;
      std::vector<int64_t> inverse(perm.size());
      for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
      return {permute(g, inverse)};
    }
    case Op::Slice: return {slice_backward(g, node.inputs[0]->shape(), node.attr.get<ir::SliceAttr>())};
    case Op::Expand: return {expand_backward(g, node.inputs[0]->shape())};
    case Op::Pad: {
      Tensor r = g;
      const auto& s = node.inputs[0]->shape();
      const auto& lo = node.attr.get<ir::PadAttr>().lo;
      for (std::size_t d = 0; d < s.size(); ++d)
        r = slice(r, static_cast<int64_t>(d), lo[d], lo[d] + s[d]);
      return {r};
    }
    case Op::Concat: {
      std::vector<Tensor> grads;
      int64_t at = 0;
      const int64_t dim = node.attr.get<ir::DimAttr>().dim;
      for (const auto& x : node.inputs) {
        int64_t n = x->shape()[dim];
        grads.push_back(slice(g, dim, at, at + n));
        at += n;
      }
      return grads;
    }

    case Op::Matmul: {
      // An operand made by a transpose (a Linear's W^T, attention's k^T) gets its gradient
      // as the transpose of a product in the source's layout, (g^T a)^T for b and (b g^T)^T
      // for a: the transpose's own rule then transposes it back, and in a compiled step the
      // two cancel (simplify.cpp), so a Linear's weight gradient comes out of the product in
      // the weight's layout, where a^T g needed a copy into it. Eager mode runs both
      // transposes, which move values without changing them: the bits are the same.
      auto a = in(0), b = in(1);
      auto t = [](const Tensor& x) { return transpose(x, -1, -2); };
      Tensor ga, gb;
      if (needs(0)) ga = made_by_transpose(node.next[0]) ? t(matmul(b, t(g))) : matmul(g, t(b));
      if (needs(1)) gb = made_by_transpose(node.next[1]) ? t(matmul(t(g), a)) : matmul(t(a), g);
      return {ga, gb};
    }
    case Op::Conv2d: {
      auto x = in(0), w = in(1);
      const auto& conv = node.attr.get<ir::Conv2dAttr>();
      return {needs(0) ? conv_input_grad(g, w, conv, x.shape()) : Tensor(),
              needs(1) ? conv_weight_grad(x, g, conv, w.shape()) : Tensor()};
    }
    case Op::MaxPool2d: return {lazy::apply(Op::MaxPool2dGrad, {in(0), g}, node.attr)};
    case Op::AvgPool2d: {
      const auto& s = node.inputs[0]->shape();
      const ir::Pool2dGradAttr a{node.attr.get<ir::Pool2dAttr>(), {s[2], s[3]}};
      return {lazy::apply(Op::AvgPool2dGrad, {g}, a)};
    }

    case Op::Gather: {
      auto x = in(0), idx = in(1);
      const int64_t dim = node.attr.get<ir::DimAttr>().dim;
      if (auto picked = one_per_line_gather_grad(x, idx, dim, g)) return {*picked, Tensor()};
      return {scatter_add(zeros_like(x), dim, idx, g), Tensor()};
    }
    case Op::IndexSelect: {
      auto x = in(0), idx = in(1);
      const int64_t dim = node.attr.get<ir::DimAttr>().dim;
      Shape s(g.dim(), 1);
      s[dim] = idx.numel();
      return {scatter_add(zeros_like(x), dim, expand(reshape(idx, s), g.shape()), g), Tensor()};
    }
    case Op::ScatterAdd: {
      const int64_t dim = node.attr.get<ir::DimAttr>().dim;
      return {needs(0) ? g : Tensor(), Tensor(), needs(2) ? gather(g, dim, in(1)) : Tensor()};
    }
  }
  LOOM_UNREACHABLE("grad_rule: op out of range");
}

}  // namespace loom::autograd
