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
  if (x.dim() == 0) return {};  // dimension 0 or -1 of a 0-d tensor: its one element
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(op, "expected each axis once");
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

Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdim) { return reduce(Op::Sum, x, std::move(axes), keepdim); }
Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdim) { return reduce(Op::Mean, x, std::move(axes), keepdim); }
Tensor amax(const Tensor& x, std::vector<int64_t> axes, bool keepdim) { return reduce(Op::Max, x, std::move(axes), keepdim); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  if (!x.defined()) fail("argmax", "expected a defined tensor, got an empty handle");
  dim = normalize_dim(dim, x.dim(), "argmax");
  if (x.dim() == 0) return zeros({}, DType::Int64, x.device());
  auto r = apply(Op::ArgMax, {x}, ir::DimAttr{dim});
  return keepdim ? r : reshape(r, drop_axes(x.shape(), {dim}));
}

Tensor logsumexp(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  if (!x.defined()) fail("logsumexp", "expected a defined tensor, got an empty handle");
  axes = normalize_axes(x, std::move(axes), "logsumexp");
  // Shifting by the max keeps exp from overflowing. The shift cancels in the value, so its
  // gradient is zero (-sum(softmax) + 1): detached, the backward is grad * softmax alone, as in
  // PyTorch, without a pass that finds where each row's maximum is and sums its share.
  auto m = amax(x, axes, true).detach();
  auto r = log(sum(exp(x - m), axes, true)) + m;
  return keepdim ? r : reshape(r, drop_axes(x.shape(), axes));
}

Tensor log_softmax(const Tensor& x, int64_t dim) { return x - logsumexp(x, {dim}, true); }

Tensor softmax(const Tensor& x, int64_t dim) {
  if (!x.defined()) fail("softmax", "expected a defined tensor, got an empty handle");
  auto e = exp(x - amax(x, {dim}, true).detach());  // the shift cancels: no gradient (logsumexp)
  return e / sum(e, {dim}, true);
}

}  // namespace loom
