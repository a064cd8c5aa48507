// Reductions: sum, mean, amax and argmax, and the softmax family built from them. The IR keeps
// reduced axes with size 1; keepdim=false drops them here with a reshape.
#include "lazy/ops_util.h"

#include <algorithm>
#include <numeric>

namespace loom {

using ir::Op;
using lazy::apply;
using lazy::fail;
using lazy::normalize_dim;

namespace {

std::vector<int64_t> normalize_axes(const Tensor& x, std::vector<int64_t> axes, const char* op) {
  if (axes.empty()) {
    axes.resize(x.dim());
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (auto& a : axes) a = normalize_dim(a, x.dim(), op);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(op, "expected each axis once");
  if (x.dim() == 0) return {};  // dimension 0 or -1 of a 0-d tensor: its one element
  return axes;
}

Shape drop_axes(const Shape& s, const std::vector<int64_t>& axes) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), d)) out.push_back(s[d]);
  return out;
}

Tensor reduce(Op op, const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  const char* name = ir::op_name(op);
  if (!x.defined()) fail(name, "expected a defined tensor, got an empty handle");
  axes = normalize_axes(x, std::move(axes), name);
  auto r = apply(op, {x}, ir::AxesAttr{axes});
  return keepdim ? r : reshape(r, drop_axes(x.shape(), axes));
}

}  // namespace

// An int32 or bool sum is int64, as in PyTorch (an int32 one wrapped around at 2^31, and a
// bool one, a count, was refused).
Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  const bool widen = x.defined() && (x.dtype() == DType::Int32 || x.dtype() == DType::Bool);
  return reduce(Op::Sum, widen ? x.to(DType::Int64) : x, std::move(axes), keepdim);
}
Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdim) { return reduce(Op::Mean, x, std::move(axes), keepdim); }
Tensor amax(const Tensor& x, std::vector<int64_t> axes, bool keepdim) { return reduce(Op::Max, x, std::move(axes), keepdim); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  if (!x.defined()) fail("argmax", "expected a defined tensor, got an empty handle");
  dim = normalize_dim(dim, x.dim(), "argmax");
  if (x.dim() == 0) return zeros({}, DType::Int64, x.device());
  auto r = apply(Op::ArgMax, {x}, ir::DimAttr{dim});
  return keepdim ? r : reshape(r, drop_axes(x.shape(), {dim}));
}

namespace {

// log(sum(exp(x - m))) + m over `axes` (kept), m the shift. Shifting by the max keeps exp from
// overflowing. The shift cancels in the value, so its gradient is zero (-sum(softmax) + 1):
// detached, the backward is grad * softmax alone, as in PyTorch, without a pass that finds
// where each row's maximum is and sums its share.
Tensor shifted_logsumexp(const Tensor& x, const std::vector<int64_t>& axes, const Tensor& m) {
  return log(sum(exp(x - m), axes, true)) + m;
}

}  // namespace

Tensor logsumexp(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  if (!x.defined()) fail("logsumexp", "expected a defined tensor, got an empty handle");
  if (x.dtype() == DType::BFloat16)  // one rounding, as PyTorch's (see softmax)
    return logsumexp(x.to(DType::Float32), std::move(axes), keepdim).to(DType::BFloat16);
  axes = normalize_axes(x, std::move(axes), "logsumexp");
  // An infinite maximum shifts by 0 instead, as in PyTorch: x - m would be Inf - Inf = NaN,
  // where the value is -Inf (every term -Inf) or +Inf. |m| + |m| == |m| holds for 0 and Inf
  // only (and a shift of 0 is m itself at 0): no Inf scalar to copy to the device per call.
  auto m = amax(x, axes, true).detach();
  const auto size = abs(m);
  m = where(eq(size + size, size), zeros({}, m.dtype(), m.device()), m);
  auto r = shifted_logsumexp(x, axes, m);
  return keepdim ? r : reshape(r, drop_axes(x.shape(), axes));
}

// Shifted by the maximum as it is: a row with an infinite maximum is NaN throughout, as PyTorch's
// log_softmax gives it (the value is NaN or -Inf - -Inf there anyway).
Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (!x.defined()) fail("log_softmax", "expected a defined tensor, got an empty handle");
  if (x.dtype() == DType::BFloat16)  // one rounding, as PyTorch's (see softmax)
    return log_softmax(x.to(DType::Float32), dim).to(DType::BFloat16);
  const std::vector<int64_t> axes = normalize_axes(x, {dim}, "log_softmax");
  return x - shifted_logsumexp(x, axes, amax(x, axes, true).detach());
}

Tensor softmax(const Tensor& x, int64_t dim) {
  if (!x.defined()) fail("softmax", "expected a defined tensor, got an empty handle");
  // A bfloat16 softmax is computed in float32 and rounded once, as PyTorch's kernel does: built
  // from bfloat16 ops, each of its steps (the exponentials, their sum, the quotient) was
  // rounded, and a row's largest weight could be a few percent off (log_softmax's, 0.1).
  if (x.dtype() == DType::BFloat16) return softmax(x.to(DType::Float32), dim).to(DType::BFloat16);
  auto e = exp(x - amax(x, {dim}, true).detach());  // the shift cancels: no gradient (logsumexp)
  return e / sum(e, {dim}, true);
}

}  // namespace loom
