// Fills and conversions: constant fill, iota and cast, each a flat loop over contiguous
// buffers split into TBB chunks. The unary, binary and ternary elementwise ops are not here:
// each has one implementation, the step that fusions run (kernels_fused.cpp).
#include "runtime/cpu/kernels_impl.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

namespace loom::runtime {
namespace {

// Converts to a storage type; bool is "not zero", as in PyTorch. bfloat16 goes through
// float32 both ways (a float64 is rounded to float32 first, as PyTorch does).
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<From, bfloat16>)
    return convert<To>(static_cast<float>(v));
  else if constexpr (std::is_same_v<To, BoolStorage>)
    return static_cast<BoolStorage>(v != From(0));
  else if constexpr (std::is_same_v<To, bfloat16>)
    return bfloat16(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

template <class In, class Out, class F>
void map1(const TensorView& x, const TensorView& out, int64_t grain, F f) {
  const In* px = x.as<const In>();
  Out* po = out.as<Out>();
  parallel_range(out.numel(), grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = f(px[i]);
  });
}

}  // namespace

void fill_value(const TensorView& out, double value) {
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = convert<T>(value);
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainElementwise, [&](int64_t b, int64_t e) {
      std::fill(po + b, po + e, v);
    });
  });
}

void iota_kernel(const ir::Attr& attr, const TensorView& out) {
  auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  int64_t size = out.shape[dim];
  int64_t inner = dims_product(out.shape, dim + 1, out.shape.size());
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainElementwise, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = convert<T>((i / inner) % size);
    });
  });
}

void cast_kernel(const TensorView& x, const TensorView& out) {
  if (x.dtype == out.dtype) {
    if (x.data != out.data) std::memcpy(out.data, x.data, out.numel() * dtype_size(out.dtype));
    return;
  }
  visit_storage(x.dtype, [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    visit_storage(out.dtype, [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      map1<In, Out>(x, out, kGrainElementwise, [](In v) { return convert<Out>(v); });
    });
  });
}

}  // namespace loom::runtime
