// Index ops: gather, index_select (and embedding over it), scatter_add, one_hot.
#include "lazy/ops_util.h"

namespace loom {

using ir::Op;
using lazy::apply;
using lazy::fail;
using lazy::normalize_dim;

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  if (!x.defined()) fail("gather", "expected a defined tensor, got an empty handle");
  return apply(Op::Gather, {x, index}, ir::DimAttr{normalize_dim(dim, x.dim(), "gather")});
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  if (!x.defined()) fail("index_select", "expected a defined tensor, got an empty handle");
  return apply(Op::IndexSelect, {x, index}, ir::DimAttr{normalize_dim(dim, x.dim(), "index_select")});
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  if (!weight.defined() || !indices.defined()) fail("embedding", "expected defined tensors");
  if (weight.dim() != 2)
    fail("embedding", "expected a 2-D weight [num_embeddings, dim], got " + shape_str(weight.shape()));
  if (indices.dtype() != DType::Int64)
    fail("embedding", std::string("expected int64 indices, got ") + dtype_name(indices.dtype()));
  auto rows = index_select(weight, 0, reshape(indices, {indices.numel()}));
  Shape out = indices.shape();
  out.push_back(weight.shape()[1]);
  return reshape(rows, out);
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (!self.defined()) fail("scatter_add", "expected a defined tensor, got an empty handle");
  return apply(Op::ScatterAdd, {self, index, src}, ir::DimAttr{normalize_dim(dim, self.dim(), "scatter_add")});
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  return apply(Op::OneHot, {indices}, ir::OneHotAttr{num_classes});
}

}  // namespace loom
