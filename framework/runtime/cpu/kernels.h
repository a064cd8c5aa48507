// CPU kernels: one per op, selected by an exhaustive switch (kernels.cpp). Kernels read
// contiguous row-major inputs and write a contiguous row-major output that the runtime has
// already allocated. They follow the operand conventions in ir/op.h and may assume that
// shape inference has validated shapes and dtypes. A data-dependent error (an index out of
// range) throws loom::Error naming the op; the runtime marks the output buffers failed.
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <span>

namespace loom::runtime {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::Float32;
  Shape shape;

  int64_t numel() const { return shape_numel(shape); }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

// Computes `out` from `in` for one op. Leaves other than Constant/Iota (DeviceData) are
// never passed here.
void run_kernel(ir::Op op, const ir::Attr& attr, std::span<const TensorView> in,
                const TensorView& out);

// ScatterAdd (self, index, src) where every line of the index along the dims after `dim`
// holds one value (ir::index_uniform_inner: the embedding gradient's index [T] expanded to
// [T, D]): whole rows of src are added, each at its line's first index, in the order and with
// the bits of run_kernel's ScatterAdd. Falls back to it where the index's inner dims are not
// self's.
void scatter_add_rows_kernel(const ir::Attr& attr, const TensorView& self,
                             const TensorView& index, const TensorView& src,
                             const TensorView& out);

}  // namespace loom::runtime
