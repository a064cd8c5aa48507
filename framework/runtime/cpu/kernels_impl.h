// Private to the CPU kernels: the per-group kernel entry points that kernels.cpp dispatches
// to, and the dtype and parallel-loop helpers they share.
//
//   visit_dtype(x.dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;
//     parallel_range(n, kGrainElementwise, [&](int64_t b, int64_t e) { ... });
//   });
//
// Kernels are templated on the element type only; ranks are handled at run time so the
// number of instantiations stays small (CI builds on two cores).
#pragma once

#include "runtime/cpu/heap_count.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/small_vector.h"

#include <loom/bfloat16.h>
#include <loom/error.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::runtime {

// ---- dtype dispatch ----

template <class T>
struct TypeTag {
  using type = T;
};

// Bool is stored as one byte holding 0 or 1; uint8_t (not bool) so that reading any byte is
// defined and arithmetic on it needs no special cases.
using BoolStorage = uint8_t;

// The dtype a kernel's element type T stores (BoolStorage: Bool).
template <class T>
constexpr DType storage_dtype_of() {
  if constexpr (std::is_same_v<T, BoolStorage>) return DType::Bool;
  else return dtype_of<T>();
}

[[noreturn]] inline void unsupported_dtype(const char* op, DType t) {
  throw Error(std::string(op) + ": the CPU kernel does not support dtype " + dtype_name(t));
}

// Calls f(TypeTag<T>{}) with T the storage type of `t`, for the dtypes kernels compute in.
// bfloat16 is not one: the compiler widens bfloat16 arithmetic to float32 (compiler/widen.h),
// so only the kernels that convert or move bits see it (visit_storage, visit_width), and the
// conv and matmul kernels where oneDNN runs bfloat16 (they dispatch it before visiting).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Bool: return f(TypeTag<BoolStorage>{});
    case DType::BFloat16: break;
  }
  unsupported_dtype("kernel", t);
}

// As visit_dtype, bfloat16 included (loom::bfloat16, which converts to and from float): for
// the kernels that only convert, Cast and a fusion's loads and stored result.
template <class F>
decltype(auto) visit_storage(DType t, F&& f) {
  if (t == DType::BFloat16) return f(TypeTag<bfloat16>{});
  return visit_dtype(t, std::forward<F>(f));
}

// Floating-point dtypes only: other dtypes throw naming `op`.
template <class F>
decltype(auto) visit_float(const char* op, DType t, F&& f) {
  if (t == DType::Float32) return f(TypeTag<float>{});
  if (t == DType::Float64) return f(TypeTag<double>{});
  unsupported_dtype(op, t);
}

// Numeric (everything but bool).
template <class F>
decltype(auto) visit_numeric(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Bool: case DType::BFloat16: break;
  }
  unsupported_dtype(op, t);
}

// Data movement only cares about the element width, so it instantiates per width, not per
// dtype: calls f(TypeTag<U>{}) with U an unsigned integer of the element's size.
template <class F>
decltype(auto) visit_width(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    default: break;  // dtype_size returns size_t; every DType is 1, 2, 4 or 8 bytes wide
  }
  unsupported_dtype("kernel", t);
}

// ---- per-thread scratch ----

inline constexpr std::size_t kScratchAlignment = 64;

// At least n elements of T that belong to the calling thread, grown once and kept, so a
// steady-state step allocates nothing. `Tag` names the user: users that hold buffers at the
// same time on one thread (a reduction's partials and its prologue's registers) need
// different tags.
// The buffer starts on a cache line (64 bytes), so a vector loop over it never splits a line:
// a std::vector's 16-byte alignment made each 64-byte access of an AVX-512 loop touch two lines.
template <class T, class Tag>
T* thread_scratch(std::size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= kScratchAlignment);
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{kScratchAlignment}); }
  };
  thread_local std::unique_ptr<T[], Free> buf;  // grows to the largest n, then never again
  thread_local std::size_t size = 0;
  if (size < n) {
    // The old buffer stays until the new one is made, so a failed allocation leaves it whole.
    std::unique_ptr<T[], Free> grown(static_cast<T*>(
        ::operator new[](n * sizeof(T), std::align_val_t{kScratchAlignment})));
    std::uninitialized_value_construct_n(grown.get(), n);
    buf = std::move(grown);
    size = n;
  }
  return buf.get();
}

// ---- parallel loops ----

// Elements per task for cheap elementwise work; small tensors then run on the caller's thread.
inline constexpr int64_t kGrainElementwise = 16384;
// For transcendental functions, where each element costs tens of cycles.
inline constexpr int64_t kGrainTranscendental = 4096;

// Runs f(begin, end) over [0, n) in chunks of at least `grain`, in parallel when n > grain.
// The worker threads count their allocations in the tasks (heap_count.h), as the device
// thread does throughout a program.
template <class F>
void parallel_range(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      HeapCount counting;
                      f(r.begin(), r.end());
                    });
}

// A bfloat16 conv or matmul that runs on loom's float32 kernels rather than oneDNN's bfloat16
// ones (conv/conv_algorithm.h; LOOM_MATMUL=eigen): f(a, b, out) computes on float32 copies of
// the two operands (exact: a bfloat16 is a float32) into a float32 result, which is then
// rounded to bfloat16 once, as the compiler's widening would (compiler/widen.h).
template <class F>
void run_widened(const TensorView& a, const TensorView& b, const TensorView& out, F&& f) {
  struct WidenA;
  struct WidenB;
  struct WidenOut;
  const auto widen = [](const TensorView& v, float* dst) {
    const bfloat16* src = v.as<const bfloat16>();
    parallel_range(v.numel(), kGrainElementwise, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dst[i] = static_cast<float>(src[i]);
    });
  };
  float* fa = thread_scratch<float, WidenA>(static_cast<std::size_t>(a.numel()));
  float* fb = thread_scratch<float, WidenB>(static_cast<std::size_t>(b.numel()));
  float* fo = thread_scratch<float, WidenOut>(static_cast<std::size_t>(out.numel()));
  widen(a, fa);
  widen(b, fb);
  f(static_cast<const float*>(fa), static_cast<const float*>(fb), fo);
  bfloat16* po = out.as<bfloat16>();
  parallel_range(out.numel(), kGrainElementwise, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) po[i] = bfloat16(fo[i]);
  });
}

// Per-dimension strides or sizes, in place up to rank 8.
using Strides = SmallVector<int64_t, 8>;

// Row-major strides of a shape, in elements.
inline Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// Product of s[from..to) (a Shape or Strides).
template <class S>
int64_t dims_product(const S& s, std::size_t from, std::size_t to) {
  int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= s[i];
  return n;
}

// Copies `shape` elements of width `elem` from src (strides src_strides, may be 0 for
// broadcast) to dst (strides dst_strides); offsets are in elements. Used by every movement op.
void strided_copy(const void* src, const Strides& src_strides, int64_t src_offset, void* dst,
                  const Strides& dst_strides, int64_t dst_offset, const Shape& shape, DType dtype);

// Fills a tensor with `value` converted to its dtype (bool: value != 0).
void fill_value(const TensorView& out, double value);

// ---- kernels, by group (the file that defines each is named in the comment) ----

using Inputs = std::span<const TensorView>;

// kernels_elementwise.cpp (the other elementwise ops: elementwise_kernel, kernels_fused.h)
void iota_kernel(const ir::Attr& attr, const TensorView& out);
void cast_kernel(const TensorView& x, const TensorView& out);

// kernels_random.cpp
void rand_uniform_kernel(const TensorView& seed, const TensorView& out);
void rand_normal_kernel(const TensorView& seed, const TensorView& out);

// kernels_reduce.cpp
void reduce_kernel(ir::Op op, const ir::Attr& attr, const TensorView& x, const TensorView& out);
void argmax_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);

// kernels_movement.cpp
void reshape_kernel(const TensorView& x, const TensorView& out);
void permute_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);
void slice_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);
void expand_kernel(const TensorView& x, const TensorView& out);
void pad_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);
void concat_kernel(const ir::Attr& attr, Inputs in, const TensorView& out);
void im2col_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);

// kernels_compute.cpp
void matmul_kernel(const ir::Attr& attr, const TensorView& a, const TensorView& b,
                   const TensorView& out);
void conv2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& w,
                   const TensorView& out);
void max_pool2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);
void avg_pool2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out);

// kernels_grad.cpp
enum class ConvPass;  // conv/conv_common.h
// A conv pass over channels-last activations (Conv2dAttr::channels_last; onednn.h's
// kChannelsLast): a, b, out in the roles of onednn::conv2d. The forward adds the float32
// `bias` per output channel and applies relu where asked, as oneDNN post-ops.
void conv2d_channels_last(ConvPass pass, const ir::Conv2dAttr& attr, const TensorView& a,
                          const TensorView& b, const TensorView& out,
                          const float* bias = nullptr, bool relu = false);
void conv2d_grad_input_kernel(const ir::Attr& attr, const TensorView& grad_out,
                              const TensorView& w, const TensorView& out);
void conv2d_grad_weight_kernel(const ir::Attr& attr, const TensorView& x,
                               const TensorView& grad_out, const TensorView& out);
void max_pool2d_grad_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& grad_out,
                            const TensorView& out);
void avg_pool2d_grad_kernel(const ir::Attr& attr, const TensorView& grad_out,
                            const TensorView& out);

// kernels_index.cpp
void gather_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& index,
                   const TensorView& out);
void index_select_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& index,
                         const TensorView& out);
void scatter_add_kernel(const ir::Attr& attr, const TensorView& self, const TensorView& index,
                        const TensorView& src, const TensorView& out);
void one_hot_kernel(const ir::Attr& attr, const TensorView& indices, const TensorView& out);

}  // namespace loom::runtime
