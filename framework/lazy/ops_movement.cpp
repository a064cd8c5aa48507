// Movement ops: reshape, permute, slice, expand, pad, concat and the views built from them.
#include "lazy/ops_util.h"

#include <algorithm>
#include <numeric>

namespace loom {

using ir::Op;
using lazy::apply;
using lazy::fail;
using lazy::normalize_dim;

Tensor reshape(const Tensor& x, Shape shape) {
  if (!x.defined()) fail("reshape", "expected a defined tensor, got an empty handle");
  int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) fail("reshape", "expected at most one -1 in " + shape_str(shape));
      infer = i;
    } else if (shape[i] <= 0) {
      fail("reshape", "expected positive sizes (or one -1), got " + shape_str(shape));
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      fail("reshape", "cannot view " + shape_str(x.shape()) + " as " + shape_str(shape) +
                          ": more elements than an int64 counts");
    }
  }
  if (infer >= 0) {
    if (x.numel() % known != 0)
      fail("reshape", "cannot view " + shape_str(x.shape()) + " as " + shape_str(shape));
    shape[infer] = x.numel() / known;
  }
  if (shape == x.shape()) return x;
  return apply(Op::Reshape, {x}, ir::ShapeAttr{shape});
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (!x.defined()) fail("flatten", "expected a defined tensor, got an empty handle");
  start_dim = normalize_dim(start_dim, x.dim(), "flatten");
  end_dim = normalize_dim(end_dim, x.dim(), "flatten");
  if (x.dim() == 0) return reshape(x, {1});
  if (start_dim > end_dim) fail("flatten", "expected start_dim <= end_dim");
  Shape out(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t n = 1;
  for (auto d = start_dim; d <= end_dim; ++d) n *= x.shape()[d];
  out.push_back(n);
  out.insert(out.end(), x.shape().begin() + end_dim + 1, x.shape().end());
  return reshape(x, out);
}

Tensor permute(const Tensor& x, std::vector<int64_t> perm) {
  if (!x.defined()) fail("permute", "expected a defined tensor, got an empty handle");
  if (static_cast<int64_t>(perm.size()) != x.dim())
    fail("permute", "expected " + std::to_string(x.dim()) + " dimensions, got " + std::to_string(perm.size()));
  bool identity = true;
  for (int64_t i = 0; i < static_cast<int64_t>(perm.size()); ++i) {
    perm[i] = normalize_dim(perm[i], x.dim(), "permute");
    identity = identity && perm[i] == i;
  }
  if (identity) return x;
  return apply(Op::Permute, {x}, ir::PermuteAttr{perm});
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  if (!x.defined()) fail("transpose", "expected a defined tensor, got an empty handle");
  d0 = normalize_dim(d0, x.dim(), "transpose");
  d1 = normalize_dim(d1, x.dim(), "transpose");
  if (x.dim() == 0) return x;  // dimensions 0 and -1 of a 0-d tensor: itself, as in PyTorch
  std::vector<int64_t> perm(x.dim());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[d0], perm[d1]);
  return permute(x, perm);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (!x.defined()) fail("slice", "expected a defined tensor, got an empty handle");
  dim = lazy::existing_dim(dim, x.dim(), "slice");
  if (step <= 0) fail("slice", "expected a positive step, got " + std::to_string(step));
  int64_t n = x.shape()[dim];
  auto clamp = [n](int64_t i) { return std::clamp(i < 0 ? i + n : i, int64_t{0}, n); };
  start = clamp(start);
  end = clamp(end);
  if (end <= start)
    fail("slice", "expected a non-empty range of dimension " + std::to_string(dim) + " (size " +
                      std::to_string(n) + "), got [" + std::to_string(start) + ", " + std::to_string(end) + ")");
  if (start == 0 && step == 1 && end == n) return x;
  ir::SliceAttr a{std::vector<int64_t>(x.dim(), 0), std::vector<int64_t>(x.dim(), 1), x.shape()};
  a.starts[dim] = start;
  a.steps[dim] = step;
  a.sizes[dim] = 1 + (end - start - 1) / step;  // (end - start + step - 1) / step could overflow
  return apply(Op::Slice, {x}, std::move(a));
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  if (xs.empty()) fail("concat", "expected at least one tensor, got none");
  for (const auto& t : xs)
    if (!t.defined()) fail("concat", "expected defined tensors, got an empty handle");
  dim = lazy::existing_dim(dim, xs.front().dim(), "concat");
  if (xs.size() == 1) return xs.front();
  return apply(Op::Concat, xs, ir::DimAttr{dim});
}

Tensor expand(const Tensor& x, Shape shape) {
  if (!x.defined()) fail("expand", "expected a defined tensor, got an empty handle");
  if (shape.size() < x.shape().size())
    fail("expand", "expected at least " + std::to_string(x.dim()) + " dimensions, got " + shape_str(shape));
  std::size_t lead = shape.size() - x.shape().size();
  Shape src(lead, 1);
  src.insert(src.end(), x.shape().begin(), x.shape().end());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (d < lead) fail("expand", "expected -1 only for existing dimensions, got " + shape_str(shape));
      shape[d] = src[d];
    }
    if (src[d] != 1 && src[d] != shape[d])
      fail("expand", "cannot expand " + shape_str(x.shape()) + " to " + shape_str(shape));
  }
  Tensor base = src == x.shape() ? x : reshape(x, src);
  if (shape == src) return base;
  return apply(Op::Expand, {base}, ir::ShapeAttr{shape});
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) { return expand(x, shape); }

Tensor pad(const Tensor& x, std::vector<int64_t> pads, double value) {
  if (!x.defined()) fail("pad", "expected a defined tensor, got an empty handle");
  if (pads.size() % 2 != 0 || static_cast<int64_t>(pads.size()) > 2 * x.dim())
    fail("pad", "expected an even number of pad sizes, at most two per dimension, got " +
                    std::to_string(pads.size()));
  lazy::check_fits("pad", value, x.dtype());
  ir::PadAttr a{std::vector<int64_t>(x.dim(), 0), std::vector<int64_t>(x.dim(), 0), value};
  bool any = false;
  for (std::size_t i = 0; i < pads.size() / 2; ++i) {
    // F.pad order: the last dimension first.
    std::size_t d = x.dim() - 1 - i;
    if (pads[2 * i] < 0 || pads[2 * i + 1] < 0) fail("pad", "expected non-negative padding");
    a.lo[d] = pads[2 * i];
    a.hi[d] = pads[2 * i + 1];
    any = any || pads[2 * i] || pads[2 * i + 1];
  }
  if (!any) return x;
  return apply(Op::Pad, {x}, std::move(a));
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  if (!x.defined()) fail("unsqueeze", "expected a defined tensor, got an empty handle");
  dim = normalize_dim(dim, x.dim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + dim, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  if (!x.defined()) fail("squeeze", "expected a defined tensor, got an empty handle");
  dim = normalize_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0 || x.shape()[dim] != 1) return x;  // a 0-d tensor: itself, as in PyTorch
  Shape s = x.shape();
  s.erase(s.begin() + dim);
  return reshape(x, s);
}

}  // namespace loom
