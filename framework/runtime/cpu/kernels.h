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

}  // namespace loom::runtime
